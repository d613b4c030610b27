"""Frames and pixels per video rule (issue 17.7), checked against the reference pipelines.

The references, read from the installed sources and written out again here on their own (the
`ref_*` functions), not imported from lvspec_eval:
- lmms-eval 0.7.3 `qwen2_5_vl` (models/chat/qwen2_5_vl.py on top of models/simple/qwen2_5_vl.py):
  min_pixels=256*28*28, max_pixels=1605632, max_num_frames=32, fps=None, so it probes the video and
  asks qwen-vl-utils for nframes = max(2, even_floor(min(32, N))) frames with its two pixel limits.
- qwen-vl-utils 0.0.14 (lmms-eval 0.7.3 requires >=0.0.14), vision_process.py: smart_nframes (fps 2,
  at least 4, at most 768, even), torch.linspace(...).round() indices, fetch_video's per-frame limits
  (min 128*28*28; max = max(min(768*28*28, total/T*2), 1.05*min), and no more than a caller's max).
- lmms-eval 0.7.3 `llava_onevision` (simple/llava_onevision.py load_video): 32 frames at
  np.linspace(0, N-1, 32, dtype=int); SigLIP 384 px, 2x2 bilinear pooling: 196 tokens a frame + 1.
When qwen-vl-utils is installed its own code is run too, on real mp4 files (test_*_real_qwen_vl_utils).
"""
from __future__ import annotations

import importlib
import importlib.util
import json
import math
import shutil
import sys
import types
from fractions import Fraction
from types import SimpleNamespace

import av
import numpy as np
import pytest
import torch

from lvspec_eval.backends import frame_rules, qwen_vision, siglip_vision
from lvspec_eval.backends.loading import _preprocess_overrides, load_backend
from lvspec_eval.models import video
from lvspec_eval.models.video import load_video

F = 28  # Qwen2.5-VL: patch 14 x merge 2
QWEN_VC = SimpleNamespace(patch_size=14, temporal_patch_size=2, spatial_merge_size=2)
RELEASED = (3136, 12845056)  # min/max_pixels of the released Qwen2.5-VL preprocessor_config.json


# ---- the references, written out --------------------------------------------------------------

def ref_smart_resize(h, w, min_p, max_p):
    h_bar, w_bar = max(F, round(h / F) * F), max(F, round(w / F) * F)
    if h_bar * w_bar > max_p:
        beta = math.sqrt(h * w / max_p)
        return math.floor(h / beta / F) * F, math.floor(w / beta / F) * F
    if h_bar * w_bar < min_p:
        beta = math.sqrt(min_p / (h * w))
        return math.ceil(h * beta / F) * F, math.ceil(w * beta / F) * F
    return h_bar, w_bar


def ref_frame_limits(nframes, min_pixels=128 * F * F, max_pixels=None):
    """qwen-vl-utils fetch_video: a caller's max_pixels is lowered to the per-frame cap."""
    total = 128000 * F * F * 0.9
    cap = max(min(768 * F * F, total / nframes * 2), int(min_pixels * 1.05))
    return min_pixels, (cap if max_pixels is None else min(max_pixels, cap))


def ref_qwen_vl_utils_nframes(total, video_fps, fps=2.0):
    min_frames = math.ceil(4 / 2) * 2
    max_frames = math.floor(min(768, total) / 2) * 2
    n = min(min(max(total / video_fps * fps, min_frames), max_frames), total)
    return math.floor(n / 2) * 2


