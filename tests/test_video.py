"""Video input: PyAV decoding, uniform sampling in time, clamping, errors; Qwen pixel preprocessing."""
from __future__ import annotations

from fractions import Fraction

import av
import numpy as np
import pytest
from PIL import Image

from lvspec_eval.backends import qwen_vision
from lvspec_eval.models import video
from lvspec_eval.models.video import VideoError, load_video, plan_indices

LEVEL_STEP = 24  # frame i is filled with grey level LEVEL_STEP * i, so a decoded frame names its index


def write_mp4(path, num_frames: int, fps: float, size=(48, 64)) -> np.ndarray:
    """An mp4 written with PyAV whose frame i is uniformly grey at LEVEL_STEP * i."""
    h, w = size
    frames = np.stack([np.full((h, w, 3), LEVEL_STEP * i, np.uint8) for i in range(num_frames)])
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000), options={"crf": "0"})
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv444p"
        for i, f in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(f, format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))
    return frames


def frame_indices(frames: np.ndarray) -> list[int]:
    return [round(float(f.mean()) / LEVEL_STEP) for f in frames]


# ---- sampling plan ---------------------------------------------------------------------------------

@pytest.mark.parametrize("num_frames, native, fps, max_frames, expected", [
    (8, 4.0, 4.0, 32, list(range(8))),  # the native rate: every frame
    (8, 4.0, 2.0, 32, [0, 2, 5, 7]),  # half the rate: uniform over the whole clip
    (8, 4.0, 100.0, 32, list(range(8))),  # never upsampled
    (30, 10.0, 10.0, 5, [0, 7, 14, 22, 29]),  # capped at max_frames, still spanning the clip
    (8, 4.0, 0.01, 32, [0]),  # at least one frame
])
def test_plan_indices(num_frames, native, fps, max_frames, expected):
    assert plan_indices(num_frames, native, fps, max_frames).tolist() == expected


# ---- decoding --------------------------------------------------------------------------------------

def test_decodes_every_frame_at_the_native_rate(tmp_path):
    path = tmp_path / "clip.mp4"
    frames = write_mp4(path, 8, 4.0)
    out = load_video(path, fps=4.0, max_frames=32)
    assert out.frames.dtype == np.uint8 and out.frames.shape == (8, 48, 64, 3)
    assert out.fps == pytest.approx(4.0)
    assert np.abs(out.frames.astype(int) - frames).max() <= 2  # crf 0: (nearly) lossless


def test_samples_uniformly_in_time_and_reports_the_effective_rate(tmp_path):
    path = tmp_path / "clip.mp4"
    write_mp4(path, 8, 4.0)
    out = load_video(path, fps=2.0, max_frames=32)
    assert frame_indices(out.frames) == [0, 2, 5, 7]
    assert out.fps == pytest.approx(2.0)
    capped = load_video(path, fps=4.0, max_frames=3)
    assert frame_indices(capped.frames) == [0, 4, 7]
    assert capped.fps == pytest.approx(3 * 4.0 / 8)  # 3 frames over a 2-second clip


def test_a_header_that_overstates_the_frames_is_clamped_to_what_decodes(tmp_path, monkeypatch):
    path = tmp_path / "clip.mp4"
    write_mp4(path, 8, 4.0)
    monkeypatch.setattr(video, "_probe", lambda p: (20, 4.0))  # claims 20 frames; 8 decode
    out = load_video(path, fps=4.0, max_frames=32)
    assert frame_indices(out.frames) == list(range(8))
    assert out.fps == pytest.approx(4.0)


def test_missing_file(tmp_path):
    with pytest.raises(VideoError, match="nope.mp4: no such file"):
        load_video(tmp_path / "nope.mp4", fps=2.0, max_frames=8)


def test_empty_file(tmp_path):
    path = tmp_path / "empty.mp4"
    path.write_bytes(b"")
    with pytest.raises(VideoError, match="empty.mp4: empty file"):
        load_video(path, fps=2.0, max_frames=8)


@pytest.mark.parametrize("content", [b"this is not a video" * 50, np.random.default_rng(0).bytes(4096)])
def test_corrupt_file(tmp_path, content):
    path = tmp_path / "corrupt.mp4"
    path.write_bytes(content)
    with pytest.raises(VideoError, match="corrupt.mp4"):
        load_video(path, fps=2.0, max_frames=8)


def test_truncated_file_fails_or_gives_only_real_frames(tmp_path):
    path = tmp_path / "clip.mp4"
    write_mp4(path, 8, 4.0)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    try:
        out = load_video(path, fps=4.0, max_frames=32)
    except VideoError as err:
        assert "clip.mp4" in str(err)
    else:
        assert 1 <= len(out.frames) <= 8


def test_video_error_is_a_value_error():
    assert issubclass(VideoError, ValueError)


# ---- pixel preprocessing against a direct reference ------------------------------------------------

def reference_pixels(frames: np.ndarray, cfg: qwen_vision.VisionPreprocessConfig) -> np.ndarray:
    """PIL bicubic resize to the smart_resize size, x/255, (x - mean)/std, then the documented layout:
    for each temporal group, for each merge block (row-major), for each patch in the block
    (row-major), one row of channel x temporal x patch_row x patch_col values."""
    factor = cfg.patch_size * cfg.merge_size
    h, w = qwen_vision.smart_resize(frames.shape[1], frames.shape[2], factor, cfg.min_pixels, cfg.max_pixels)
    resized = [np.asarray(Image.fromarray(f).resize((w, h), Image.BICUBIC), np.float32) / 255 for f in frames]
    x = np.stack([(r - np.array(cfg.image_mean)) / np.array(cfg.image_std) for r in resized]).astype(np.float32)
    tp, p, m = cfg.temporal_patch_size, cfg.patch_size, cfg.merge_size
    while len(x) % tp:
        x = np.concatenate([x, x[-1:]])
    rows = []
    for t in range(0, len(x), tp):
        for bh in range(h // p // m):
            for bw in range(w // p // m):
                for mh in range(m):
                    for mw in range(m):
                        y0, x0 = (bh * m + mh) * p, (bw * m + mw) * p
                        patch = x[t:t + tp, y0:y0 + p, x0:x0 + p, :]  # [tp, p, p, c]
                        rows.append(patch.transpose(3, 0, 1, 2).reshape(-1))
    return np.stack(rows)


def test_preprocessing_matches_the_reference_on_an_odd_frame_size():
    cfg = qwen_vision.VisionPreprocessConfig(min_pixels=784, max_pixels=200704)
    frames = np.random.default_rng(0).integers(0, 256, (3, 50, 75, 3), dtype=np.uint8)  # not multiples of 28
    x = qwen_vision.resize_and_normalise(frames, cfg)
    assert x.shape[2:] == (56, 84)  # resized to multiples of 28
    patches, grid = qwen_vision.patchify(x, cfg)
    assert grid == (2, 4, 6)  # 3 frames padded to 4 = 2 temporal groups; 56/14 x 84/14 patches
    np.testing.assert_allclose(patches, reference_pixels(frames, cfg), rtol=0, atol=1e-5)
