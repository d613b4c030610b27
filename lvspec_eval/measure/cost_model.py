"""Cost model: predicted decode speedups of each drafter at real model sizes, no trained weights.

Why: the demo's models are too small for the long-video effects the papers report (DESIGN.md:
their decode cost barely depends on the number of visual tokens). What decides a drafter's speed
at scale is how its per-step cost grows with the video, and that depends only on architecture and
implementation, not on trained weights. So we time the real architectures (layer counts, widths,
heads, vocabularies of Qwen2.5-VL-7B/32B, Qwen3-VL-2B/4B/8B/32B, Qwen3.5-2B/4B/27B/35B-A3B and
LLaVA-OneVision-0.5B/7B) with random weights,
through this project's own backends and drafter (prefill, tree growth, tree-masked forward, cache
compaction), and combine the timings with acceptance lengths tau (measured by a benchmark run, or
assumed) into speedups:

    step           = t_draft_tree + t_verify + t_compact
    decode speedup = (tau + 1) * t_target_step / step
    e2e speedup    = (P + T * t_target_step) / (P + P_draft + T / (tau + 1) * step)

t_target_step: one vanilla decode step of the target (1 token, KV holding the whole video).
t_verify: one target forward over the root and a draft tree (`tree_nodes` nodes, tree mask).
t_compact: the target's commit after that forward: Backend.keep of the root and an accepted path
  of round(tau) nodes (not contiguous in the tree, so every cache layer is gathered and copied).
t_draft_tree: one whole proposal of the drafter (decoding/drafters/model.ModelDrafter.propose):
  feeding the round(tau) + 1 tokens committed since its last proposal, growing an EAGLE-2 dynamic
  tree (`depth` levels, `level_width` = top-k nodes expanded per level, `tree_nodes` kept) with
  one batched forward per level, and dropping the tree's cache entries; its KV holds
  full: all visual tokens (a Std-SD draft model on the whole video, as SD-Tree),
  pruned: 1 - prune_ratio of them (SpecVLM's pruned draft, ratio 0.9 by default),
  sparrow: none (Sparrow's head: modelled as a one-layer decoder at the target's width and
  vocabulary over the prompt's text only; its visual information arrives in hidden states).
P, P_draft: target and draft prefill (the draft's includes SpecVLM's token selection); T:
generated tokens (`new_tokens`).
Visual features are random (the vision encoder is not timed: its cost is the same with or
without speculation); they are made on the device, in the model's dtype, before any clock starts.
On a GPU, clocks are read after a synchronise (decoding/loop.make_clock).

Sizes: on a GPU the real sizes in bf16; on a CPU, `scale` (a width factor: attention heads,
hidden, MLP and vocabulary widths shrink together, head_dim kept) and `max_layers` (the layer
stack's time is scaled back up to the real depth) shrink the models until they fit; the shape of
the curves, not their values, is what transfers. At width
factor w a token's KV weighs 1/w times more against the weights than in the real model (KV per
token shrinks with w, weights with w^2), so a shrunk run's n visual tokens stand for about n / w
real ones (rows carry it as "equivalent_visual_tokens").

Qwen3.5 (hybrid): three of every four text layers are Gated DeltaNet layers, timed through the
engine's own linear-attention path (backends/linear_state.py): their cost per token does not grow
with the video (a recurrent state of value heads x 128 x 128 per layer, no KV), so only the
full-attention quarter of the stack reads a KV that grows with the visual tokens
(measure/cache_memory.py gives both sizes). A shrunk Qwen3.5 keeps that quarter: with fewer than 4
layers, the last one is full attention. Qwen3.5-MoE targets keep their expert count and top-k; the
experts' widths shrink with the rest.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import types
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from ..backends import linear_state
from ..backends.base import Backend, DecodeState, PreparedInputs, crop_cache
from ..backends.llava_onevision import LlavaOnevisionBackend
from ..backends.qwen2_5_vl import QwenVLBackend
from ..backends.qwen3_5 import Qwen3_5Backend
from ..backends.qwen3_vl import Qwen3VLBackend
from ..decoding import tree
from ..decoding.drafters.model import ModelDrafter
from ..decoding.loop import make_clock
from ..decoding.pruning import PruneConfig

# Qwen3.5's Gated DeltaNet layers: key heads x head dims, convolution, one full-attention layer in 4
QWEN3_5_LINEAR = dict(linear_k_heads=16, linear_k_dim=128, linear_v_dim=128, conv_kernel=4, full_every=4)
# Text decoders of the real checkpoints (their config.json text_config values).
ARCHITECTURES = {
    "qwen2.5-vl-7b": dict(family="qwen2_5_vl", hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128,
                          intermediate=18944, vocab=152064, tie=False),
    "qwen2.5-vl-32b": dict(family="qwen2_5_vl", hidden=5120, layers=64, heads=40, kv_heads=8, head_dim=128,
                           intermediate=27648, vocab=152064, tie=False),
    # Qwen3-VL's text models have the shapes of Qwen3-1.7B/4B/8B/32B (head_dim 128, 8 KV heads, vocabulary
    # 151,936; the two small ones tie their embeddings), as a public Megatron model-provider file lists them
    # (its 8B entry checked against Qwen/Qwen3-VL-8B-Instruct's config.json); not read from the hub here.
    "qwen3-vl-2b": dict(family="qwen3_vl", hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128,
                        intermediate=6144, vocab=151936, tie=True),
    "qwen3-vl-4b": dict(family="qwen3_vl", hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128,
                        intermediate=9728, vocab=151936, tie=True),
    "qwen3-vl-8b": dict(family="qwen3_vl", hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128,
                        intermediate=12288, vocab=151936, tie=False),
    "qwen3-vl-32b": dict(family="qwen3_vl", hidden=5120, layers=64, heads=64, kv_heads=8, head_dim=128,
                         intermediate=25600, vocab=151936, tie=False),
    "llava-ov-0.5b": dict(family="llava_onevision", hidden=896, layers=24, heads=14, kv_heads=2, head_dim=64,
                          intermediate=4864, vocab=151936, tie=True),
    "llava-ov-7b": dict(family="llava_onevision", hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128,
                        intermediate=18944, vocab=152128, tie=False),
    # Qwen3.5 (model_type qwen3_5 / qwen3_5_moe; vocabulary 248,320, head_dim 256, a full-attention layer every
    # 4th, Gated DeltaNet layers with 16 key heads of 128, conv kernel 4), from public copies of the
    # checkpoints' config.json (not read from the hub here):
    # 2B: the config.json of a Qwen3.5-2B fine-tune (lawrence3699/Jev-Style-Qwen3.5-2B-Decision-MLX-bf16):
    #   hidden 2048, 24 layers, 8 heads / 2 KV, MLP 6144, 16 value heads, tied embeddings.
    "qwen3.5-2b": dict(family="qwen3_5", hidden=2048, layers=24, heads=8, kv_heads=2, head_dim=256,
                       intermediate=6144, vocab=248320, tie=True, **QWEN3_5_LINEAR, linear_v_heads=16),
    # 4B: two public test configs pinned to Qwen3.5-4B: hidden 2560, 32 layers, 16 heads / 4 KV, MLP 9216,
    #   32 value heads, tied embeddings.
    "qwen3.5-4b": dict(family="qwen3_5", hidden=2560, layers=32, heads=16, kv_heads=4, head_dim=256,
                       intermediate=9216, vocab=248320, tie=True, **QWEN3_5_LINEAR, linear_v_heads=32),
    # 27B: THUDM/slime scripts/models/qwen3.5-27B.sh (hidden 5120, 64 layers, 24 heads / 4 query groups of
    #   256, MLP 17408, untied); its 48 value heads from a public Qwen3_5Config of that shape.
    "qwen3.5-27b": dict(family="qwen3_5", hidden=5120, layers=64, heads=24, kv_heads=4, head_dim=256,
                        intermediate=17408, vocab=248320, tie=False, **QWEN3_5_LINEAR, linear_v_heads=48),
    # 35B-A3B (MoE): THUDM/slime scripts/models/qwen3.5-35B-A3B.sh: hidden 2048, 40 layers, 16 heads / 2 query
    #   groups, 256 experts (8 a token) of 512 and a shared expert of 512, 32 value heads, untied.
    "qwen3.5-35b-a3b": dict(family="qwen3_5", hidden=2048, layers=40, heads=16, kv_heads=2, head_dim=256,
                            intermediate=512, vocab=248320, tie=False, **QWEN3_5_LINEAR, linear_v_heads=32,
                            experts=256, experts_per_token=8, shared_intermediate=512),
}
# target / draft pairs of the papers that fit one GPU (72B targets need several)
PAIRS = {
    "qwen2.5-vl-32b/7b": ("qwen2.5-vl-32b", "qwen2.5-vl-7b"),  # SpecVLM, LVSpec
    "llava-ov-7b/0.5b": ("llava-ov-7b", "llava-ov-0.5b"),  # Sparrow's target with a Std-SD draft
    "qwen3-vl-8b/2b": ("qwen3-vl-8b", "qwen3-vl-2b"),
    "qwen3-vl-32b/2b": ("qwen3-vl-32b", "qwen3-vl-2b"),
    "qwen3.5-27b/2b": ("qwen3.5-27b", "qwen3.5-2b"),
    "qwen3.5-35b-a3b/2b": ("qwen3.5-35b-a3b", "qwen3.5-2b"),  # an MoE target, a dense draft (one tokenizer)
}
MODEL_CLASSES = {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration", "qwen3_vl": "Qwen3VLForConditionalGeneration",
                 "qwen3_5": "Qwen3_5ForConditionalGeneration", "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
                 "llava_onevision": "LlavaOnevisionForConditionalGeneration"}
DRAFTERS = ("full", "pruned", "sparrow")
# Assumed when no measurement is given: Sparrow's published tau (3.8); the two model drafts a
# little lower, the pruned one below the full one (SpecVLM reports small losses from pruning).
DEFAULT_TAU = {"full": 3.0, "pruned": 2.8, "sparrow": 3.8}
SUMMARY_METHOD_OF = {"sd_tree": "full", "specvlm": "pruned", "sparrow": "sparrow"}
GPU_VISUAL_TOKENS = (256, 1024, 4096, 8192, 16384, 25000)
CPU_VISUAL_TOKENS = (256, 1024, 4096)
TOKENS_PER_FRAME_SIDE = 16  # Qwen: 16 x 16 merged tokens per temporal patch (448 px frames)
MIN_VOCAB = 64  # above the five special ids a synthetic prompt uses
DEFAULT_OUT = Path("results/cost_model")  # relative to the working directory
FEATURES = "synthetic_visual_features"  # PreparedInputs.extra key of the random visual features


@dataclass(frozen=True)
class Scale:
    width: float = 1.0  # multiplies attention heads (and with them hidden and MLP widths)
    max_layers: int | None = None
    vocab_size: int | None = None
    head_dim: int | None = None

    def __post_init__(self):
        if not 0 < self.width <= 1:
            raise ValueError(f"scale width={self.width}; expected 0 < width <= 1")
        for name in ("max_layers", "vocab_size", "head_dim"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value}; expected a positive integer")


@dataclass
class CostConfig:
    pairs: tuple[str, ...] = tuple(PAIRS)
    drafters: tuple[str, ...] = DRAFTERS
    visual_tokens: tuple[int, ...] = GPU_VISUAL_TOKENS
    scale: Scale = field(default_factory=Scale)
    taus: dict = field(default_factory=lambda: dict(DEFAULT_TAU))
    tau_source: str = "assumed"
    depth: int = 5  # draft tree levels
    level_width: int = 8  # nodes expanded per level: the dynamic tree's top-k (SpecVLM's widest level)
    tree_nodes: int = 25  # draft nodes verified per step (26 with the root)
    prune_ratio: float = 0.9
    new_tokens: int = 256  # generated tokens, for the end-to-end figure
    prompt_tokens: int = 64  # text tokens around the video
    repeats: int = 5
    device: str = "cpu"
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    seed: int = 0

    def __post_init__(self):
        for name, allowed in (("pairs", PAIRS), ("drafters", DRAFTERS)):
            bad = [v for v in getattr(self, name) if v not in allowed]
            if bad:
                raise ValueError(f"{name} {bad}; allowed: {', '.join(allowed)}")
        if not 0 <= self.prune_ratio < 1:
            raise ValueError(f"prune_ratio={self.prune_ratio}; expected 0 <= ratio < 1")
        for name in ("depth", "level_width", "tree_nodes", "new_tokens", "prompt_tokens", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}; expected a positive integer")
        if any(n < 1 for n in self.visual_tokens):
            raise ValueError(f"visual_tokens {self.visual_tokens}; expected positive counts")


# ---- architectures at a scale --------------------------------------------------------------------

def shrink(arch: dict, scale: Scale, layers: int | None = None) -> dict:
    """The architecture at `scale`: heads (a multiple of the KV heads) and widths shrink together.

    A capped depth is not a smaller model: the timings scale the decoder layers' share back up to
    the real depth (`real_layers`, see timed_call). The vocabulary shrinks with the width, unless
    `vocab_size` is given, so the output layer (~ width x vocab) keeps its real share against the
    layers (~ width^2).
    """
    head_dim = scale.head_dim or arch["head_dim"]
    kv = max(1, round(arch["kv_heads"] * scale.width))
    heads = max(kv, round(arch["heads"] * scale.width / kv) * kv)
    # the width follows the heads (Qwen3/Qwen3.5 widths are not heads x head_dim: Qwen3.5-27B has 24 x 256
    # for 5,120, Qwen3-VL-32B 64 x 128 for 5,120)
    hidden = round(arch["hidden"] * heads / arch["heads"] * head_dim / arch["head_dim"])
    real_layers = layers or arch["layers"]
    depth = min(real_layers, scale.max_layers) if scale.max_layers else real_layers
    inter = max(8, round(arch["intermediate"] * hidden / arch["hidden"]))
    vocab = scale.vocab_size or max(MIN_VOCAB, round(arch["vocab"] * hidden / arch["hidden"]))
    out = {**arch, "hidden": hidden, "heads": heads, "kv_heads": kv, "head_dim": head_dim, "layers": depth,
           "real_layers": real_layers, "intermediate": inter, "vocab": min(vocab, arch["vocab"])}
    if "linear_k_heads" in arch:  # Gated DeltaNet heads shrink like the attention heads (value heads: a multiple)
        k = max(1, round(arch["linear_k_heads"] * scale.width))
        out.update(linear_k_heads=k, linear_v_heads=k * (arch["linear_v_heads"] // arch["linear_k_heads"]))
    if "shared_intermediate" in arch:
        out["shared_intermediate"] = max(8, round(arch["shared_intermediate"] * hidden / arch["hidden"]))
    return out


def text_config(arch: dict) -> dict:
    """transformers text_config keys; Qwen's M-RoPE splits head_dim / 2 as 16/24/24 of 64 does."""
    hd = arch["head_dim"]
    rope = {"rope_type": "default", "rope_theta": 1_000_000.0}
    if arch["family"] in ("qwen2_5_vl", "qwen3_vl"):
        rope["mrope_section"] = [hd // 8, 3 * hd // 16, 3 * hd // 16]
    if arch["family"] in ("qwen3_vl", "qwen3_5"):
        rope["mrope_interleaved"] = True
    eos = arch["vocab"] - 5
    out = dict(model_type="qwen2", vocab_size=arch["vocab"], hidden_size=arch["hidden"],
               num_hidden_layers=arch["layers"], num_attention_heads=arch["heads"],
               num_key_value_heads=arch["kv_heads"], head_dim=hd, intermediate_size=arch["intermediate"],
               max_position_embeddings=131072, rope_parameters=rope, tie_word_embeddings=arch["tie"],
               bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    if arch["family"] == "qwen3_5":
        out.update(qwen3_5_text(arch))
    return out


def qwen3_5_text(arch: dict) -> dict:
    """Qwen3.5's own text_config keys: the layer pattern, the Gated DeltaNet sizes, a quarter of each head
    rotated (M-RoPE 11/11/10 of 32 at head_dim 256), and the MoE sizes where the model has experts."""
    every, depth = arch["full_every"], arch["layers"]
    kinds = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(depth)]
    if "full_attention" not in kinds:  # a stack capped below `every` layers keeps one full-attention layer
        kinds[-1] = "full_attention"
    half = int(arch["head_dim"] * 0.25) // 2
    side = round(half * 11 / 32)
    rope = {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
            "mrope_interleaved": True, "mrope_section": [side, side, half - 2 * side]}
    out = dict(layer_types=kinds, linear_num_key_heads=arch["linear_k_heads"],
               linear_num_value_heads=arch["linear_v_heads"], linear_key_head_dim=arch["linear_k_dim"],
               linear_value_head_dim=arch["linear_v_dim"], linear_conv_kernel_dim=arch["conv_kernel"],
               rope_parameters=rope)
    if "experts" in arch:
        out.update(num_experts=arch["experts"], num_experts_per_tok=arch["experts_per_token"],
                   moe_intermediate_size=arch["intermediate"],
                   shared_expert_intermediate_size=arch["shared_intermediate"])
    return out


def model_class(arch: dict) -> str:
    """The transformers class of an architecture (Qwen3.5 with experts: the MoE class)."""
    return MODEL_CLASSES["qwen3_5_moe" if arch["family"] == "qwen3_5" and "experts" in arch else arch["family"]]


def special_ids(vocab: int) -> dict:
    """Token ids of the visual markers, placed at the top of the (possibly shrunk) vocabulary."""
    return {"video": vocab - 1, "image": vocab - 2, "vision_start": vocab - 3, "vision_end": vocab - 4}


def model_config(arch: dict):
    """A full VLM config with a one-layer stand-in vision tower (never run: features are random)."""
    from transformers import (
        LlavaOnevisionConfig,
        Qwen2_5_VLConfig,
        Qwen3_5Config,
        Qwen3_5MoeConfig,
        Qwen3VLConfig,
    )

    text, ids = text_config(arch), special_ids(arch["vocab"])
    if arch["family"] == "qwen3_5":  # Qwen3-VL's tower without DeepStack
        text.pop("model_type")
        if "experts" in arch:
            text.pop("intermediate_size")
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=arch["hidden"],
                      patch_size=16, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)
        config_cls = Qwen3_5MoeConfig if "experts" in arch else Qwen3_5Config
        return config_cls(text_config=text, vision_config=vision, video_token_id=ids["video"],
                          image_token_id=ids["image"], vision_start_token_id=ids["vision_start"],
                          vision_end_token_id=ids["vision_end"], tie_word_embeddings=arch["tie"])
    if arch["family"] == "qwen3_vl":
        text.pop("model_type")
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=arch["hidden"],
                      patch_size=16, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                      deepstack_visual_indexes=[])
        return Qwen3VLConfig(text_config=text, vision_config=vision, video_token_id=ids["video"],
                             image_token_id=ids["image"], vision_start_token_id=ids["vision_start"],
                             vision_end_token_id=ids["vision_end"], tie_word_embeddings=arch["tie"])
    if arch["family"] == "qwen2_5_vl":
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=arch["hidden"],
                      patch_size=14, temporal_patch_size=2, spatial_merge_size=2, window_size=112,
                      fullatt_block_indexes=[0], tokens_per_second=2)
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, video_token_id=ids["video"],
                                image_token_id=ids["image"], vision_start_token_id=ids["vision_start"],
                                vision_end_token_id=ids["vision_end"], tie_word_embeddings=arch["tie"])
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)
    return LlavaOnevisionConfig(text_config=text, vision_config=vision, video_token_id=ids["video"],
                                image_token_id=ids["image"], tie_word_embeddings=arch["tie"])


