"""LLaVA-OneVision: a `<video>` placeholder expanded to the pooled SigLIP tokens, 1-D positions.

The chat template emits one `<video>` token; the model's video path (get_video_features) turns
T frames into T * ceil(side / 2)^2 pooled tokens plus one `image_newline` token at the end, so
the placeholder is repeated that many times and the features are scattered into those positions,
as the model's own forward does. All of these positions count as visual tokens (the newline
included): pruning and relevance see exactly what the model's placeholder mask sees.

The language model is a plain Qwen2 decoder with 1-D RoPE: a token at sequence index s has
position s, so tree nodes and pruned drafts only need their sequence index.
"""
from __future__ import annotations

import torch

from .base import Backend, PreparedInputs
from .chat_template import render_chat
from .frame_rules import FramePlan
from .qwen_vision import expand_video_tokens
from .siglip_vision import (
    SiglipPreprocessConfig,
    frame_plan,
    num_video_tokens,
    preprocess_video,
)

# Keys a checkpoint's preprocessor config (or the user) may override; pixel budgets do not apply,
# every frame is resized to the tower's fixed square input.
OVERRIDE_KEYS = ("image_mean", "image_std", "video_rule")


class LlavaOnevisionBackend(Backend):
    def __init__(self, model, tokenizer, device="cpu", preprocess: SiglipPreprocessConfig | None = None):
        super().__init__(model, tokenizer, device)
        vc = model.config.vision_config
        self.preprocess = preprocess or SiglipPreprocessConfig(image_size=vc.image_size, patch_size=vc.patch_size)
        self.video_token_id = model.config.video_token_id

    @classmethod
    def from_pretrained_parts(cls, model, tokenizer, device, preprocess_overrides: dict) -> LlavaOnevisionBackend:
        unknown = sorted(set(preprocess_overrides) - set(OVERRIDE_KEYS))
        if unknown:
            raise ValueError(f"LLaVA-OneVision preprocessing does not take {', '.join(unknown)}; it resizes "
                             f"every frame to the vision tower's image size; allowed: {', '.join(OVERRIDE_KEYS)}")
        vc = model.config.vision_config
        values = {k: v if k == "video_rule" else tuple(float(x) for x in v) for k, v in preprocess_overrides.items()}
        cfg = SiglipPreprocessConfig(image_size=vc.image_size, patch_size=vc.patch_size, **values)
        return cls(model, tokenizer, device, cfg)

    def frame_plan(self, fps: float | None, max_frames: int | None, interface: str = "chat") -> FramePlan:
        """Which frames of a video this backend's video rule takes (None: the rule's default). Both of
        lmms-eval's llava_hf classes are matched by one rule (siglip_vision.py), so `interface` is unused."""
        return frame_plan(self.preprocess, fps, max_frames)

    def layout(self) -> tuple:
        """What a draft must share with its target for visual tokens to line up."""
        c = self.model.config
        return ("llava_onevision", self.preprocess.image_size, self.preprocess.patch_size,
                self.preprocess.tokens_per_frame, c.vision_feature_select_strategy)

    def text_model(self):
        return self.model.model.language_model

    def prepare(self, prompt: str | list[dict], videos: list) -> PreparedInputs:
        """prompt: the user's text or chat messages (chat_template.chat_messages); videos: list of
        (frames uint8 [T, H, W, 3], fps). One video per prompt; fps is unused (LLaVA-OneVision has no
        temporal positions)."""
        if len(videos) > 1:
            raise ValueError(f"one video per prompt is supported, got {len(videos)}")
        ids = self._chat_ids(prompt, bool(videos))
        kwargs: dict = {}
        if videos:
            frames, _fps = videos[0][:2]  # (frames, fps[, indices, native fps])
            pixels = preprocess_video(frames, self.preprocess)
            ids = expand_video_tokens(ids, self.video_token_id, num_video_tokens(pixels.shape[1], self.preprocess))
            kwargs = {"pixel_values_videos": pixels.to(self.device, self.model.dtype)}
        input_ids = torch.tensor([ids], device=self.device)
        visual = input_ids[0] == self.video_token_id
        return PreparedInputs(input_ids=input_ids, visual_mask=visual.cpu(), model_kwargs=kwargs)

    def _chat_ids(self, prompt: str | list[dict], with_video: bool) -> list[int]:
        """Token ids of the chat prompt; the template must place exactly one `<video>` token."""
        ids = render_chat(self.tokenizer, prompt, int(with_video))
        found = ids.count(self.video_token_id)
        if found != int(with_video):
            raise ValueError(f"the tokenizer's chat template put {found} video tokens (id {self.video_token_id}) "
                             f"in a prompt with {int(with_video)} video; use the checkpoint's LLaVA-OneVision "
                             "chat template (it emits `<video>` for a video content part)")
        return ids

    def visual_features(self, inputs: PreparedInputs) -> torch.Tensor:
        """[num_visual, hidden]: every frame's pooled tokens, then the newline token."""
        out = self.model.model.get_video_features(inputs.model_kwargs["pixel_values_videos"], return_dict=True)
        return out.pooler_output.flatten(0, 1)

    def input_embeds(self, inputs: PreparedInputs) -> torch.Tensor:
        embeds = self.model.model.get_input_embeddings()(inputs.input_ids)
        if inputs.num_visual_tokens:
            # With device_map the vision tower and the embeddings may sit on different devices.
            feats = self.visual_features(inputs).to(embeds.device, embeds.dtype)
            if feats.shape[0] != inputs.num_visual_tokens:
                raise ValueError(f"the video gave {feats.shape[0]} features for {inputs.num_visual_tokens} "
                                 "placeholders; check vision_feature_select_strategy and image_size")
            embeds = embeds.masked_scatter(inputs.visual_mask.to(embeds.device)[None, :, None], feats)
        return embeds

    def prefill_positions(self, inputs: PreparedInputs) -> torch.Tensor:
        return torch.arange(inputs.input_ids.shape[1], device=self.device)[None]

    def position_ids(self, state_extra: dict, seq_index: torch.Tensor) -> torch.Tensor:
        return seq_index.view(1, -1)

