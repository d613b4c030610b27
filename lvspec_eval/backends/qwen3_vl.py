"""Qwen3-VL (dense, and MoE where the text model allows it): timestamps as text, DeepStack, positions.

What differs from Qwen2.5-VL (qwen2_5_vl.py), as transformers 5.24 does it:
- The processor replaces the prompt's one video pad with, per temporal patch,
  `<{t:.1f} seconds><|vision_start|>` + pads + `<|vision_end|>` (processing_qwen3_vl.py
  `replace_video_token`), t the mean time of the patch's two frames, from the frames' ORIGINAL
  indices in the file and its native fps (`_calculate_timestamps`). A request's video is
  (frames, fps) or (frames, fps, indices, native_fps); without indices the frames count as taken
  at `fps` from frame 0.
- Positions: `get_rope_index(input_ids, mm_token_type_ids, video_grid_thw)`, one group per temporal
  patch (time is in the text); generated tokens continue from the prompt's last position.
- DeepStack: the vision tower also returns one feature per `deepstack_visual_indexes` block; the
  text model adds the i-th to the visual rows right after decoder layer i (`_deepstack_process`).
  `text_inputs` hands them to exactly the prompt rows a forward holds: a split prefill's video part
  gets them, its text part none; a pruned prefill gets the kept rows' features only.
- Vision tower: patch 16, merge 2 (32 px per token side), mean/std 0.5. Under rule `fps` the pixel
  budget (the video processor's shortest/longest edge) is for the whole clip (qwen_vision.py).
"""
from __future__ import annotations

import numpy as np
import torch

from .base import PreparedInputs
from .qwen2_5_vl import QwenVLBackend
from .qwen_vision import preprocess_video

QWEN3_MEAN_STD = (0.5, 0.5, 0.5)
# lmms-eval 0.7.3 lmms_eval/models/simple/qwen3_vl.py: the system turn every request gets
LMMS_EVAL_SYSTEM_PROMPT = "You are a helpful assistant."
DEEPSTACK = "embeds_deepstack"  # inputs.extra key; "embeds*" keys are per model (base.adopt_inputs drops them)


def frame_timestamps(indices, native_fps: float, temporal_patch: int) -> list[float]:
    """transformers 5.24 Qwen3VLProcessor._calculate_timestamps: seconds of each temporal patch, the
    mean of its first and last frame's time; the last patch is filled with the last frame.
    Example: indices [0, 15, 30], 30 fps, patch 2 -> [0.25, 1.0]."""
    idx = [int(i) for i in indices]
    if len(idx) % temporal_patch:
        idx += [idx[-1]] * (temporal_patch - len(idx) % temporal_patch)
    secs = [i / native_fps for i in idx]
    return [(secs[i] + secs[i + temporal_patch - 1]) / 2 for i in range(0, len(secs), temporal_patch)]


def unpack_video(video) -> tuple[np.ndarray, float, np.ndarray, float]:
    """(frames, fps[, indices, native_fps]) -> all four; by default frames 0..T-1 at `fps`."""
    frames, fps = video[0], video[1]
    indices = video[2] if len(video) > 2 and video[2] is not None else np.arange(len(frames))
    native = video[3] if len(video) > 3 and video[3] is not None else fps
    if len(indices) != len(frames):
        raise ValueError(f"a video of {len(frames)} frames came with {len(indices)} frame indices")
    return frames, fps, np.asarray(indices), float(native)


