"""Qwen2-VL / Qwen2.5-VL pixel preprocessing without torchvision.

transformers' Qwen2-VL video processor imports torchvision, whose PyPI builds break on a CPU-only
torch. These functions reproduce the PIL image processor exactly: `smart_resize` to multiples of
patch_size * merge_size within a pixel budget, bicubic resize, rescale, normalise, then the
temporal/spatial patch layout that Qwen2.5-VL's vision tower expects.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True)
class VisionPreprocessConfig:
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 128 * 28 * 28
    max_pixels: int = 768 * 28 * 28
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD


@dataclass
class VideoPixels:
    pixel_values: torch.Tensor  # [num_patches, 3 * temporal_patch * patch * patch]
    grid_thw: torch.Tensor  # [1, 3] (t, h, w) in patches
    second_per_grid: float  # seconds spanned by one temporal patch

    @property
    def num_visual_tokens(self) -> int:
        t, h, w = self.grid_thw[0].tolist()
        return t * h * w // 4


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """Qwen2-VL's rule: round each side to a multiple of `factor`, keep the area within budget."""
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio of a {height}x{width} frame is over 200")
    h_bar = max(factor, round(height / factor) * factor)
    w_bar = max(factor, round(width / factor) * factor)
    if h_bar * w_bar > max_pixels:
        beta = math.sqrt((height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def resize_and_normalise(frames: np.ndarray, cfg: VisionPreprocessConfig) -> np.ndarray:
    """uint8 [T, H, W, 3] -> float32 [T, 3, H', W'] resized (bicubic, as PIL) and normalised."""
    t, h, w, _ = frames.shape
    new_h, new_w = smart_resize(h, w, cfg.patch_size * cfg.merge_size, cfg.min_pixels, cfg.max_pixels)
    if (new_h, new_w) != (h, w):
        frames = np.stack([
            np.asarray(Image.fromarray(f).resize((new_w, new_h), resample=Image.BICUBIC)) for f in frames
        ])
    x = frames.astype(np.float32) * (1 / 255.0)
    x = (x - np.asarray(cfg.image_mean, np.float32)) / np.asarray(cfg.image_std, np.float32)
    return x.transpose(0, 3, 1, 2)


def patchify(x: np.ndarray, cfg: VisionPreprocessConfig) -> tuple[np.ndarray, tuple[int, int, int]]:
    """[T, C, H, W] -> ([grid_t*grid_h*grid_w, C*tp*p*p], (grid_t, grid_h, grid_w)).

    The last frame is repeated to fill the final temporal patch. Patches are ordered so that each
    merge_size x merge_size block is contiguous, which is what the vision merger assumes.
    """
    tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    if x.shape[0] % tp:
        x = np.concatenate([x, np.repeat(x[-1:], tp - x.shape[0] % tp, axis=0)])
    t, c, h, w = x.shape
    gt, gh, gw = t // tp, h // p, w // p
    x = x.reshape(gt, tp, c, gh // m, m, p, gw // m, m, p)
    x = x.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    return np.ascontiguousarray(x.reshape(gt * gh * gw, c * tp * p * p)), (gt, gh, gw)


def preprocess_video(frames: np.ndarray, fps: float, cfg: VisionPreprocessConfig) -> VideoPixels:
    """Frames uint8 [T, H, W, 3] sampled at `fps` -> pixel values and grid for the vision tower."""
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.shape[0] == 0:
        raise ValueError(f"expected frames of shape [T, H, W, 3] with T >= 1, got {tuple(frames.shape)}")
    patches, grid = patchify(resize_and_normalise(frames, cfg), cfg)
    return VideoPixels(
        pixel_values=torch.from_numpy(patches),
        grid_thw=torch.tensor([grid], dtype=torch.long),
        second_per_grid=cfg.temporal_patch_size / fps,
    )


def expand_video_tokens(ids: list[int], video_token_id: int, num_tokens: int) -> list[int]:
    """Replace the single video placeholder with one placeholder per visual token."""
    if ids.count(video_token_id) != 1:
        raise ValueError(f"expected one video placeholder in the prompt, found {ids.count(video_token_id)}")
    i = ids.index(video_token_id)
    return ids[:i] + [video_token_id] * num_tokens + ids[i + 1:]