# ---- synthetic prompts through the project's backends --------------------------------------------

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
    backend.depth_factor = arch.get("real_layers", arch["layers"]) / arch["layers"]  # see timed_call
    return backend


# ---- timing ---------------------------------------------------------------------------------------

@contextlib.contextmanager
def layer_stack_spans(backend: Backend, clock) -> Iterator[list[list[float]]]:
    """Record [start, end] of every pass through the decoder layers (first layer in, last out)."""
    layers = backend.text_model().layers
    spans: list[list[float]] = []

    def enter(_module, _args):
        spans.append([clock(), clock()])

    def leave(_module, _args, _out):
        spans[-1][1] = clock()

    handles = [layers[0].register_forward_pre_hook(enter), layers[-1].register_forward_hook(leave)]
    try:
        yield spans
    finally:
        for handle in handles:
            handle.remove()


def timed_call(fn, backend: Backend, clock) -> float:
    """Seconds of one fn() call, its decoder-layer part scaled to the model's real depth.

    Decoder layers are identical, so a model built with d of its L layers costs what the real one
    does once the time spent in the layer stack is multiplied by L / d (KV reads included).
    """
    factor = backend.depth_factor
    if factor == 1:
        t0 = clock()
        fn()
        return clock() - t0
    with layer_stack_spans(backend, clock) as spans:
        t0 = clock()
        fn()
        total = clock() - t0
    return total + sum(end - start for start, end in spans) * (factor - 1)


