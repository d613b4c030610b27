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
from .chat_template import render_chat
from .qwen2_5_vl import QwenVLBackend
from .qwen_vision import preprocess_video

QWEN3_MEAN_STD = (0.5, 0.5, 0.5)
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
    layout_name = "qwen3_vl"  # dense and MoE share it: a 2B draft serves a 30B-A3B target
    default_mean_std = QWEN3_MEAN_STD
    clip_budget = True  # rule fps: the checkpoint's pixel limits are for the whole clip

    def __init__(self, model, tokenizer, device="cpu", preprocess=None):
        super().__init__(model, tokenizer, device, preprocess)
        self.vision_start, self.vision_end = "<|vision_start|>", "<|vision_end|>"  # the processor's markers

    @property
    def family(self) -> str:
        """lmms-eval's qwen3_vl classes serve dense and MoE checkpoints alike (models/parity.py)."""
        return "qwen3_vl"

    def prepare(self, prompt: str | list[dict], videos: list) -> PreparedInputs:
        """prompt: the user's text, or chat messages (chat_template.chat_messages; lmms-eval's system
        turn is the models layer's to add); videos: [(frames uint8 [T, H, W, 3], fps[, original frame
        indices, native fps])], at most one."""
        if len(videos) > 1:
            raise ValueError(f"one video per prompt is supported, got {len(videos)}")
        ids = render_chat(self.tokenizer, prompt, len(videos))
        kwargs: dict = {}
        if videos:
            frames, fps, indices, native = unpack_video(videos[0])
            pixels = preprocess_video(frames, fps, self.preprocess)
            ids = self._expand_video(ids, pixels.grid_thw[0].tolist(), indices, native)
            kwargs = {"pixel_values_videos": pixels.pixel_values.to(self.device, self.model.dtype),
                      "video_grid_thw": pixels.grid_thw.to(self.device)}
        input_ids = torch.tensor([ids], device=self.device)
        visual = input_ids[0] == self.video_token_id  # video pads only: timestamps and markers are text
        inputs = PreparedInputs(input_ids=input_ids, visual_mask=visual.cpu(), model_kwargs=kwargs)
        inputs.positions, inputs.extra["rope_delta"] = self._rope(inputs)
        return inputs

    def _expand_video(self, ids: list[int], grid: list[int], indices, native_fps: float) -> list[int]:
        """The processor's tokens: the one video pad replaced by every temporal patch's
        `<t seconds><|vision_start|>` + pads + `<|vision_end|>`. Special tokens delimit each timestamp,
        so tokenizing it alone gives the ids it gets inside the whole text (tests check it)."""
        if ids.count(self.video_token_id) != 1:
            raise ValueError(f"expected one video placeholder in the prompt, found {ids.count(self.video_token_id)}")
        per_patch = grid[1] * grid[2] // self.preprocess.merge_size ** 2
        stamps = frame_timestamps(indices, native_fps, self.preprocess.temporal_patch_size)
        if len(stamps) != grid[0]:
            raise ValueError(f"{len(stamps)} timestamps for {grid[0]} temporal patches")
        start, end = self.tokenizer.convert_tokens_to_ids([self.vision_start, self.vision_end])
        block: list[int] = []
        for t in stamps:
            block += self.tokenizer(f"<{t:.1f} seconds>", add_special_tokens=False).input_ids
            block += [start] + [self.video_token_id] * per_patch + [end]
        i = ids.index(self.video_token_id)
        return ids[:i] + block + ids[i + 1:]

    def _rope(self, inputs: PreparedInputs) -> tuple[torch.Tensor, int]:
        ids = inputs.input_ids
        if not inputs.model_kwargs:
            pos = torch.arange(ids.shape[1], device=self.device).view(1, 1, -1).expand(3, 1, -1)
            return pos, 0
        pos, _ = self.model.model.get_rope_index(ids, mm_token_type_ids=(ids == self.video_token_id).int() * 2,
                                                 video_grid_thw=inputs.model_kwargs["video_grid_thw"])
        return pos, int(pos[..., -1].max()) + 1 - ids.shape[1]

    def frame_plan(self, fps: float | None, max_frames: int | None, interface: str = "chat"):
        """lmms-eval's qwen3_vl chat and simple classes sample alike (nframes = max_num_frames, the
        simple class capped at the video's length): the chat rule serves both interfaces."""
        return super().frame_plan(fps, max_frames, "chat")

    def layout(self) -> tuple:
        p = self.preprocess
        return (self.layout_name, p.patch_size, p.temporal_patch_size, p.merge_size, p.min_pixels, p.max_pixels,
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
