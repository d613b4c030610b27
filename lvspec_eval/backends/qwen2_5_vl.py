"""Qwen2.5-VL: prompt with video placeholders, pixel preprocessing, and M-RoPE positions.

Positions (transformers 5 pitfalls, DESIGN.md): the prompt's 3-D positions come from the
model's own `get_rope_index` with `mm_token_type_ids` (without it the model silently falls back
to 1-D positions); every later text token at sequence index s gets (s + delta) on all three axes,
where delta = max prompt position + 1 - prompt length. Tree nodes get the position of the slot
they would occupy, so tree verification equals sequential decoding.
"""
from __future__ import annotations

import torch
from transformers.vision_utils import get_vision_window_index

from .base import Backend, PreparedInputs
from .chat_template import render_chat
from .frame_rules import FramePlan
from .qwen_vision import (
    LMMS_EVAL_QWEN,
    LmmsEvalVideo,
    VisionPreprocessConfig,
    expand_video_tokens,
    frame_plan,
    preprocess_video,
    rule_config,
)


class QwenVLBackend(Backend):
    layout_name = "qwen2_5_vl"  # layout(): drafts pair with targets of the same name
    default_mean_std: tuple[float, float, float] | None = None  # None: CLIP's (qwen_vision.py)
    clip_budget = False  # rule fps: the checkpoint's pixel limits are per frame
    lmms_eval_video: LmmsEvalVideo = LMMS_EVAL_QWEN  # rule lmms_eval: what the family's lmms-eval class asks for

    def __init__(self, model, tokenizer, device="cpu", preprocess: VisionPreprocessConfig | None = None):
        super().__init__(model, tokenizer, device)
        vc = model.config.vision_config
        self.preprocess = preprocess or VisionPreprocessConfig(
            patch_size=vc.patch_size, temporal_patch_size=vc.temporal_patch_size, merge_size=vc.spatial_merge_size)
        self.video_token_id = model.config.video_token_id

    @classmethod
    def from_pretrained_parts(cls, model, tokenizer, device, preprocess_overrides: dict) -> QwenVLBackend:
        """preprocess_overrides: video_rule, checkpoint_pixels, and min/max pixels, mean/std
        (loading._preprocess_overrides); the rule's own limits fill what is not given."""
        values = dict(preprocess_overrides)
        if cls.default_mean_std is not None:
            values.setdefault("image_mean", cls.default_mean_std)
            values.setdefault("image_std", cls.default_mean_std)
        return cls(model, tokenizer, device,
                   rule_config(model.config.vision_config, clip_budget=cls.clip_budget, lmms_eval=cls.lmms_eval_video,
                               **values))

    def frame_plan(self, fps: float | None, max_frames: int | None, interface: str = "chat") -> FramePlan:
        """Which frames of a video this backend's video rule takes (None: the rule's default);
        interface: lmms-eval's chat or simple class (their frame rules differ)."""
        return frame_plan(self.preprocess, fps, max_frames, interface, self.lmms_eval_video)

    def layout(self) -> tuple:
        """What a draft must share with its target for visual tokens to line up."""
        p = self.preprocess
        return (self.layout_name, p.patch_size, p.temporal_patch_size, p.merge_size, p.min_pixels, p.max_pixels)

    def text_model(self):
        return self.model.model.language_model

    def prepare(self, prompt: str | list[dict], videos: list) -> PreparedInputs:
        """prompt: the user's text, or chat messages (chat_template.chat_messages); videos: list of
        (frames uint8 [T, H, W, 3], fps). One video per prompt."""
        if len(videos) > 1:
            raise ValueError(f"one video per prompt is supported, got {len(videos)}")
        ids = render_chat(self.tokenizer, prompt, len(videos))
        kwargs: dict = {}
        if videos:
            frames, fps = videos[0][:2]  # (frames, fps[, indices, native fps])
            pixels = preprocess_video(frames, fps, self.preprocess)
            ids = expand_video_tokens(ids, self.video_token_id, pixels.num_visual_tokens)
            kwargs = {"pixel_values_videos": pixels.pixel_values.to(self.device, self.model.dtype),
                      "video_grid_thw": pixels.grid_thw.to(self.device),
                      "second_per_grid_ts": torch.tensor([pixels.second_per_grid], device=self.device)}
        input_ids = torch.tensor([ids], device=self.device)
        visual = input_ids[0] == self.video_token_id
        inputs = PreparedInputs(input_ids=input_ids, visual_mask=visual.cpu(), model_kwargs=kwargs)
        inputs.positions, inputs.extra["rope_delta"] = self._rope(inputs)
        return inputs

    def _rope(self, inputs: PreparedInputs) -> tuple[torch.Tensor, int]:
        ids = inputs.input_ids
        if not inputs.model_kwargs:
            pos = torch.arange(ids.shape[1], device=self.device).view(1, 1, -1).expand(3, 1, -1)
            return pos, 0
        pos, _ = self.model.model.get_rope_index(
            ids, mm_token_type_ids=(ids == self.video_token_id).int() * 2,
            video_grid_thw=inputs.model_kwargs["video_grid_thw"],
            second_per_grid_ts=inputs.model_kwargs["second_per_grid_ts"])
        # Generated tokens continue from the prompt's last position, as in transformers' generate()
        # (which extends the position ids by one a step). get_rope_index's own delta (largest
        # position + 1 - length) agrees only where the text after a video starts past every video
        # position (transformers 4.x); 5.x starts it past the video's spatial extent, so for a video
        # with more temporal patches than merged rows that delta put decoding up to hundreds of
        # positions further on than the prompt and than training (a 512-frame demo video: 240 on).
        return pos, int(pos[..., -1].max()) + 1 - ids.shape[1]

    def visual_features(self, inputs: PreparedInputs) -> torch.Tensor:
        """[num_visual, hidden] merged visual tokens for the whole video.

        When another backend's vision trunk output is in inputs.extra["vision_trunk"] and this
        model's tower is the same up to its merger (`shares_vision_trunk`: a draft whose vision
        blocks are a frozen copy of its target's, as the demo draft's are), only the merger runs."""
        kw = inputs.model_kwargs
        shared = inputs.extra.get("vision_trunk")
        if shared is not None and shared[0] is not self and self.shares_vision_trunk(shared[0]):
            return self._merge(shared[1].to(self.device, self.model.dtype), kw["video_grid_thw"])
        out = self.model.model.visual(kw["pixel_values_videos"], grid_thw=kw["video_grid_thw"])
        if self.keep_vision_trunk:
            inputs.extra["vision_trunk"] = (self, out.last_hidden_state)
        return out.pooler_output

    def _merge(self, trunk: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """The merger on a trunk output [num_patches, vision_hidden] (in the tower's window order, as
        the tower's own forward leaves it), back in sequence order: the tower's last two lines."""
        vc = self.model.config.vision_config
        window_index, _ = get_vision_window_index(grid_thw, vc.spatial_merge_size, vc.window_size, vc.patch_size)
        return self.model.model.visual.merger(trunk)[torch.argsort(window_index.to(trunk.device))]

    def _same_vision_trunk(self, other) -> bool:
        if type(other) is not type(self) or other.preprocess != self.preprocess:
            return False
        mine, theirs = self.model.model.visual, other.model.model.visual
        if any(getattr(mine.config, k, None) != getattr(theirs.config, k, None)
               for k in ("hidden_size", "depth", "window_size", "fullatt_block_indexes", "patch_size")):
            return False
        a = {k: v for k, v in mine.state_dict().items() if not k.startswith("merger.")}
        b = {k: v for k, v in theirs.state_dict().items() if not k.startswith("merger.")}
        return a.keys() == b.keys() and all(
            a[k].shape == b[k].shape and torch.equal(a[k].cpu(), b[k].to(a[k].dtype).cpu()) for k in a)

    def input_embeds(self, inputs: PreparedInputs) -> torch.Tensor:
        embeds = self.model.model.get_input_embeddings()(inputs.input_ids)
        if inputs.num_visual_tokens:
            feats = self.visual_features(inputs).to(embeds.device, embeds.dtype)
            embeds = embeds.masked_scatter(inputs.visual_mask.to(embeds.device)[None, :, None], feats)
        return embeds

    def prefill_positions(self, inputs: PreparedInputs) -> torch.Tensor:
        return inputs.positions

    def init_extra(self, inputs: PreparedInputs) -> dict:
        return {"rope_delta": inputs.extra["rope_delta"]}

    def position_ids(self, state_extra: dict, seq_index: torch.Tensor) -> torch.Tensor:
        return (seq_index + state_extra["rope_delta"]).view(1, 1, -1).expand(3, 1, -1)