def best_seconds(fn, backend: Backend, repeats: int, clock, warmup: int = 1,
                 reset: Callable[[], None] | None = None) -> float:
    """The fastest of `repeats` timed calls of fn() after `warmup` untimed ones; `reset` (untimed)
    runs after every call.

    The minimum, not the median: a forward's cost is fixed and other processes on a shared
    machine only ever add to it, so the fastest repeat is the best estimate of the cost itself
    (the models here are timed one after another, so drift cannot cancel out in a ratio).
    """
    times = []
    for k in range(warmup + repeats):
        seconds = timed_call(fn, backend, clock)
        if k >= warmup:
            times.append(seconds)
        if reset is not None:
            reset()
    return min(times)


def rewinder(state: DecodeState) -> Callable[[], None]:
    """A function that puts `state` back to what its cache holds now, so that every repeat of a
    timed call that commits entries (Backend.keep) starts from the same cache."""
    cache_len, next_pos, pending = state.cache_len, state.next_pos, list(state.pending)

    def rewind() -> None:
        crop_cache(state.cache, cache_len)
        state.cache_len, state.next_pos, state.pending, state.temp_len = cache_len, next_pos, list(pending), 0

    return rewind


def timed_prefill(backend: Backend, inputs: PreparedInputs, clock):
    """(seconds, state) of one prefill (a warm-up prefill ran first on a short prompt)."""
    out = {}

    def run():
        out["state"] = backend.prefill(inputs)[0]

    return timed_call(run, backend, clock), out["state"]


