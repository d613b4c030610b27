"""`--model lvspec method=vanilla` against lmms-eval's OWN model classes, on a real video file.

For each family and interface (chat, simple), lmms-eval's class (not our reading of it) and ours answer
the same request (a system turn, text parts around the video, the task's `until`) from the same tiny
random checkpoint, saved in the family's public folder layout, in bfloat16 as lmms-eval's Qwen classes
force it. The test asserts identical decoded frames, pixel values, input ids, prefill positions, greedy
tokens and answer text.

How lmms-eval's classes run here (tests/parity_reference.py, in a subprocess): they need torchvision
(qwen-vl-utils' resize, transformers' video processors) and decord (their video reader), which the
project's environment leaves out: the package index only has CUDA builds of torchvision, whose C
extension does not load on this CPU-only torch. So this test, on first use, unpacks the pinned wheels
below with `pip install --no-deps --target .cache/parity-deps` (git ignores the folder; nothing is
installed into the environment), and the subprocess puts that folder on its path and replaces the one
module that fails, `torchvision._meta_registrations` (it registers the C operators' shapes), with an
empty module. Everything the classes call is torchvision's own pure-Python code; decord is a real build.

A new family adds one entry to FAMILIES (Qwen3-VL: lmms-eval's simple `qwen3_vl`; Qwen3.5: its chat and simple
`qwen3_5`, and the simple one on a Qwen3.5-MoE checkpoint; the thinking switch: the last two tests): its checkpoint builder
(a function in tests/parity_checkpoints.py), lmms-eval's classes, their dtype and our pixel function.
"""
from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import av
import numpy as np
import pytest
import torch
from lmms_eval.api.instance import Instance

from lvspec_eval.backends import qwen_vision, siglip_vision
from lvspec_eval.backends.frame_rules import thin_out

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DEPS_DIR = ROOT / ".cache" / "parity-deps"
PARITY_DEPS = ("torchvision==0.28.0", "decord==0.6.0")  # torchvision 0.28 is the release paired with torch 2.13
VIDEO = dict(frames=9, fps=4, height=100, width=140)  # odd sizes: every frame is resized
UNTIL = ["\n\n", "e"]  # lmms-eval's default blank line, and a letter most answers contain


@dataclass(frozen=True)
class FamilyCase:
    builder: str  # the function of tests/parity_checkpoints.py that saves the tiny checkpoint
    classes: dict  # interface (chat, simple) -> [module, class, extra model_args] of lmms-eval's class
    dtype: str  # what the class loads the model in (ours is told the same)
    pixels: callable  # (our backend, our uint8 frames [T, H, W, 3], their fps) -> float32 pixel values
    context: str = "what colour is the ball"  # the simple interface's doc_to_text
    kept: callable = lambda frames, interface: frames  # which of the frames decord read the class keeps
    chat_system: bool = True  # the chat doc carries its own system turn (a template may refuse a second one)
    folder: str = ""  # the checkpoint's folder name (default: the family's)


def qwen_kept(frames: np.ndarray, interface: str) -> np.ndarray:
    """lmms-eval's simple qwen2_5_vl keeps at most 32 of the frames qwen-vl-utils read."""
    return frames[thin_out(len(frames), 32)] if interface == "simple" else frames


def qwen_pixels(backend, frames: np.ndarray, fps: float) -> torch.Tensor:
    return qwen_vision.preprocess_video(frames, fps, backend.preprocess).pixel_values


def llava_pixels(backend, frames: np.ndarray, fps: float) -> torch.Tensor:
    return siglip_vision.preprocess_video(frames, backend.preprocess)


QWEN_CLASSES = {"chat": ["lmms_eval.models.chat.qwen2_5_vl", "Qwen2_5_VL", {"device_map": "cpu"}],
                "simple": ["lmms_eval.models.simple.qwen2_5_vl", "Qwen2_5_VL", {"device_map": "cpu"}]}
