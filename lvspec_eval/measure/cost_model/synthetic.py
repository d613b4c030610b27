"""Real-size random-weight models through the project's own backends: each family's backend with
prompts of random text around n visual tokens and random visual features (the vision tower is not
run: its cost is the same with or without speculation). Everything after the inputs (prefill,
tree-masked forward, cache drop) is the backend's own code."""
from __future__ import annotations

import math
import types

import torch

from ...backends import linear_state
from ...backends.base import Backend, PreparedInputs
from ...backends.llava_onevision import LlavaOnevisionBackend
from ...backends.qwen2_5_vl import QwenVLBackend
from ...backends.qwen3_5 import Qwen3_5Backend
from ...backends.qwen3_vl import Qwen3VLBackend
from .architectures import model_class, model_config, special_ids, text_config
from .config import CostConfig

TOKENS_PER_FRAME_SIDE = 16  # Qwen: 16 x 16 merged tokens per temporal patch (448 px frames)
FEATURES = "synthetic_visual_features"  # PreparedInputs.extra key of the random visual features


class _Synthetic:
    """Backend mixin: prompts of random text around n visual tokens, random visual features.

    Everything after the inputs (prefill, tree-masked forward, cache drop) is the backend's own.
    """

    def synthetic_inputs(self, num_visual: int, prompt_tokens: int, seed: int) -> PreparedInputs:
        ids = special_ids(self.model.config.get_text_config().vocab_size)
        g = torch.Generator().manual_seed(seed)
        text = torch.randint(0, ids["vision_end"] - 1, (prompt_tokens,), generator=g).tolist()
        half = prompt_tokens // 2
        video = [ids["vision_start"]] + [ids["video"]] * num_visual + [ids["vision_end"]] if num_visual else []
        input_ids = torch.tensor([text[:half] + video + text[half:]], device=self.device)
        inputs = PreparedInputs(input_ids=input_ids, visual_mask=(input_ids[0] == ids["video"]).cpu(),
                                model_kwargs={})
        self.attach_positions(inputs, num_visual)
        inputs.extra[FEATURES] = self.random_features(num_visual, seed)
        return inputs

    def random_features(self, num_visual: int, seed: int) -> torch.Tensor:
        """[num_visual, hidden] random visual features, made on the device in the model's dtype.

        Made here, with the inputs, so no timed prefill pays for them (on one CPU thread drawing
        25,000 x 5,120 numbers took 1.55 s, more than the prefill they fed)."""
        hidden = self.model.config.get_text_config().hidden_size
        g = torch.Generator(device=self.device).manual_seed(seed)
        return torch.randn(num_visual, hidden, generator=g, device=self.device, dtype=self.model.dtype) * 0.02

    def attach_positions(self, inputs: PreparedInputs, num_visual: int) -> None:
        """Family-specific position inputs (none for LLaVA-OneVision: 1-D positions)."""

    def visual_features(self, inputs: PreparedInputs) -> torch.Tensor:
        """The features synthetic_inputs made (the vision tower is never run)."""
        return inputs.extra[FEATURES]


class SyntheticQwen(_Synthetic, QwenVLBackend):
    def attach_positions(self, inputs: PreparedInputs, num_visual: int) -> None:
        """A (t, 2s, 2s) patch grid with t * s * s == num_visual merged tokens, then M-RoPE."""
        if num_visual:
            side, frames = grid_for(num_visual)
            inputs.model_kwargs = {"video_grid_thw": torch.tensor([[frames, 2 * side, 2 * side]], device=self.device),
                                   "second_per_grid_ts": torch.tensor([1.0], device=self.device)}
        inputs.positions, inputs.extra["rope_delta"] = self._rope(inputs)


class SyntheticQwen3(_Synthetic, Qwen3VLBackend):
    """Qwen3-VL's decoder (QK norm, interleaved M-RoPE) on one block of visual tokens; no timestamps
    and no DeepStack rows (the tower is not run: adding its features costs next to nothing)."""

    def attach_positions(self, inputs: PreparedInputs, num_visual: int) -> None:
        if num_visual:  # one temporal patch, one merged row of num_visual tokens
            inputs.model_kwargs = {"video_grid_thw": torch.tensor([[1, 2, 2 * num_visual]], device=self.device)}
        inputs.positions, inputs.extra["rope_delta"] = self._rope(inputs)

    def vision_outputs(self, inputs: PreparedInputs):
        return self.visual_features(inputs), []


class SyntheticQwen3_5(SyntheticQwen3, Qwen3_5Backend):
    """Qwen3.5's hybrid decoder (Gated DeltaNet and gated full attention) on one block of visual tokens."""


class SyntheticLlava(_Synthetic, LlavaOnevisionBackend):
    pass


SYNTHETIC = {"qwen2_5_vl": SyntheticQwen, "qwen3_vl": SyntheticQwen3, "qwen3_5": SyntheticQwen3_5,
             "llava_onevision": SyntheticLlava}


def grid_for(num_visual: int) -> tuple[int, int]:
    """(tokens per side s, temporal patches t) of a Qwen video grid with t * s * s == num_visual.

    s is the largest side up to TOKENS_PER_FRAME_SIDE whose square divides num_visual, so the
    count is exact (25,000 gives s = 10, t = 250); a prime count gets s = 1.
    """
    for side in range(min(TOKENS_PER_FRAME_SIDE, math.isqrt(num_visual)), 0, -1):
        if num_visual % (side * side) == 0:
            return side, num_visual // (side * side)
    return 1, num_visual


def build_backend(arch: dict, cfg: CostConfig) -> Backend:
    """A random-weight model of `arch` on cfg.device in cfg.dtype, wrapped in its backend."""
    import transformers

    cls = getattr(transformers, model_class(arch))
    torch.manual_seed(cfg.seed)
    with torch.device(cfg.device):
        model = cls._from_config(model_config(arch), dtype=getattr(torch, cfg.dtype),
                                 attn_implementation=cfg.attn_implementation).eval()
    linear_state.install(model)  # Gated DeltaNet layers (Qwen3.5) follow draft trees, as load_backend sets up
    eos = text_config(arch)["eos_token_id"]
    model.generation_config.eos_token_id = eos
    tokenizer = types.SimpleNamespace(eos_token_id=eos)  # consulted for EOS only; nothing is decoded
    backend = SYNTHETIC[arch["family"]](model, tokenizer, cfg.device)
    backend.depth_factor = arch.get("real_layers", arch["layers"]) / arch["layers"]  # see timing.timed_call
    return backend