def random_tokens(backend: Backend, n: int, seed: int) -> torch.Tensor:
    """[n] random text token ids (below the visual markers)."""
    top = special_ids(backend.model.config.get_text_config().vocab_size)["vision_end"] - 1
    return torch.randint(0, top, (n,), generator=torch.Generator().manual_seed(seed))


def forward_seconds(backend: Backend, state, offsets: torch.Tensor, visible: torch.Tensor, cfg: CostConfig,
                    clock) -> float:
    """Time of one tree-masked forward of len(offsets) tokens; the cache is left as it was."""
    tokens = random_tokens(backend, offsets.numel(), cfg.seed)

    def step():
        backend.forward(state, tokens, offsets, visible)
        backend.keep(state, [])  # drop the temporary entries: every repeat sees the same cache

    return best_seconds(step, backend, cfg.repeats, clock)


def verify_paths(num_nodes: int) -> list[tuple[int, ...]]:
    """The verified tree's nodes as rank paths, parents first (SpecVLM's shape, cut or grown)."""
    paths = sorted(tree.SPECVLM_26, key=lambda p: (len(p), p))[:num_nodes]
    while len(paths) < num_nodes:  # deeper along rank 0 when more nodes are asked for
        paths.append(paths[-1] + (0,))
    return paths


def verify_layout(num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets and visibility of the root plus a tree of num_nodes."""
    paths = verify_paths(num_nodes)
    index = {p: i for i, p in enumerate(paths)}
    parents = torch.tensor([index.get(p[:-1], -1) for p in paths], dtype=torch.long)
    return tree.pending_and_tree_layout(1, parents)


def accepted_length(tau: float) -> int:
    """Draft tokens accepted in a typical step."""
    return max(0, round(tau))


def commit_indices(num_nodes: int, num_accepted: int) -> list[int]:
    """Temporary cache indices a commit keeps after verify_layout's forward: the root (0) and the
    rank-0 path of num_accepted nodes (node i sits at 1 + i; the path is not contiguous, so the
    commit gathers and copies, as after a real step)."""
    index = {p: i for i, p in enumerate(verify_paths(num_nodes))}
    path = [index[(0,) * d] for d in range(1, num_accepted + 1) if (0,) * d in index]
    return [0] + [1 + i for i in path]


def draft_tree_config(cfg: CostConfig) -> tree.TreeConfig:
    """The tree the model drafter grows: EAGLE-2 dynamic, level_width nodes fed per level."""
    return tree.TreeConfig(kind="dynamic", depth=cfg.depth, topk=cfg.level_width, total=cfg.tree_nodes)


def level_layout(width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft tree level: `width` sibling nodes, each seeing the committed cache and itself."""
    return torch.zeros(width, dtype=torch.long), torch.eye(width, dtype=torch.bool)


# ---- measurements ---------------------------------------------------------------------------------

def compaction_seconds(backend: Backend, state: DecodeState, num_accepted: int, cfg: CostConfig, clock) -> float:
    """Time of the target's commit (Backend.keep) after a tree verification accepting num_accepted
    nodes. keep runs outside the decoder layers, so timed_call cannot scale it; it loops over the
    cache layers, so its time is multiplied by the depth factor here."""
    offsets, visible = verify_layout(cfg.tree_nodes)
    tokens, keep = random_tokens(backend, offsets.numel(), cfg.seed), commit_indices(cfg.tree_nodes, num_accepted)
    rewind, times = rewinder(state), []
    for _ in range(cfg.repeats + 1):  # the first is a warm-up
        backend.forward(state, tokens, offsets, visible)
        t0 = clock()
        backend.keep(state, keep)
        times.append(clock() - t0)
        rewind()
    return min(times[1:]) * backend.depth_factor


def accepted_lengths(cfg: CostConfig) -> list[int]:
    return sorted({accepted_length(cfg.taus[d]) for d in cfg.drafters})


def measure_target(backend: Backend, num_visual: int, cfg: CostConfig, clock) -> dict:
    """Prefill, one vanilla step, one tree verification and its commit (per accepted length)
    with num_visual tokens in the KV."""
    inputs = backend.synthetic_inputs(num_visual, cfg.prompt_tokens, cfg.seed)
    prefill_s, state = timed_prefill(backend, inputs, clock)
    step_s = forward_seconds(backend, state, *level_layout(1), cfg, clock)
    verify_s = forward_seconds(backend, state, *verify_layout(cfg.tree_nodes), cfg, clock)
    compact_s = {k: compaction_seconds(backend, state, k, cfg, clock) for k in accepted_lengths(cfg)}
    return {"visual_tokens": inputs.num_visual_tokens, "prefill_s": prefill_s, "step_s": step_s,
            "verify_s": verify_s, "compact_s": compact_s}


def attention_scores(num_visual: int, seed: int = 0) -> torch.Tensor:
    """Random stand-ins for the attention each visual token received in the target's prefill:
    how many tokens the pruning keeps is what costs; which ones does not."""
    return torch.rand(num_visual, generator=torch.Generator().manual_seed(seed))


def measure_drafter(backend: Backend, drafter: str, num_visual: int, cfg: CostConfig, clock) -> dict:
    """Draft prefill (with SpecVLM's token selection for the pruned draft) and one whole proposal,
    through the project's ModelDrafter, with the drafter's share of the visual KV."""
    n = 0 if drafter == "sparrow" else num_visual  # Sparrow's head sees the prompt's text only
    inputs = backend.synthetic_inputs(n, cfg.prompt_tokens, cfg.seed)
    prune = PruneConfig(ratio=cfg.prune_ratio) if drafter == "pruned" and n else None
    model_drafter = ModelDrafter(draft_tree_config(cfg), prune=prune)  # drafts with `backend`, passed as target
    # what start() reads of the target's prefill: the attention each visual token received
    target_view = types.SimpleNamespace(extra={"visual_attention": attention_scores(n, cfg.seed)})
    info = {}

    def start():
        info.update(model_drafter.start(backend, inputs, target_view, clock))

    prefill_s = timed_call(start, backend, clock)
    per_step = accepted_length(cfg.taus[drafter]) + 1  # tokens committed since the last proposal
    pool = random_tokens(backend, per_step * (cfg.repeats + 1), cfg.seed).tolist()
    committed: list[int] = []

    def propose():
        committed.extend(pool[len(committed):len(committed) + per_step])
        model_drafter.propose(committed)

    tree_s = best_seconds(propose, backend, cfg.repeats, clock)
    return {"prefill_s": prefill_s, "tree_s": tree_s, "kept_visual_tokens": info["kept_visual_tokens"]}


def predict(target: dict, draft: dict, tau: float, cfg: CostConfig) -> dict:
    """Speedups from the timings (formulas in the module docstring)."""
    step = draft["tree_s"] + target["verify_s"] + target["compact_s"][accepted_length(tau)]
    vanilla_e2e = target["prefill_s"] + cfg.new_tokens * target["step_s"]
    method_e2e = target["prefill_s"] + draft["prefill_s"] + cfg.new_tokens / (tau + 1) * step
    return {"decode_speedup": (tau + 1) * target["step_s"] / step, "e2e_speedup": vanilla_e2e / method_e2e,
            "draft_share": draft["tree_s"] / step}


def _release(backend: Backend | None) -> None:
    """Free a model before the next one is built (the GPU holds one model at a time)."""
    if backend is not None:
        del backend.model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _warm_up(backend: Backend, cfg: CostConfig) -> None:
    """One short prefill, so kernel selection and allocation are not timed."""
    backend.prefill(backend.synthetic_inputs(min(cfg.visual_tokens), cfg.prompt_tokens, cfg.seed))


def measure_model(arch: dict, jobs: list[tuple[str, int]], cfg: CostConfig, clock, log) -> dict:
    """Build one model and run `jobs` (role, visual tokens) on it; role "target" or a drafter."""
    backend = build_backend(arch, cfg)
    try:
        _warm_up(backend, cfg)
        out = {}
        for role, n in jobs:
            log(f"  {role:8s} {n:>6d} visual tokens")
            out[role, n] = (measure_target(backend, n, cfg, clock) if role == "target"
                            else measure_drafter(backend, role, n, cfg, clock))
        return out
    finally:
        _release(backend)


def measure_pair(pair: str, cfg: CostConfig, clock, log) -> list[dict]:
    """Rows (one per drafter and visual-token count) for one target/draft pair."""
    target_name, draft_name = PAIRS[pair]
    log(f"{pair}: target {target_name}, draft {draft_name}, scale {cfg.scale}")
    ns = list(cfg.visual_tokens)
    costs = measure_model(shrink(ARCHITECTURES[target_name], cfg.scale), [("target", n) for n in ns], cfg, clock, log)
    model_drafters = [d for d in cfg.drafters if d != "sparrow"]
    if model_drafters:
        jobs = [(d, n) for n in ns for d in model_drafters]
        costs.update(measure_model(shrink(ARCHITECTURES[draft_name], cfg.scale), jobs, cfg, clock, log))
    if "sparrow" in cfg.drafters:  # its KV holds no visual token: one measurement serves every n
        head = shrink(ARCHITECTURES[target_name], cfg.scale, layers=1)
        sparrow = measure_model(head, [("sparrow", ns[0])], cfg, clock, log)[("sparrow", ns[0])]
        costs.update({("sparrow", n): sparrow for n in ns})
    return [_row(pair, d, n, costs, cfg) for d in cfg.drafters for n in ns]


def _row(pair: str, drafter: str, n: int, costs: dict, cfg: CostConfig) -> dict:
    target, draft, tau = costs["target", n], costs[drafter, n], cfg.taus[drafter]
    return {"pair": pair, "drafter": drafter, "visual_tokens": target["visual_tokens"],
            "equivalent_visual_tokens": round(target["visual_tokens"] / cfg.scale.width),
            "draft_visual_tokens": draft["kept_visual_tokens"], "tau": tau,
            "target_prefill_s": target["prefill_s"], "draft_prefill_s": draft["prefill_s"],
            "target_step_ms": 1e3 * target["step_s"], "verify_ms": 1e3 * target["verify_s"],
            "compact_ms": 1e3 * target["compact_s"][accepted_length(tau)], "draft_tree_ms": 1e3 * draft["tree_s"],
            **predict(target, draft, tau, cfg)}


def run_cost_model(cfg: CostConfig, log=print) -> dict:
    """All pairs' rows plus what produced them (JSON-ready)."""
    clock = make_clock(torch.device(cfg.device))
    rows = [row for pair in cfg.pairs for row in measure_pair(pair, cfg, clock, log)]
    settings = asdict(cfg)
    return {"version": 1, "device": describe_device(cfg.device), "settings": settings, "rows": rows,
            "formula": "decode_speedup = (tau + 1) * target_step / (draft_tree + verify + compact)"}


def describe_device(device: str) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({torch.get_num_threads()} threads)"


# ---- outputs --------------------------------------------------------------------------------------

TABLE_COLUMNS = (("pair", "pair", "{}"), ("drafter", "drafter", "{}"), ("visual_tokens", "visual tokens", "{:d}"),
                 ("draft_visual_tokens", "in draft KV", "{:d}"), ("tau", "tau", "{:.2f}"),
                 ("target_step_ms", "target step ms", "{:.2f}"), ("verify_ms", "verify ms", "{:.2f}"),
                 ("compact_ms", "compact ms", "{:.2f}"), ("draft_tree_ms", "draft tree ms", "{:.2f}"),
                 ("decode_speedup", "decode speedup", "{:.2f}x"),
                 ("e2e_speedup", "e2e speedup", "{:.2f}x"))


def markdown_table(result: dict) -> str:
    header = "| " + " | ".join(title for _, title, _ in TABLE_COLUMNS) + " |"
    rule = "|" + "---|" * len(TABLE_COLUMNS)
    lines = [header, rule]
    for row in result["rows"]:
        lines.append("| " + " | ".join(fmt.format(row[key]) for key, _, fmt in TABLE_COLUMNS) + " |")
    s = result["settings"]
    note = (f"\n{result['device']}, {s['dtype']}, scale {s['scale']}, tau {s['tau_source']}; depth {s['depth']}, "
            f"level width {s['level_width']}, {s['tree_nodes']} verified nodes, prune ratio {s['prune_ratio']}, "
            f"e2e over {s['new_tokens']} new tokens. {result['formula']}.\n")
    return "\n".join(lines) + "\n" + note


def plot(result: dict, path: Path) -> None:
    """Decode speedup (solid) and e2e speedup (dashed) against visual tokens, one panel per pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = list(dict.fromkeys(r["pair"] for r in result["rows"]))
    fig, axes = plt.subplots(1, len(pairs), figsize=(5.5 * len(pairs), 4), squeeze=False)
    for ax, pair in zip(axes[0], pairs):
        for drafter in dict.fromkeys(r["drafter"] for r in result["rows"]):
            rows = [r for r in result["rows"] if r["pair"] == pair and r["drafter"] == drafter]
            xs = [r["visual_tokens"] for r in rows]
            line = ax.plot(xs, [r["decode_speedup"] for r in rows], marker="o", label=f"{drafter} (decode)")[0]
            ax.plot(xs, [r["e2e_speedup"] for r in rows], ls="--", color=line.get_color(), label=f"{drafter} (e2e)")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xscale="log", xlabel="visual tokens", ylabel="predicted speedup", title=pair)
        ticks = sorted({r["visual_tokens"] for r in result["rows"] if r["pair"] == pair})
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks], fontsize=7)
        ax.minorticks_off()
        ax.legend(fontsize=7)
    fig.suptitle(f"cost model on {result['device']} ({result['settings']['dtype']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def output_paths(json_path: Path, plots: bool = True) -> dict[str, Path]:
    """The JSON file and, beside it with the same stem, the table (.md) and the plot (.png)."""
    kinds = ("json", "md", "png") if plots else ("json", "md")
    return {kind: json_path.with_suffix(f".{kind}") if kind != "json" else json_path for kind in kinds}


def write_outputs(result: dict, out_dir: Path, plots: bool = True) -> dict[str, Path]:
    """cost_model.json, cost_model.md and (with plots) cost_model.png under out_dir."""
    return write_files(result, output_paths(Path(out_dir) / "cost_model.json", plots))


def write_files(result: dict, paths: dict[str, Path]) -> dict[str, Path]:
    paths["json"].parent.mkdir(parents=True, exist_ok=True)
    paths["json"].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    paths["md"].write_text(markdown_table(result), encoding="utf-8")
    if "png" in paths:
        plot(result, paths["png"])
    return paths


# ---- command line ---------------------------------------------------------------------------------

def _csv(kind):
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {kind.__name__}") from None
    return parse


def parse_taus(text: str) -> dict:
    """"full=3.1,sparrow=3.8" -> {"full": 3.1, "sparrow": 3.8} (unnamed drafters keep the default)."""
    taus = dict(DEFAULT_TAU)
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, value = item.partition("=")
        if name not in DRAFTERS:
            raise ValueError(f"--tau {item!r}: drafter {name!r}; allowed: {', '.join(DRAFTERS)}")
        taus[name] = float(value)
    return taus


def taus_from_summary(path: Path) -> dict:
    """Measured tau per drafter from a report's summary.json (sd_tree, specvlm, sparrow rows;
    the mean over tasks). Drafters without a row keep the assumed value."""
    rows = json.loads(Path(path).read_text(encoding="utf-8"))["rows"]
    taus = dict(DEFAULT_TAU)
    for method, drafter in SUMMARY_METHOD_OF.items():
        values = [r["tau"] for r in rows if r.get("method") == method and isinstance(r.get("tau"), (int, float))]
        if values:
            taus[drafter] = sum(values) / len(values)
    return taus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cost model's options (none clashes with `bench`'s own; device/dtype/out carry a cost- prefix)."""
    g = parser.add_argument_group("cost model (bench --cost-model)")
    g.add_argument("--pairs", type=_csv(str), default=tuple(PAIRS), help=f"target/draft pairs: {', '.join(PAIRS)}")
    g.add_argument("--drafters", type=_csv(str), default=DRAFTERS, help=f"drafters: {', '.join(DRAFTERS)}")
    g.add_argument("--visual-tokens", type=_csv(int), default=None,
                   help=f"counts to time (default GPU {GPU_VISUAL_TOKENS}, CPU {CPU_VISUAL_TOKENS})")
    g.add_argument("--scale", type=float, default=None, help="width factor (default 1 on GPU, 1/8 on CPU)")
    g.add_argument("--max-layers", type=int, default=None, help="cap on layers (default none on GPU, 2 on CPU)")
    g.add_argument("--vocab-size", type=int, default=None, help="shrink the vocabulary (default: the real one)")
    g.add_argument("--head-dim", type=int, default=None, help="override head_dim (default: the real one)")
    g.add_argument("--tau", default="", help="acceptance lengths, e.g. full=3.1,pruned=2.9,sparrow=3.8")
    g.add_argument("--tau-from", type=Path, default=None, help="take tau from a report's summary.json")
    g.add_argument("--tree-depth", type=int, default=5, help="levels of the draft tree")
    g.add_argument("--level-width", type=int, default=8, help="nodes expanded per level (the dynamic tree's top-k)")
    g.add_argument("--tree-nodes", type=int, default=25, help="draft nodes verified per step")
    g.add_argument("--prune-ratio", type=float, default=0.9, help="share of visual tokens the pruned draft drops")
    g.add_argument("--new-tokens", type=int, default=256, help="generated tokens for the e2e speedup")
    g.add_argument("--prompt-tokens", type=int, default=64, help="text tokens around the video")
    g.add_argument("--timing-repeats", type=int, default=5, help="timed repeats per forward (the fastest counts)")
    g.add_argument("--cost-device", default=None, help="default: cuda if available, else cpu")
    g.add_argument("--cost-dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="default: bfloat16 on GPU, float32 on CPU")
    g.add_argument("--cost-attn", default="sdpa", choices=("sdpa", "eager", "flash_attention_2"))
    g.add_argument("--cost-out", type=Path, default=None,
                   help=f"output folder (default {DEFAULT_OUT}; --out FILE.json names the JSON file instead)")
    g.add_argument("--no-cost-plot", action="store_true", help="skip the PNG")


def config_from_args(args: argparse.Namespace) -> CostConfig:
    device = args.cost_device or ("cuda" if torch.cuda.is_available() else "cpu")
    cpu = torch.device(device).type == "cpu"
    scale = Scale(width=args.scale if args.scale is not None else (0.125 if cpu else 1.0),
                  max_layers=args.max_layers if args.max_layers is not None else (2 if cpu else None),
                  vocab_size=args.vocab_size, head_dim=args.head_dim)
    taus, source = parse_taus(args.tau), ("given" if args.tau else "assumed")
    if args.tau_from:
        taus, source = {**taus_from_summary(args.tau_from), **(parse_taus(args.tau) if args.tau else {})}, \
            f"measured ({args.tau_from})"
    return CostConfig(pairs=tuple(args.pairs), drafters=tuple(args.drafters),
                      visual_tokens=tuple(args.visual_tokens or (CPU_VISUAL_TOKENS if cpu else GPU_VISUAL_TOKENS)),
                      scale=scale, taus=taus, tau_source=source, depth=args.tree_depth,
                      level_width=args.level_width, tree_nodes=args.tree_nodes, prune_ratio=args.prune_ratio,
                      new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens, repeats=args.timing_repeats,
                      device=device, dtype=args.cost_dtype or ("float32" if cpu else "bfloat16"),
                      attn_implementation=args.cost_attn)


def destination(args: argparse.Namespace) -> dict[str, Path]:
    """Where the outputs go: `--out FILE.json` (bench's own option: the JSON there, the .md and .png
    beside it), else `--cost-out DIR` (cost_model.json, .md, .png in it), else DEFAULT_OUT."""
    plots = not args.no_cost_plot
    out = getattr(args, "out", None)
    if out is None:
        return output_paths((args.cost_out or DEFAULT_OUT) / "cost_model.json", plots)
    if args.cost_out is not None:
        raise ValueError(f"--out {out} and --cost-out {args.cost_out}: give one (--out FILE.json or --cost-out DIR)")
    if Path(out).is_dir():
        raise ValueError(f"--out {out} is a folder; with --cost-model it names the JSON file (FILE.json, with "
                         "FILE.md and FILE.png beside it); for a folder use --cost-out DIR")
    return output_paths(Path(out), plots)


def run(args: argparse.Namespace) -> dict:
    """Entry point for `lvspec-eval bench --cost-model` (and `python -m lvspec_eval.measure.cost_model`).

    Returns the result, as bench.run does (bench writes it to --out again, unchanged)."""
    paths = destination(args)  # checked before minutes of timing, not after
    result = run_cost_model(config_from_args(args))
    write_files(result, paths)
    print(markdown_table(result))
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lvspec_eval.measure.cost_model", description=__doc__.split("\n")[0])
    add_arguments(parser)
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (.md and .png beside it)")
    run(parser.parse_args(argv))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
