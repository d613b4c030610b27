"""Qwen2-VL / Qwen2.5-VL pixel preprocessing without torchvision, and the video rules' pixel sizes.

transformers' Qwen2-VL video processor imports torchvision, whose PyPI builds break on a CPU-only
torch. These functions reproduce it: `smart_resize` to multiples of patch_size * merge_size within a
pixel budget, bicubic resize, rescale, normalise, then the temporal/spatial patch layout that
Qwen2.5-VL's vision tower expects. Under the `lmms_eval` and `qwen_vl_utils` rules the resize and the
normalisation are qwen-vl-utils' and the processor's own arithmetic, bit for bit (pixels.py); under
`fps` (the demo models) the resize is PIL's bicubic.

How large a frame is depends on the video rule (frame_rules.py):
- `lmms_eval` (lmms-eval 0.7.3 `qwen2_5_vl`): it asks qwen-vl-utils for min_pixels=256*28*28 and
  max_pixels=1,605,632 per frame, and qwen-vl-utils (>=0.0.14, which lmms-eval 0.7.3 requires) caps
  the requested max at 768*28*28 per frame and at an even share of a whole-video budget (90% of
  128,000 tokens), floored at 1.05 x min_pixels. The processor's own resize, loaded with lmms-eval's
  limits, leaves those frames as they are.
- `qwen_vl_utils` (its defaults): min 128*28*28 per frame, the same caps; then the processor's resize
  with the checkpoint's limits (video_preprocessor_config.json, else preprocessor_config.json).
- `fps`: the checkpoint's limits per frame (or min_pixels/max_pixels), no whole-video budget.

Qwen3-VL (patch 16: factor 32, so qwen-vl-utils' token limits scale to 32 px tokens): under
`qwen_vl_utils` its frames are not resized again (its model card and lmms-eval call the processor
with do_resize=False); under `fps` the checkpoint's video processor limits bound the whole clip
(frames x height x width, `clip_smart_resize`), as transformers' Qwen3-VL video processor does.

Qwen3.5 under `lmms_eval` (lmms-eval's `qwen3_5` class, LMMS_EVAL_QWEN3_5): qwen-vl-utils' 2 frames per
second (4 to 768, even), each frame at least 64 tokens and at most 768, within a whole-video budget of
224 x 1024 tokens; the processor does not resize again.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from .frame_rules import (
    FramePlan,
    check_rule,
    fps_plan,
    lmms_eval_qwen_count,
    qwen_vl_utils_count,
    spread_rounded,
    thin_out,
)
from .pixels import normalise_fused, resize_qwen_vl_utils

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

# lmms-eval 0.7.3 lmms_eval/models/simple/qwen2_5_vl.py __init__ defaults (the chat class inherits them)
LMMS_EVAL_MIN_PIXELS = 256 * 28 * 28
LMMS_EVAL_MAX_PIXELS = 1605632
LMMS_EVAL_MAX_FRAMES = 32
# qwen-vl-utils 0.0.14 vision_process.py: VIDEO_MIN/MAX_TOKEN_NUM, MODEL_SEQ_LEN, FPS, FPS_MIN/MAX_FRAMES
QVU_MIN_TOKENS, QVU_MAX_TOKENS, QVU_SEQ_LEN = 128, 768, 128000
QVU_FPS, QVU_MIN_FRAMES, QVU_MAX_FRAMES = 2.0, 4, 768


@dataclass(frozen=True)
class LmmsEvalVideo:
    """What one of lmms-eval 0.7.3's Qwen classes asks qwen-vl-utils for, from its __init__ defaults
    (rule `lmms_eval`; the user's fps / max_frames / min_pixels / max_pixels still win)."""

    describe: str
    min_pixels: int  # per frame
    max_pixels: int | None  # per frame; None: the class passes none, qwen-vl-utils' 768-token cap applies
    total_pixels: int | None  # whole video; None: qwen-vl-utils' default (90% of 128,000 tokens)
    max_frames: int
    by_rate: bool  # False: exactly min(max_frames, N) frames (nframes); True: 2 per second, at most max_frames


# models/simple/qwen2_5_vl.py and models/simple/qwen3_vl.py: min_pixels=256*28*28, max_pixels=1,605,632,
# nframes=max_num_frames=32, no total_pixels
LMMS_EVAL_QWEN = LmmsEvalVideo("lmms_eval qwen2_5_vl", LMMS_EVAL_MIN_PIXELS, LMMS_EVAL_MAX_PIXELS, None,
                               LMMS_EVAL_MAX_FRAMES, by_rate=False)
# models/simple/qwen3_5.py: min_pixels=64*32*32, total_pixels=224*1024*32*32, max_num_frames=768; with
# total_pixels set, qwen3_vl.py's _build_video_kwargs asks for max_frames (no nframes, no max_pixels), so
# qwen-vl-utils samples at its 2 frames per second and caps each frame at 768 tokens
LMMS_EVAL_QWEN3_5 = LmmsEvalVideo("lmms_eval qwen3_5", 64 * 32 * 32, None, 224 * 1024 * 32 * 32, 768, by_rate=True)


@dataclass(frozen=True)
class VisionPreprocessConfig:
    patch_size: int = 14
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 128 * 28 * 28  # per frame
    max_pixels: int = 768 * 28 * 28  # per frame, as asked for (the caps below may lower it)
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD
    video_rule: str = "fps"
    frame_cap_pixels: int | None = None  # qwen-vl-utils' per-frame ceiling (768 tokens), None: none
    total_pixels: int | None = None  # qwen-vl-utils' whole-video budget, None: none
    processor_pixels: tuple[int, int] | None = None  # (min, max) of the processor's resize afterwards
    clip_budget: bool = False  # min/max_pixels bound the whole clip (Qwen3-VL's video processor), not a frame

    def __post_init__(self):
        check_rule(self.video_rule)
        if self.min_pixels > self.max_pixels:
            raise ValueError(f"min_pixels={self.min_pixels} is larger than max_pixels={self.max_pixels}")

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size


def rule_config(vision_config, video_rule: str = "fps", checkpoint_pixels: tuple[int, int] | None = None,
                clip_budget: bool = False, lmms_eval: LmmsEvalVideo = LMMS_EVAL_QWEN, **values) -> VisionPreprocessConfig:
    """The preprocessing of a checkpoint under a video rule. `values`: min_pixels / max_pixels the
    user asked for (they win under every rule), image_mean / image_std; `checkpoint_pixels`: the
    (min, max) of the checkpoint's video (else image) processor config; `lmms_eval`: the limits of
    the family's lmms-eval class (rule `lmms_eval`)."""
    vc = vision_config
    check_rule(video_rule)
    base = {"patch_size": vc.patch_size, "temporal_patch_size": vc.temporal_patch_size,
            "merge_size": vc.spatial_merge_size}
    factor = vc.patch_size * vc.spatial_merge_size
    caps = {"frame_cap_pixels": QVU_MAX_TOKENS * factor ** 2, "total_pixels": int(QVU_SEQ_LEN * factor ** 2 * 0.9)}
    if video_rule == "lmms_eval":
        if lmms_eval.total_pixels is not None:
            caps["total_pixels"] = lmms_eval.total_pixels
        rule = dict(min_pixels=lmms_eval.min_pixels, max_pixels=lmms_eval.max_pixels or caps["frame_cap_pixels"],
                    **caps)
    elif video_rule == "qwen_vl_utils":  # Qwen3-VL's own recipe calls its processor with do_resize=False
        rule = dict(min_pixels=QVU_MIN_TOKENS * factor ** 2, max_pixels=QVU_MAX_TOKENS * factor ** 2,
                    processor_pixels=None if clip_budget else checkpoint_pixels, **caps)
    else:  # a family whose processor budgets the whole clip does so under rule fps only
        rule = dict(zip(("min_pixels", "max_pixels"), checkpoint_pixels or ()), clip_budget=clip_budget)
    return VisionPreprocessConfig(**base, video_rule=video_rule, **{**rule, **values})


def frame_max_pixels(cfg: VisionPreprocessConfig, num_frames: int) -> float:
    """qwen-vl-utils `fetch_video`: max(min(768 tokens, total / T * 2), 1.05 * min_pixels), and no more
    than the max_pixels asked for. Without a budget (rule fps): max_pixels."""
    if cfg.total_pixels is None:
        return cfg.max_pixels
    cap = max(min(cfg.frame_cap_pixels, cfg.total_pixels / num_frames * cfg.temporal_patch_size),
              int(cfg.min_pixels * 1.05))
    return min(cfg.max_pixels, cap)


def frame_size(height: int, width: int, num_frames: int, cfg: VisionPreprocessConfig) -> tuple[int, int]:
    """(height, width) every frame of a `num_frames`-frame video is resized to."""
    if cfg.clip_budget:
        return clip_smart_resize(num_frames, height, width, cfg.factor, cfg.temporal_patch_size, cfg.min_pixels,
                                 cfg.max_pixels)
    h, w = smart_resize(height, width, cfg.factor, cfg.min_pixels, frame_max_pixels(cfg, num_frames))
    if cfg.processor_pixels is not None:  # the processor resizes qwen-vl-utils' frames once more
        h, w = smart_resize(h, w, cfg.factor, *cfg.processor_pixels)
    return h, w


def video_grid(height: int, width: int, num_frames: int, cfg: VisionPreprocessConfig) -> tuple[int, int, int]:
    """(t, h, w) grid of patches for `num_frames` frames of height x width (frames padded to pairs)."""
    h, w = frame_size(height, width, num_frames, cfg)
    return -(-num_frames // cfg.temporal_patch_size), h // cfg.patch_size, w // cfg.patch_size


def num_visual_tokens(height: int, width: int, num_frames: int, cfg: VisionPreprocessConfig) -> int:
    t, h, w = video_grid(height, width, num_frames, cfg)
    return t * h * w // cfg.merge_size ** 2


def frame_plan(cfg: VisionPreprocessConfig, fps: float | None, max_frames: int | None,
               interface: str = "chat", lmms_eval: LmmsEvalVideo = LMMS_EVAL_QWEN) -> FramePlan:
    """Which frames a video gives under cfg.video_rule; fps / max_frames: the user's, None = the rule's.
    interface: the lmms-eval class matched under rule `lmms_eval` (`chat` or `simple`); lmms_eval:
    that class's defaults."""
    if cfg.video_rule == "fps":
        return fps_plan(fps, max_frames)
    if cfg.video_rule == "lmms_eval" and interface == "simple":
        # lmms-eval's simple class: qwen-vl-utils' defaults, then at most max_num_frames of those
        rate, limit, factor = fps or QVU_FPS, max_frames or LMMS_EVAL_MAX_FRAMES, cfg.temporal_patch_size
        return FramePlan(f"lmms_eval simple qwen2_5_vl: {rate:g} frames per second, then at most {limit}",
                         lambda n, native: qwen_vl_utils_count(n, native, rate, QVU_MAX_FRAMES, QVU_MIN_FRAMES,
                                                               factor),
                         lambda n, count: spread_rounded(n, count)[thin_out(count, limit)])
    if cfg.video_rule == "lmms_eval" and fps is None and not lmms_eval.by_rate:
        limit = max_frames or lmms_eval.max_frames
        return FramePlan(f"{lmms_eval.describe}: min({limit}, N) frames, even",
                         lambda n, native: lmms_eval_qwen_count(n, limit), spread_rounded)
    # qwen_vl_utils, or lmms_eval given an fps (lmms-eval then hands fps to qwen-vl-utils), or a class that
    # leaves the rate to qwen-vl-utils (qwen3_5)
    default_limit = lmms_eval.max_frames if cfg.video_rule == "lmms_eval" and lmms_eval.by_rate else QVU_MAX_FRAMES
    rate, limit = fps or QVU_FPS, max_frames or default_limit
    factor = cfg.temporal_patch_size
    return FramePlan(f"{cfg.video_rule}: {rate:g} frames per second, {QVU_MIN_FRAMES} to {limit}, "
                     f"a multiple of {factor}",
                     lambda n, native: qwen_vl_utils_count(n, native, rate, limit, QVU_MIN_FRAMES, factor),
                     spread_rounded)


@dataclass
class VideoPixels:
    pixel_values: torch.Tensor  # [num_patches, 3 * temporal_patch * patch * patch]
    grid_thw: torch.Tensor  # [1, 3] (t, h, w) in patches
    second_per_grid: float  # seconds spanned by one temporal patch
    merge_size: int = 2  # the merger joins merge_size x merge_size patches into one token

    @property
    def num_visual_tokens(self) -> int:
        t, h, w = self.grid_thw[0].tolist()
        return t * h * w // self.merge_size ** 2


def smart_resize(height: int, width: int, factor: int, min_pixels: float, max_pixels: float) -> tuple[int, int]:
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


def clip_smart_resize(num_frames: int, height: int, width: int, factor: int, temporal: int, min_pixels: float,
                      max_pixels: float) -> tuple[int, int]:
    """transformers 5.24 Qwen3-VL video processor `smart_resize`: the budget bounds frames x height x
    width (frames rounded to `temporal`); sides below `factor` are first scaled up to it. A clip of
    one frame (the processor refuses it) counts as one temporal patch."""
    if height < factor or width < factor:
        scale = max(factor / height, factor / width)
        height, width = int(height * scale), int(width * scale)
    if max(height, width) / min(height, width) > 200:
        raise ValueError(f"aspect ratio of a {height}x{width} frame is over 200")
    h_bar, w_bar = round(height / factor) * factor, round(width / factor) * factor
    t_bar = max(temporal, round(num_frames / temporal) * temporal)
    if t_bar * h_bar * w_bar > max_pixels:
        beta = math.sqrt((num_frames * height * width) / max_pixels)
        h_bar = max(factor, math.floor(height / beta / factor) * factor)
        w_bar = max(factor, math.floor(width / beta / factor) * factor)
    elif t_bar * h_bar * w_bar < min_pixels:
        beta = math.sqrt(min_pixels / (num_frames * height * width))
        h_bar = math.ceil(height * beta / factor) * factor
        w_bar = math.ceil(width * beta / factor) * factor
    return h_bar, w_bar


def resize_and_normalise(frames: np.ndarray, cfg: VisionPreprocessConfig) -> np.ndarray:
    """uint8 [T, H, W, 3] -> float32 [T, 3, H', W'] resized and normalised.

    Rules `lmms_eval` and `qwen_vl_utils`: qwen-vl-utils' torchvision resize and the processor's fused
    normalisation, bit for bit (pixels.py). Not bit for bit where the processor's own limits resize
    qwen-vl-utils' frames a second time (rule `qwen_vl_utils` with a checkpoint budget below
    qwen-vl-utils'): ours resizes once, to the final size. Rule `fps`: PIL's bicubic, as the demo
    models were trained.
    """
    t, h, w, _ = frames.shape
    new_h, new_w = frame_size(h, w, t, cfg)
    if cfg.video_rule != "fps":
        return normalise_fused(resize_qwen_vl_utils(frames, new_h, new_w), cfg.image_mean, cfg.image_std).numpy()
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
        merge_size=cfg.merge_size,
    )


def expand_video_tokens(ids: list[int], video_token_id: int, num_tokens: int) -> list[int]:
    """Replace the single video placeholder with one placeholder per visual token."""
    if ids.count(video_token_id) != 1:
        raise ValueError(f"expected one video placeholder in the prompt, found {ids.count(video_token_id)}")
    i = ids.index(video_token_id)
    return ids[:i] + [video_token_id] * num_tokens + ids[i + 1:]