# llava_hf's chat class hands the video paths to transformers' processor, which decodes every frame with
# torchcodec (not installable here); its simple class samples 32 frames with decord
# lmms-eval's chat qwen3_vl asks qwen-vl-utils for 32 frames whatever the video has, which raises on this
# 9-frame clip (its simple class caps the count at the video's length)
QWEN3_CLASSES = {"simple": ["lmms_eval.models.simple.qwen3_vl", "Qwen3_VL", {"device_map": "cpu"}]}
# lmms-eval's qwen3_5 classes leave the frame count to qwen-vl-utils (2 per second), so the chat class runs on
# this clip too; both render with enable_thinking=True and answer with what follows `</think>`
QWEN3_5_CLASSES = {"chat": ["lmms_eval.models.chat.qwen3_5", "Qwen3_5", {"device_map": "cpu"}],
                   "simple": ["lmms_eval.models.simple.qwen3_5", "Qwen3_5", {"device_map": "cpu"}]}
LLAVA_CLASSES = {"simple": ["lmms_eval.models.simple.llava_hf", "LlavaHf", {"device_map": "cpu"}]}
FAMILIES = {
    # the classes force bfloat16; the simple one drops `<image>` from the context
    "qwen2_5_vl": FamilyCase("build_qwen2_5_vl", QWEN_CLASSES, "bfloat16", qwen_pixels,
                             "<image>what colour is the ball", qwen_kept),
    "llava_onevision": FamilyCase("build_llava_onevision", LLAVA_CLASSES, "float32", llava_pixels),  # dtype=auto
    # bfloat16 forced too; min(32, N) frames (rounded to pairs), timestamps in the text
    "qwen3_vl": FamilyCase("build_qwen3_vl", QWEN3_CLASSES, "bfloat16", qwen_pixels, "<image>what colour is the ball"),
    # bfloat16 forced too; 2 frames per second, 64 to 768 tokens a frame; Qwen3.5's template refuses a system
    # turn after the class's own, so the chat doc has none. Vanilla's one-token steps run transformers' own
    # Gated DeltaNet kernel (backends/linear_state.py), so the tokens match in bfloat16 as well
    "qwen3_5": FamilyCase("build_qwen3_5", QWEN3_5_CLASSES, "bfloat16", qwen_pixels, "<image>what colour is the ball",
                          chat_system=False),
    # lmms-eval's qwen3_5 class loads the MoE model class when the checkpoint's name says A<n>B (as in 35B-A3B)
    "qwen3_5_moe": FamilyCase("build_qwen3_5_moe", {"simple": QWEN3_5_CLASSES["simple"]}, "bfloat16", qwen_pixels,
                              "<image>what colour is the ball", folder="Qwen3.5-tiny-A1B"),
}
CASES = [(f, i) for f, case in FAMILIES.items() for i in case.classes]


# ---- fixtures ------------------------------------------------------------------------------------

@pytest.fixture(scope="session")
def parity_deps() -> Path:
    stamp = DEPS_DIR / ".installed"
    if not stamp.exists() or stamp.read_text() != " ".join(PARITY_DEPS):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(DEPS_DIR),
                        *PARITY_DEPS], check=True)
        stamp.write_text(" ".join(PARITY_DEPS))
    return DEPS_DIR