def ref_lmms_eval_nframes(total, max_num_frames=32):
    n = max(2, (min(max_num_frames, total) // 2) * 2)
    return round(n / 2) * 2  # qwen-vl-utils' round_by_factor on the nframes it is given


def ref_qwen_indices(total, nframes):
    return torch.linspace(0, total - 1, nframes).round().long().tolist()


def ref_tokens(h, w, nframes, limits):
    hh, ww = ref_smart_resize(h, w, *limits)
    return math.ceil(nframes / 2) * (hh // 14) * (ww // 14) // 4


def ref_lmms_eval(total, video_fps, h, w):
    n = ref_lmms_eval_nframes(total)
    return n, ref_tokens(h, w, n, ref_frame_limits(n, 256 * F * F, 1605632))


def ref_qwen_vl_utils(total, video_fps, h, w):
    n = ref_qwen_vl_utils_nframes(total, video_fps)
    return n, ref_tokens(h, w, n, ref_frame_limits(n))


# ---- ours -------------------------------------------------------------------------------------

def ours(rule, total, video_fps, h, w, checkpoint_pixels=RELEASED):
    """(frames taken, visual tokens) of lvspec's Qwen2.5-VL preprocessing under `rule`."""
    cfg = qwen_vision.rule_config(QWEN_VC, rule, checkpoint_pixels=checkpoint_pixels)
    fps, max_frames = (2.0, 32) if rule == "fps" else (None, None)  # rule fps: the model_args' defaults
    n = len(qwen_vision.frame_plan(cfg, fps, max_frames).indices(total, video_fps))
    return n, qwen_vision.num_visual_tokens(h, w, n, cfg)


# (name, seconds, native fps, height, width)
VIDEOS = [("240p 5 s", 5, 25, 240, 320), ("360p 30 s", 30, 30, 360, 640), ("720p 10 s", 10, 24, 720, 1280),
          ("1080p 16 s", 16, 30, 1080, 1920), ("1080p 1 h", 3600, 30, 1080, 1920), ("4k 60 s", 60, 60, 2160, 3840),
          ("portrait 20 s", 20, 30, 1920, 1080), ("3 frames", 0.1, 30, 480, 640), ("ultrawide 8 s", 8, 25, 400, 2400)]


@pytest.mark.parametrize("name, seconds, fps, h, w", VIDEOS)
def test_frames_and_tokens_follow_lmms_eval_qwen2_5_vl(name, seconds, fps, h, w):
    total = round(seconds * fps)
    assert ours("lmms_eval", total, fps, h, w) == ref_lmms_eval(total, fps, h, w)


@pytest.mark.parametrize("name, seconds, fps, h, w", VIDEOS)
def test_frames_and_tokens_follow_qwen_vl_utils(name, seconds, fps, h, w):
    total = round(seconds * fps)
    # the released checkpoints' processor limits (3,136..12,845,056) never bind after qwen-vl-utils'
    assert ours("qwen_vl_utils", total, fps, h, w) == ref_qwen_vl_utils(total, fps, h, w)


def test_32_frames_of_1080p():
    """The issue's case, by hand: 1080x1920 -> 1092x1932 unscaled (2,691 tokens a frame pair) under the
    released checkpoint's limits, the old behaviour; both references cap a frame at 602,112 pixels:
    560x1008 = 20 x 36 = 720 tokens a pair, 16 pairs."""
    assert ours("fps", 32, 2.0, 1080, 1920) == (32, 43056)  # the checkpoint's image limits per frame
    assert ours("lmms_eval", 32 * 15, 30, 1080, 1920) == (32, 11520)  # any 32+ frame video
    assert ours("qwen_vl_utils", 16 * 30, 30, 1080, 1920) == (32, 11520)  # 16 s at 2 fps
    assert ours("qwen_vl_utils", 3600 * 30, 30, 1080, 1920) == (768, 105984)  # whole-video budget: 336x644


def test_small_frames_differ_by_min_pixels():
    """lmms-eval asks for 256*28*28 at least, qwen-vl-utils 128*28*28: a 240x320 frame pair gives
    392x532 (14 x 19 = 266 tokens) against 280x392 (10 x 14 = 140)."""
    cfg_l = qwen_vision.rule_config(QWEN_VC, "lmms_eval")
    cfg_q = qwen_vision.rule_config(QWEN_VC, "qwen_vl_utils")
    assert qwen_vision.frame_size(240, 320, 8, cfg_l) == (392, 532)
    assert qwen_vision.frame_size(240, 320, 8, cfg_q) == (280, 392)


def test_user_pixel_limits_win_but_qwen_vl_utils_still_caps_them():
    """max_pixels model_arg = lmms-eval's max_pixels: qwen-vl-utils lowers it to 768 tokens a frame."""
    big = qwen_vision.rule_config(QWEN_VC, "lmms_eval", max_pixels=4 * 1605632)
    small = qwen_vision.rule_config(QWEN_VC, "lmms_eval", max_pixels=256 * F * F + 1)
    assert qwen_vision.frame_size(1080, 1920, 32, big) == (560, 1008)
    assert qwen_vision.frame_size(1080, 1920, 32, small) == ref_smart_resize(1080, 1920, 256 * F * F, 256 * F * F + 1)


# ---- which frames -------------------------------------------------------------------------------

@pytest.mark.parametrize("total", [1, 2, 3, 9, 31, 32, 33, 100, 9000])
def test_lmms_eval_qwen_indices(total):
    plan = qwen_vision.frame_plan(qwen_vision.rule_config(QWEN_VC, "lmms_eval"), None, None)
    expected = [0] if total == 1 else ref_qwen_indices(total, ref_lmms_eval_nframes(total))  # 1 frame: reference raises
    assert plan.indices(total, 30.0).tolist() == expected


@pytest.mark.parametrize("total, native", [(4, 30.0), (9, 30.0), (30, 4.0), (75, 25.0), (200, 10.0), (100000, 30.0)])
def test_qwen_vl_utils_indices(total, native):
    plan = qwen_vision.frame_plan(qwen_vision.rule_config(QWEN_VC, "qwen_vl_utils"), None, None)
    assert plan.indices(total, native).tolist() == ref_qwen_indices(total, ref_qwen_vl_utils_nframes(total, native))


def test_lmms_eval_with_fps_hands_it_to_qwen_vl_utils():
    """lmms-eval's chat class passes fps (when given) instead of nframes: qwen-vl-utils counts then."""
    plan = qwen_vision.frame_plan(qwen_vision.rule_config(QWEN_VC, "lmms_eval"), 1.0, None)
    assert len(plan.indices(300, 30.0)) == ref_qwen_vl_utils_nframes(300, 30.0, fps=1.0) == 10


@pytest.mark.parametrize("total", [3, 10, 32, 100, 5000])
def test_lmms_eval_llava_onevision_takes_32_frames(total):
    plan = siglip_vision.frame_plan(siglip_vision.SiglipPreprocessConfig(video_rule="lmms_eval"), None, None)
    assert plan.indices(total, 30.0).tolist() == np.linspace(0, total - 1, 32, dtype=int).tolist()
    assert siglip_vision.num_video_tokens(32, siglip_vision.SiglipPreprocessConfig()) == 32 * 196 + 1


def test_llava_onevision_refuses_what_its_reference_lacks():
    with pytest.raises(ValueError, match="video_rule='qwen_vl_utils' is not supported for llava_onevision"):
        siglip_vision.SiglipPreprocessConfig(video_rule="qwen_vl_utils")
    with pytest.raises(ValueError, match="fps=1.0: video_rule=lmms_eval takes a fixed number of frames"):
        siglip_vision.frame_plan(siglip_vision.SiglipPreprocessConfig(video_rule="lmms_eval"), 1.0, None)


def test_unknown_rule_names_the_allowed_ones():
    with pytest.raises(ValueError, match="video_rule='lmms' is not supported; expected one of lmms_eval, "
                                         "qwen_vl_utils, fps"):
        qwen_vision.rule_config(QWEN_VC, "lmms")


# ---- a checkpoint's processor configs ---------------------------------------------------------

def write_configs(folder, video=None, image=None):
    folder.mkdir(exist_ok=True)
    for name, cfg in (("video_preprocessor_config.json", video), ("preprocessor_config.json", image)):
        if cfg is not None:
            (folder / name).write_text(json.dumps(cfg))
    return str(folder)


def test_a_video_processor_config_is_honoured(tmp_path):
    path = write_configs(tmp_path / "ckpt", video={"size": {"shortest_edge": 3136, "longest_edge": 50176}},
                         image={"min_pixels": 3136, "max_pixels": 12845056})
    fps = qwen_vision.rule_config(QWEN_VC, **_preprocess_overrides(path, "fps"))
    qvu = qwen_vision.rule_config(QWEN_VC, **_preprocess_overrides(path, "qwen_vl_utils"))
    lmms = qwen_vision.rule_config(QWEN_VC, **_preprocess_overrides(path, "lmms_eval"))
    # rule fps: the video config's limits per frame, not the image config's
    assert qwen_vision.frame_size(1080, 1920, 32, fps) == ref_smart_resize(1080, 1920, 3136, 50176) == (168, 280)
    # qwen_vl_utils: its 560x1008, then the processor (built from the video config) resizes again
    assert qwen_vision.frame_size(1080, 1920, 32, qvu) == ref_smart_resize(560, 1008, 3136, 50176)
    # lmms_eval loads the processor with its own min/max_pixels, which replace the checkpoint's
    assert qwen_vision.frame_size(1080, 1920, 32, lmms) == (560, 1008)


def test_without_a_video_config_the_image_config_applies(tmp_path):
    path = write_configs(tmp_path / "ckpt", image={"min_pixels": 784, "max_pixels": 200704, "image_mean": [0.5] * 3})
    assert _preprocess_overrides(path, "fps") == {"video_rule": "fps", "min_pixels": 784, "max_pixels": 200704,
                                                  "image_mean": (0.5, 0.5, 0.5)}
    assert _preprocess_overrides(path, "qwen_vl_utils", max_pixels=1000)["checkpoint_pixels"] == (784, 200704)
    assert "min_pixels" not in _preprocess_overrides(path, "lmms_eval")


# ---- real files -------------------------------------------------------------------------------

STEP = 24  # frame i: top half grey 24 * (i % 10), bottom half 24 * (i // 10)


def write_mp4(path, num_frames, fps, size):
    h, w = size
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000), options={"crf": "0"})
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv444p"
        for i in range(num_frames):
            frame = np.empty((h, w, 3), np.uint8)
            frame[: h // 2], frame[h // 2:] = STEP * (i % 10), STEP * (i // 10)
            out = av.VideoFrame.from_ndarray(frame, format="rgb24")
            out.pts = i
            container.mux(stream.encode(out))
        container.mux(stream.encode(None))
    return path


def indices_of(frames):
    h = frames.shape[1]
    return [round(float(f[: h // 2].mean()) / STEP) + 10 * round(float(f[h // 2:].mean()) / STEP) for f in frames]


# (frames, fps, (height, width)): 1080p, portrait and 4:3 scaled down ten-fold, short and long
FILES = [(3, 30, (108, 192)), (9, 25, (192, 108)), (40, 30, (108, 192)), (75, 25, (48, 64))]


@pytest.mark.parametrize("num_frames, fps, size", FILES)
@pytest.mark.parametrize("rule", ["lmms_eval", "qwen_vl_utils"])
def test_real_files_through_the_qwen_pipeline(tmp_path, rule, num_frames, fps, size):
    path = write_mp4(tmp_path / "v.mp4", num_frames, fps, size)
    cfg = qwen_vision.rule_config(QWEN_VC, rule)
    out = load_video(path, plan=qwen_vision.frame_plan(cfg, None, None))
    nframes = (ref_lmms_eval if rule == "lmms_eval" else ref_qwen_vl_utils)(num_frames, fps, *size)[0]
    assert indices_of(out.frames) == ref_qwen_indices(num_frames, nframes)
    assert out.fps == pytest.approx(nframes / num_frames * fps)  # transformers' sampled_fps
    pixels = qwen_vision.preprocess_video(out.frames, out.fps, cfg)
    limits = ref_frame_limits(nframes, *((256 * F * F, 1605632) if rule == "lmms_eval" else ()))
    assert pixels.num_visual_tokens == ref_tokens(*size, nframes, limits)


@pytest.mark.parametrize("num_frames, fps, size", FILES[:2])
def test_real_files_through_lmms_eval_llava_frames(tmp_path, num_frames, fps, size):
    path = write_mp4(tmp_path / "v.mp4", num_frames, fps, size)
    plan = siglip_vision.frame_plan(siglip_vision.SiglipPreprocessConfig(video_rule="lmms_eval"), None, None)
    out = load_video(path, plan=plan)
    assert indices_of(out.frames) == np.linspace(0, num_frames - 1, 32, dtype=int).tolist()


def test_a_lying_header_is_planned_again_on_the_decoded_frames(tmp_path, monkeypatch):
    path = write_mp4(tmp_path / "v.mp4", 9, 30, (48, 64))
    monkeypatch.setattr(video, "_probe", lambda p: (40, 30.0))  # claims 40 frames: lmms-eval would ask 32
    plan = qwen_vision.frame_plan(qwen_vision.rule_config(QWEN_VC, "lmms_eval"), None, None)
    assert indices_of(load_video(path, plan=plan).frames) == ref_qwen_indices(9, 8)


# ---- qwen-vl-utils' own code, where installed ---------------------------------------------------

@pytest.fixture
def qwen_vl_utils(monkeypatch):
    """qwen_vl_utils.vision_process; where torchvision cannot be imported (CPU-only torch here) its
    two calls are provided: io.read_video decodes with PyAV, transforms.functional.resize with torch
    (bicubic, antialias). Everything qwen-vl-utils decides (frame count, indices, sizes) is its own."""
    if importlib.util.find_spec("qwen_vl_utils") is None:
        pytest.skip("qwen-vl-utils is not installed")
    try:
        importlib.import_module("torchvision")
    except (ImportError, RuntimeError):
        _provide_torchvision(monkeypatch)
    for name in [n for n in sys.modules if n.startswith("qwen_vl_utils")]:
        monkeypatch.delitem(sys.modules, name)
    module = importlib.import_module("qwen_vl_utils.vision_process")
    monkeypatch.setattr(module, "get_video_reader_backend", lambda: "torchvision")
    yield module
    for name in [n for n in sys.modules if n.startswith("qwen_vl_utils")]:
        del sys.modules[name]


def _provide_torchvision(monkeypatch):
    def read_video(path, start_pts=0.0, end_pts=None, pts_unit="sec", output_format="TCHW"):
        with av.open(path) as container:
            rate = float(container.streams.video[0].average_rate)
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(video=0)]
        return torch.from_numpy(np.stack(frames)).permute(0, 3, 1, 2), None, {"video_fps": rate}

    def resize(videos, size, interpolation=None, antialias=True):
        return torch.nn.functional.interpolate(videos.float(), size=tuple(size), mode="bicubic", antialias=antialias)

    tv, io, tr, fn = (types.ModuleType(n) for n in ("torchvision", "torchvision.io", "torchvision.transforms",
                                                     "torchvision.transforms.functional"))
    tv.__version__, tv.io, tv.transforms, tr.functional = "0.24.0", io, tr, fn
    io.read_video, fn.resize, tr.InterpolationMode = read_video, resize, SimpleNamespace(BICUBIC="bicubic")
    for module in (tv, io, tr, fn):
        monkeypatch.setitem(sys.modules, module.__name__, module)


@pytest.mark.parametrize("num_frames, fps, size", FILES + [(64, 30, (216, 384))])
def test_qwen_vl_utils_rule_matches_the_real_qwen_vl_utils(tmp_path, qwen_vl_utils, num_frames, fps, size):
    path = str(write_mp4(tmp_path / "v.mp4", num_frames, fps, size))
    (frames, meta), sample_fps = qwen_vl_utils.fetch_video({"video": path}, return_video_sample_fps=True,
                                                           return_video_metadata=True)
    cfg = qwen_vision.rule_config(QWEN_VC, "qwen_vl_utils")
    out = load_video(path, plan=qwen_vision.frame_plan(cfg, None, None))
    assert indices_of(out.frames) == list(meta["frames_indices"])
    assert out.fps == pytest.approx(sample_fps)
    assert qwen_vision.frame_size(*size, len(out.frames), cfg) == tuple(frames.shape[-2:])


@pytest.mark.parametrize("num_frames, fps, size", FILES + [(64, 30, (216, 384))])
def test_lmms_eval_rule_matches_lmms_eval_calling_qwen_vl_utils(tmp_path, qwen_vl_utils, num_frames, fps, size):
    """The element lmms-eval 0.7.3's chat qwen2_5_vl builds: its max/min_pixels and probed nframes."""
    path = str(write_mp4(tmp_path / "v.mp4", num_frames, fps, size))
    element = {"video": path, "max_pixels": 1605632, "min_pixels": 256 * F * F,
               "nframes": max(2, (min(32, num_frames) // 2) * 2)}
    (frames, meta), sample_fps = qwen_vl_utils.fetch_video(element, return_video_sample_fps=True,
                                                           return_video_metadata=True)
    cfg = qwen_vision.rule_config(QWEN_VC, "lmms_eval")
    out = load_video(path, plan=qwen_vision.frame_plan(cfg, None, None))
    assert indices_of(out.frames) == list(meta["frames_indices"])
    assert out.fps == pytest.approx(sample_fps)
    assert qwen_vision.frame_size(*size, len(out.frames), cfg) == tuple(frames.shape[-2:])


# ---- loaded backends --------------------------------------------------------------------------

def test_load_backend_applies_the_rule(qwen_family, tmp_path):
    """The tiny checkpoint says 784..7,056 pixels a frame: rule fps keeps that, lmms_eval does not."""
    folder = tmp_path / "ckpt"
    shutil.copytree(qwen_family.target.model.config._name_or_path, folder)
    frames = np.random.default_rng(0).integers(0, 256, (4, 108, 192, 3), dtype=np.uint8)
    counts = {}
    for rule in ("fps", "lmms_eval"):
        backend = load_backend(str(folder), video_rule=rule)
        counts[rule] = backend.prepare("describe the video", [(frames, 2.0)]).num_visual_tokens
        assert backend.frame_plan(None if rule == "lmms_eval" else 2.0, 32).describe.startswith(rule)
    assert counts == {"fps": ref_tokens(108, 192, 4, (784, 7056)),
                      "lmms_eval": ref_tokens(108, 192, 4, ref_frame_limits(4, 256 * F * F, 1605632))}


def test_llava_backend_refuses_qwen_vl_utils(llava_family):
    with pytest.raises(ValueError, match="not supported for llava_onevision"):
        load_backend(llava_family.target.model.config._name_or_path, video_rule="qwen_vl_utils")


def test_rules_are_the_model_arg_values():
    from lvspec_eval.models.args import ModelArgs

    assert ModelArgs.parse({"pretrained": "Qwen/Qwen2.5-VL-7B-Instruct", "device": "cpu"}).video_rule == "lmms_eval"
    assert ModelArgs.parse({"pretrained": "demo", "device": "cpu"}).video_rule == "fps"
    with pytest.raises(ValueError, match="video_rule='x' is not supported; expected one of"):
        ModelArgs.parse({"pretrained": "demo", "device": "cpu", "video_rule": "x"})
    assert frame_rules.VIDEO_RULES == ("lmms_eval", "qwen_vl_utils", "fps")
