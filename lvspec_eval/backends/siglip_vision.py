"""LLaVA-OneVision video preprocessing without torchvision.

transformers' LLaVA-OneVision video processor needs torchvision, whose PyPI builds break on a
CPU-only torch. A video frame's path is simple enough to reproduce: resize every frame to the
SigLIP tower's square input (bicubic, aspect ratio not kept, as the processor's
{"height": S, "width": S} size does), rescale by 1/255, normalise with the checkpoint's mean/std
(0.5 / 0.5 in the released LLaVA-OneVision checkpoints). Under rule `lmms_eval` the resize and the
normalisation are the video processor's own arithmetic, bit for bit (pixels.py); under `fps`
the resize is PIL's bicubic.

The visual-token count follows LlavaOnevisionModel.get_video_features: each frame's
(S / patch)^2 patch features are bilinearly pooled to ceil(side / 2)^2 tokens, the frames are
laid out one after another, and a single learned `image_newline` vector closes the video.

Frames per video rule (frame_rules.py): `lmms_eval` follows lmms-eval 0.7.3's `llava_onevision`
(and `llava_hf`): exactly max_frames_num=32 frames at `np.linspace(0, N - 1, 32, dtype=int)`, so a
video of fewer frames repeats some, whatever its length or frame rate; every frame is resized to the
tower's square (384x384) and pooled 2x2 (mm_spatial_pool_stride=2, bilinear): 32 * 196 + 1 = 6,273
visual tokens per video. `fps` samples at fps as for Qwen. qwen-vl-utils has no LLaVA rule.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .frame_rules import FramePlan, check_rule, fps_plan, spread_floored
from .pixels import normalise_fused, resize_transformers

SIGLIP_MEAN = (0.5, 0.5, 0.5)
SIGLIP_STD = (0.5, 0.5, 0.5)
LLAVA_VIDEO_RULES = ("lmms_eval", "fps")
LMMS_EVAL_MAX_FRAMES = 32  # lmms-eval 0.7.3 llava_onevision.py / llava_hf.py max_frames_num


@dataclass(frozen=True)
class SiglipPreprocessConfig:
    image_size: int = 384  # side of the square frame the vision tower takes
    patch_size: int = 14
    image_mean: tuple[float, float, float] = SIGLIP_MEAN
    image_std: tuple[float, float, float] = SIGLIP_STD
    video_rule: str = "fps"

    def __post_init__(self):
        check_rule(self.video_rule, LLAVA_VIDEO_RULES, "llava_onevision")
        if self.image_size < self.patch_size:
            raise ValueError(f"image_size={self.image_size} is smaller than patch_size={self.patch_size}")
        for name in ("image_mean", "image_std"):
            if len(getattr(self, name)) != 3:
                raise ValueError(f"{name} needs 3 values (RGB), got {getattr(self, name)!r}")

    @property
    def pooled_side(self) -> int:
        """Tokens per side of one frame after the model's 2x bilinear pooling.

        The patch grid is floor(S / patch) (SigLIP's 384 / 14 gives 27, pooled to 14).
        """
        return math.ceil((self.image_size // self.patch_size) / 2)

    @property
    def tokens_per_frame(self) -> int:
        return self.pooled_side ** 2


def frame_plan(cfg: SiglipPreprocessConfig, fps: float | None, max_frames: int | None) -> FramePlan:
    """Which frames a video gives under cfg.video_rule; fps / max_frames: the user's, None = the rule's."""
    if cfg.video_rule == "fps":
        return fps_plan(fps, max_frames)
    if fps is not None:
        raise ValueError(f"fps={fps}: video_rule=lmms_eval takes a fixed number of frames for llava_onevision "
                         "(lmms-eval's llava_onevision has no fps); set max_frames, or use video_rule=fps")
    count = max_frames or LMMS_EVAL_MAX_FRAMES
    return FramePlan(f"lmms_eval llava_onevision: {count} frames, repeated in shorter videos",
                     lambda n, native: count, spread_floored)


def num_video_tokens(num_frames: int, cfg: SiglipPreprocessConfig) -> int:
    """Placeholders one video takes: pooled tokens of every frame, then one newline token."""
    return num_frames * cfg.tokens_per_frame + 1


def preprocess_video(frames: np.ndarray, cfg: SiglipPreprocessConfig) -> torch.Tensor:
    """Frames uint8 [T, H, W, 3] -> float32 pixel_values_videos [1, T, 3, S, S]."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] == 0:
        raise ValueError(f"expected frames of shape [T, H, W, 3] with T >= 1, got {tuple(frames.shape)}")
    s = cfg.image_size
    if cfg.video_rule == "lmms_eval":  # transformers' video processor, as lmms-eval's llava_hf calls it (pixels.py)
        return normalise_fused(resize_transformers(frames, s, s), cfg.image_mean, cfg.image_std)[None]
    if frames.shape[1:3] != (s, s):
        frames = np.stack([
            np.asarray(Image.fromarray(f).resize((s, s), resample=Image.BICUBIC)) for f in frames
        ])
    x = frames.astype(np.float32) * (1 / 255.0)
    x = (x - np.asarray(cfg.image_mean, np.float32)) / np.asarray(cfg.image_std, np.float32)
    return torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2)))[None]
