"""Which frames of a video a model sees: the frame-sampling rules of the reference pipelines.

A video rule (model_arg `video_rule`) fixes how many frames are taken from a video, which ones,
and how large each frame is; this module holds the frame half, the pixel half lives with each
family (qwen_vision.py, siglip_vision.py). The rules:

- `lmms_eval`: what lmms-eval 0.7.3's own model class for the family does, so that
  `--model lvspec` scores compare with `--model qwen2_5_vl` / `--model llava_hf` ones (Qwen2.5-VL's
  chat and simple classes sample differently; models/parity.py, tests/test_parity.py).
- `qwen_vl_utils`: qwen-vl-utils 0.0.14's defaults (`fetch_video` without arguments): 2 frames per
  second, at least 4, at most 768, an even count. Qwen2.5-VL only.
- `fps`: this project's own rule, which the demo models were trained with: `fps` frames per second,
  at most `max_frames`, never more than the video has; per-frame pixel limits from the checkpoint.

Every function here is pure: `num_frames` is the number of frames the file really decodes to
(models/video.py clamps a lying header to it), `native_fps` its frame rate.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

VIDEO_RULES = ("lmms_eval", "qwen_vl_utils", "fps")


def check_rule(rule: str, allowed: tuple[str, ...] = VIDEO_RULES, family: str = "") -> None:
    if rule not in allowed:
        where = f" for {family}" if family else ""
        raise ValueError(f"video_rule={rule!r} is not supported{where}; expected one of {', '.join(allowed)}")


# ---- where the frames sit ---------------------------------------------------------------------

def spread_rounded(num_frames: int, count: int) -> np.ndarray:
    """qwen-vl-utils: `torch.linspace(0, N - 1, count).round()` (float32, halves to even): first and
    last frame included. Example: N=10, count=4 -> [0, 3, 6, 9]."""
    return torch.linspace(0, num_frames - 1, count).round().long().numpy()


def spread_rounded64(num_frames: int, count: int) -> np.ndarray:
    """Rule `fps` (unchanged since the demo models were trained): the same spread in float64 numpy,
    which can round a value that float32 puts just off x.5 the other way."""
    return np.linspace(0, num_frames - 1, count).round().astype(np.int64)


def spread_floored(num_frames: int, count: int) -> np.ndarray:
    """lmms-eval's LLaVA-OneVision: `np.linspace(0, N - 1, count, dtype=int)` (rounded down), first
    and last frame included; a video shorter than `count` repeats frames. N=10, count=4 -> [0, 3, 6, 9];
    N=3, count=4 -> [0, 0, 1, 2]."""
    return np.linspace(0, num_frames - 1, count, dtype=int).astype(np.int64)


def thin_out(count: int, limit: int) -> np.ndarray:
    """lmms-eval's simple qwen2_5_vl, after qwen-vl-utils sampled `count` frames: positions
    `np.unique(np.linspace(0, count - 1, limit, dtype=int))`, the last one always kept (unique, so
    a count below `limit` keeps every frame). count=10, limit=4 -> [0, 3, 6, 9]."""
    keep = np.unique(np.linspace(0, count - 1, limit, dtype=int))
    if count - 1 not in keep:
        keep = np.unique(np.append(keep, count - 1))
    return keep.astype(np.int64)


# ---- how many frames --------------------------------------------------------------------------

def fps_count(num_frames: int, native_fps: float, fps: float, max_frames: int) -> int:
    """Rule `fps`: one frame per 1/fps seconds, at most max_frames, at least 1, never upsampled."""
    return min(max_frames, num_frames, max(1, round(num_frames / native_fps * fps)))


def lmms_eval_qwen_count(num_frames: int, max_frames: int) -> int:
    """lmms-eval 0.7.3 chat `qwen2_5_vl` without fps: min(max_num_frames, N) rounded down to an even
    number, at least 2 (qwen-vl-utils then takes exactly that many). A one-frame video makes the
    reference raise; here it gives its one frame."""
    return min(num_frames, max(2, min(max_frames, num_frames) // 2 * 2))


def qwen_vl_utils_count(num_frames: int, native_fps: float, fps: float, max_frames: int,
                        min_frames: int = 4, factor: int = 2) -> int:
    """qwen-vl-utils 0.0.14 `smart_nframes` with `fps`: N / native_fps * fps frames, at least
    `min_frames` (rounded up to `factor`), at most min(max_frames, N) (rounded down to `factor`), at
    most N, then rounded down to `factor`. A video of fewer than `factor` frames makes the reference
    raise; here it gives the frames it has."""
    lower = -(-min_frames // factor) * factor
    upper = min(max_frames, num_frames) // factor * factor
    wanted = min(min(max(num_frames / native_fps * fps, lower), upper), num_frames)
    return max(1, min(num_frames, int(wanted // factor) * factor))


# ---- a plan: count + spread -------------------------------------------------------------------

@dataclass(frozen=True)
class FramePlan:
    """Which frames of a video to keep. `describe` says the rule in words (for logs and errors)."""

    describe: str
    count: Callable[[int, float], int]  # (frames in the video, its fps) -> frames to take
    spread: Callable[[int, int], np.ndarray]  # (frames in the video, frames to take) -> indices

    def indices(self, num_frames: int, native_fps: float) -> np.ndarray:
        """int64 frame indices, in order (repeats possible where the rule repeats frames)."""
        if num_frames < 1:
            raise ValueError(f"num_frames={num_frames}: a video needs at least one frame")
        if native_fps <= 0:
            raise ValueError(f"native_fps={native_fps}: a video needs a positive frame rate")
        return self.spread(num_frames, self.count(num_frames, native_fps))


def fps_plan(fps: float, max_frames: int) -> FramePlan:
    """Rule `fps` (both families): uniform in time, rounded, first and last frame included."""
    if fps is None or max_frames is None or fps <= 0 or max_frames < 1:
        raise ValueError(f"video_rule=fps needs fps > 0 and max_frames >= 1, got fps={fps}, max_frames={max_frames}")
    return FramePlan(f"fps: {fps:g} frames per second, at most {max_frames}",
                     lambda n, native: fps_count(n, native, fps, max_frames), spread_rounded64)