class Qwen3VLBackend(QwenVLBackend):
    family = "qwen3_vl"
    default_mean_std = QWEN3_MEAN_STD
    clip_budget = True  # rule fps: the checkpoint's pixel limits are for the whole clip

    def __init__(self, model, tokenizer, device="cpu", preprocess=None):
        super().__init__(model, tokenizer, device, preprocess)
        self.vision_start, self.vision_end = "<|vision_start|>", "<|vision_end|>"  # the processor's markers
        self.system_prompt = LMMS_EVAL_SYSTEM_PROMPT if self.preprocess.video_rule == "lmms_eval" else None

    def _messages(self, prompt: str, with_video: bool) -> list[dict]:
        content = ([{"type": "video"}] if with_video else []) + [{"type": "text", "text": prompt}]
        system = ([{"role": "system", "content": [{"type": "text", "text": self.system_prompt}]}]
                  if self.system_prompt else [])
        return system + [{"role": "user", "content": content}]

    def prepare(self, prompt: str, videos: list) -> PreparedInputs:
        """videos: [(frames uint8 [T, H, W, 3], fps[, original frame indices, native fps])], at most one."""
        if len(videos) > 1:
            raise ValueError(f"one video per prompt is supported, got {len(videos)}")
        text = self.tokenizer.apply_chat_template(self._messages(prompt, bool(videos)), add_generation_prompt=True,
                                                  tokenize=False)
        kwargs: dict = {}
        if videos:
            frames, fps, indices, native = unpack_video(videos[0])
            pixels = preprocess_video(frames, fps, self.preprocess)
            text = self._expand_video(text, pixels.grid_thw[0].tolist(), indices, native)
            kwargs = {"pixel_values_videos": pixels.pixel_values.to(self.device, self.model.dtype),
                      "video_grid_thw": pixels.grid_thw.to(self.device)}
        input_ids = torch.tensor([self.tokenizer(text, add_special_tokens=False).input_ids], device=self.device)
        visual = input_ids[0] == self.video_token_id  # video pads only: timestamps and markers are text
        inputs = PreparedInputs(input_ids=input_ids, visual_mask=visual.cpu(), model_kwargs=kwargs)
        inputs.positions, inputs.extra["rope_delta"] = self._rope(inputs)
        return inputs

    def _expand_video(self, text: str, grid: list[int], indices, native_fps: float) -> str:
        """The processor's text: its one video pad replaced by every temporal patch's timestamp and pads."""
        pad = self.tokenizer.convert_ids_to_tokens(self.video_token_id)
        if text.count(pad) != 1:
            raise ValueError(f"expected one video placeholder in the prompt, found {text.count(pad)}")
        per_patch = grid[1] * grid[2] // self.preprocess.merge_size ** 2
        stamps = frame_timestamps(indices, native_fps, self.preprocess.temporal_patch_size)
        if len(stamps) != grid[0]:
            raise ValueError(f"{len(stamps)} timestamps for {grid[0]} temporal patches")
        block = "".join(f"<{t:.1f} seconds>{self.vision_start}{pad * per_patch}{self.vision_end}" for t in stamps)
        return text.replace(pad, block, 1)

    def _rope(self, inputs: PreparedInputs) -> tuple[torch.Tensor, int]:
        ids = inputs.input_ids
        if not inputs.model_kwargs:
            pos = torch.arange(ids.shape[1], device=self.device).view(1, 1, -1).expand(3, 1, -1)
            return pos, 0
        pos, _ = self.model.model.get_rope_index(ids, mm_token_type_ids=(ids == self.video_token_id).int() * 2,
                                                 video_grid_thw=inputs.model_kwargs["video_grid_thw"])
        return pos, int(pos[..., -1].max()) + 1 - ids.shape[1]

    def layout(self) -> tuple:
        p = self.preprocess
        return (self.family, p.patch_size, p.temporal_patch_size, p.merge_size, p.min_pixels, p.max_pixels,
                p.video_rule)

    # ---- vision features and DeepStack --------------------------------------------------------
    def vision_outputs(self, inputs: PreparedInputs) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """([num_visual, hidden] merged tokens, DeepStack features: one [num_visual, hidden] per stacked layer)."""
        kw = inputs.model_kwargs
        out = self.model.model.visual(kw["pixel_values_videos"], grid_thw=kw["video_grid_thw"])
        return out.pooler_output, list(out.deepstack_features)

    def visual_features(self, inputs: PreparedInputs) -> torch.Tensor:
        return self.vision_outputs(inputs)[0]

    def input_embeds(self, inputs: PreparedInputs) -> torch.Tensor:
        """Embeddings with the merged tokens scattered in; this model's DeepStack features go to
        inputs.extra[DEEPSTACK] (a draft of another size computes its own, never the target's)."""
        embeds = self.model.model.get_input_embeddings()(inputs.input_ids)
        inputs.extra[DEEPSTACK] = []
        if inputs.num_visual_tokens:
            feats, deepstack = self.vision_outputs(inputs)
            embeds = embeds.masked_scatter(inputs.visual_mask.to(embeds.device)[None, :, None],
                                           feats.to(embeds.device, embeds.dtype))
            inputs.extra[DEEPSTACK] = deepstack
        return embeds

    def text_inputs(self, inputs: PreparedInputs, rows: torch.Tensor) -> dict:
        """DeepStack for the prompt rows `rows` (indices into the full prompt) of one forward: the
        visual rows among them and their features, or nothing when they hold no video."""
        deepstack = inputs.extra.get(DEEPSTACK)
        if not deepstack:
            return {}
        vmask = inputs.visual_mask.to(rows.device)
        in_part = vmask[rows]
        if not bool(in_part.any()):
            return {}
        visual_index = torch.cumsum(vmask.long(), 0) - 1  # row -> index among the visual tokens
        picked = visual_index[rows[in_part]]
        return {"visual_pos_masks": in_part[None],
                "deepstack_visual_embeds": [f[picked.to(f.device)] for f in deepstack]}