@pytest.fixture(scope="session")
def video_file(tmp_path_factory) -> Path:
    """A real h264 mp4 written with PyAV: moving gradients with noise."""
    path = tmp_path_factory.mktemp("parity") / "clip.mp4"
    h, w = VIDEO["height"], VIDEO["width"]
    yy, xx = np.mgrid[0:h, 0:w]
    rng = np.random.default_rng(0)
    with av.open(str(path), "w") as container:
        stream = container.add_stream("libx264", rate=VIDEO["fps"])
        stream.width, stream.height, stream.pix_fmt = w, h, "yuv420p"
        for i in range(VIDEO["frames"]):
            img = np.stack([(xx * 3 + i * 9) % 256, (yy * 2 + i * 5) % 256,
                            ((xx + yy) // 2 + rng.integers(0, 40, (h, w))) % 256], -1).astype(np.uint8)
            for packet in stream.encode(av.VideoFrame.from_ndarray(img, format="rgb24")):
                container.mux(packet)
        for packet in stream.encode():
            container.mux(packet)
    return path


def run_reference(spec: dict, tmp: Path) -> None:
    path = tmp / f"spec-{len(list(tmp.glob('spec-*')))}.json"
    path.write_text(json.dumps(spec))
    env = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, str(ROOT / "tests" / "parity_reference.py"), str(path)],
                          capture_output=True, text=True, env=env, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-4000:]


@pytest.fixture(scope="session")
def checkpoints(parity_deps, tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("parity-checkpoints")
    out = {}
    for family in FAMILIES:
        out[family] = root / (FAMILIES[family].folder or family)
        run_reference({"deps": str(parity_deps), "build": True, "builder": FAMILIES[family].builder,
                       "checkpoint": str(out[family])}, root)
    return out


# ---- one request through both classes --------------------------------------------------------------

def doc_for(interface: str, video: Path, context: str, system: bool = True) -> dict:
    if interface == "chat":
        return {"messages": [
            {"role": "system", "content": [{"type": "text", "text": "Answer briefly."}]},
            {"role": "user", "content": [{"type": "text", "text": "Look at this:"},
                                         {"type": "video", "url": str(video)},
                                         {"type": "text", "text": "what colour is the ball"},
                                         {"type": "text", "text": " and the square?"}]}][0 if system else 1:]}
    return {"context": context, "video": str(video)}


def instance(interface: str, gen_kwargs: dict, doc: dict) -> Instance:
    if interface == "chat":
        args = ("ctx", lambda d: d["messages"], dict(gen_kwargs), 0, "parity", "test")
    else:
        args = (doc["context"], dict(gen_kwargs), lambda d: [d["video"]], 0, "parity", "test")
    return Instance("generate_until", args, 0, {"task": "parity", "doc_id": 0, "repeats": 1})


def checkpoint_model(path: Path):
    """An empty model of the checkpoint's own class (meta device: nothing is loaded)."""
    from transformers import AutoConfig

    from lvspec_eval.backends.loading import _model_class

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        return _model_class(config.model_type)(config)


def run_ours(interface: str, checkpoint: Path, doc: dict, gen_kwargs: dict, dtype: str, **model_args) -> dict:
    from lvspec_eval.models.lvspec import LVSpecChat, LVSpecSimple

    cls = LVSpecChat if interface == "chat" else LVSpecSimple
    lm = cls(pretrained=str(checkpoint), device="cpu", dtype=dtype, method="vanilla", **model_args)
    lm.task_dict = {"parity": {"test": [doc]}}
    record: dict = {}
    prepare, generate = lm.runner.target.prepare, lm.runner.generate

    def capture_prepare(prompt, videos):
        record["inputs"], (record["frames"], record["fps"]) = prepare(prompt, videos), videos[0][:2]
        return record["inputs"]

    def capture_generate(*args, **kwargs):
        record["generation"] = generate(*args, **kwargs)
        return record["generation"]

    lm.runner.target.prepare, lm.runner.generate = capture_prepare, capture_generate
    record["text"] = lm.generate_until([instance(interface, gen_kwargs, doc)])[0].text
    record["backend"], record["rules"], record["thinking"] = lm.runner.target, lm.rules, lm.thinking
    return record


def compare(family: str, interface: str, checkpoints, parity_deps, video_file, tmp_path, class_args=None,
            **our_args) -> tuple[dict, dict]:
    """One request through lmms-eval's class (model_args `class_args` added) and ours (`our_args`); asserts
    that they saw and answered alike. Returns (theirs, ours)."""
    gen_kwargs = {"until": UNTIL, "max_new_tokens": 24, "temperature": 0}  # qwen3_5's classes sample without it
    case = FAMILIES[family]
    doc = doc_for(interface, video_file, case.context, case.chat_system)
    module, name, extra = case.classes[interface]
    spec = {"deps": str(parity_deps), "family": family, "kind": interface, "checkpoint": str(checkpoints[family]),
            "reference": [module, name, {**extra, **(class_args or {})}],
            "out": str(tmp_path / "reference.pt"), "gen_kwargs": gen_kwargs, "doc": doc}
    run_reference(spec, tmp_path)
    ref = torch.load(tmp_path / "reference.pt", weights_only=False)
    assert ref["dtype"] == f"torch.{case.dtype}"
    assert ref["model_class"] == type(checkpoint_model(checkpoints[family])).__name__  # e.g. the MoE class
    ours = run_ours(interface, checkpoints[family], doc, gen_kwargs, case.dtype, **our_args)
    hf, inputs = ref["generate_kwargs"], ours["inputs"]

    # frames: decord's (lmms-eval's reader) and PyAV's (ours), and which of them were kept
    theirs = case.kept(ref["decord_frames"][-1], interface)
    assert ours["frames"].shape == theirs.shape and np.array_equal(ours["frames"], theirs)
    # pixel values (float32, before the model's cast) and the visual inputs beside them
    assert torch.equal(case.pixels(ours["backend"], ours["frames"], ours["fps"]), hf["pixel_values_videos"])
    dtype = inputs.model_kwargs["pixel_values_videos"].dtype
    assert torch.equal(inputs.model_kwargs["pixel_values_videos"], hf["pixel_values_videos"].to(dtype))
    for key in ("video_grid_thw", "second_per_grid_ts"):
        if key in hf:
            assert torch.equal(inputs.model_kwargs[key].float(), hf[key].float()), key
    assert inputs.input_ids.tolist() == hf["input_ids"].tolist()
    if inputs.positions is not None:  # transformers prepends the text positions as a fourth row
        assert torch.equal(inputs.positions, ref["position_ids"][-3:])
    # greedy tokens (up to the eos token the class stops at) and the answer after its stop strings
    new = ref["sequences"][0, hf["input_ids"].shape[1]:].tolist()
    eos = ours["backend"].tokenizer.eos_token_id
    expected = new[: new.index(eos)] if eos in new else new
    mine = ours["generation"].tokens
    # a class that ignores `until` gives every token; qwen's simple class cuts the text, where we stop
    if ours["rules"].until != "ignore":
        expected = expected[: len(mine)]
    assert mine == expected
    assert ours["text"] == ref["text"]
    return ref, ours


@pytest.mark.parametrize("family,interface", CASES)
def test_vanilla_matches_lmms_eval_class(family, interface, checkpoints, parity_deps, video_file, tmp_path):
    compare(family, interface, checkpoints, parity_deps, video_file, tmp_path)


def prompt_tail(record: dict) -> str:
    tokenizer = record["backend"].tokenizer
    return tokenizer.decode(record["inputs"].input_ids[0].tolist())


def test_qwen3_5_thinks_by_default_as_lmms_evals_class(checkpoints, parity_deps, video_file, tmp_path):
    """The class's default (enable_thinking=True) and ours: the prompt opens `<think>` after the assistant
    header, and the answer is what follows `</think>` (nothing here: 24 random tokens never close it)."""
    ref, ours = compare("qwen3_5", "simple", checkpoints, parity_deps, video_file, tmp_path)
    assert prompt_tail(ours).endswith("<|im_start|>assistant\n<think>\n") and ours["thinking"] is True
    assert "</think>" not in ours["generation"].text and ours["text"] == ref["text"] == ""


def test_qwen3_5_thinking_off_matches_enable_thinking_false(checkpoints, parity_deps, video_file, tmp_path):
    """thinking=off is the class's enable_thinking=false: an empty thinking block closed in the prompt, and
    the answer is the whole text (cut at the task's stop strings)."""
    ref, ours = compare("qwen3_5", "simple", checkpoints, parity_deps, video_file, tmp_path,
                        class_args={"enable_thinking": False}, thinking="off")
    assert prompt_tail(ours).endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n") and ours["thinking"] is False
    assert ours["text"] == ref["text"] and ours["text"] == ours["generation"].text.split("e")[0]
