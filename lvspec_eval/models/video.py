"""Video files -> uint8 frames, with PyAV, chosen by a frame plan.

Which frames (how many, at which indices) is the video rule's business (backends/frame_rules.py:
lmms-eval's, qwen-vl-utils' or this project's fps rule); the model class asks the target backend for
its `frame_plan` and hands it here. Without one, frames are sampled at `fps`, at most `max_frames`.

Why the extra care: container headers often misreport the number of frames (and sometimes the
duration), so the plan is made from the demuxed packet count and then, if fewer frames decode, made
again on the frames that actually decode. Any file that cannot give at least one frame raises
`VideoError`, which the lmms-eval model turns into a failed sample instead of a failed run.
"""
from __future__ import annotations

import logging
from pathlib import Path

import av
import numpy as np

from ..backends.frame_rules import FramePlan, fps_plan
from ..decoding.runner import VideoInput

log = logging.getLogger(__name__)


class VideoError(ValueError):
    """A video that is missing, empty or cannot be decoded; the message names the path."""


def plan_indices(num_frames: int, native_fps: float, fps: float, max_frames: int) -> np.ndarray:
    """Rule `fps`: indices uniform in time at `fps`, at most `max_frames`, at least 1.

    Example: 8 frames at 4 fps sampled at 2 fps -> 4 frames, indices [0, 2, 5, 7]. Never more
    frames than the video has (no upsampling).
    """
    return fps_plan(fps, max_frames).indices(num_frames, native_fps)


def _open(path: Path):
    try:
        container = av.open(str(path))
    except (av.FFmpegError, OSError) as err:
        raise VideoError(f"{path}: cannot be opened as a video ({err})") from err
    if not container.streams.video:
        container.close()
        raise VideoError(f"{path}: has no video stream")
    return container


def _probe(path: Path) -> tuple[int, float]:
    """(number of video packets, frames per second) without decoding any frame."""
    with _open(path) as container:
        stream = container.streams.video[0]
        rate = stream.average_rate or stream.guessed_rate
        try:
            count = sum(1 for packet in container.demux(stream) if packet.size > 0)
        except av.FFmpegError as err:
            raise VideoError(f"{path}: corrupt stream ({err})") from err
    if not rate or float(rate) <= 0:
        raise VideoError(f"{path}: the stream has no frame rate")
    return count, float(rate)


def _decode(path: Path, wanted: set[int]) -> tuple[dict[int, np.ndarray], int]:
    """Decode every frame; keep those whose index is in `wanted`. Returns (kept, frames decoded)."""
    kept: dict[int, np.ndarray] = {}
    count = 0
    with _open(path) as container:
        try:
            for frame in container.decode(video=0):
                if count in wanted:
                    kept[count] = frame.to_ndarray(format="rgb24")
                count += 1
        except av.FFmpegError as err:
            raise VideoError(f"{path}: corrupt stream after {count} frames ({err})") from err
    return kept, count


def load_video(path: str | Path, fps: float | None = None, max_frames: int | None = None,
               plan: FramePlan | None = None) -> VideoInput:
    """Frames uint8 [T, H, W, 3] chosen by `plan` (default: at `fps`, at most `max_frames`) and the
    rate they were sampled at (frames kept / frames decoded x native rate, as transformers'
    VideoMetadata.sampled_fps; repeated frames count)."""
    plan = plan or fps_plan(fps, max_frames)
    path = Path(path)
    if not path.is_file():
        raise VideoError(f"{path}: no such file")
    if path.stat().st_size == 0:
        raise VideoError(f"{path}: empty file")
    num_packets, native_fps = _probe(path)
    if num_packets == 0:
        raise VideoError(f"{path}: no video frames")
    basis = num_packets  # the frame count the plan is made on
    indices = plan.indices(basis, native_fps)
    kept, decoded = _decode(path, set(indices.tolist()))
    if decoded == 0:
        raise VideoError(f"{path}: no frame could be decoded (empty or corrupt)")
    if decoded < num_packets:  # the packet count overstated the frames: plan again on what decodes
        log.warning("%s: %d packets but %d frames decode; sampling from the decoded frames", path, num_packets, decoded)
        basis = decoded
        indices = plan.indices(basis, native_fps)
        if not set(indices.tolist()) <= kept.keys():
            kept, decoded = _decode(path, set(indices.tolist()))
    try:
        frames = np.stack([kept[int(i)] for i in indices])
    except (KeyError, ValueError) as err:  # a frame vanished on re-decode, or frame sizes changed
        raise VideoError(f"{path}: inconsistent frames ({err})") from err
    effective_fps = len(indices) * native_fps / basis
    return VideoInput(frames=frames, fps=effective_fps, indices=indices, native_fps=native_fps)
