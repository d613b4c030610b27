"""Failing loudly: device failures stop the run, lmms-eval's --use_cache resumes only from records of the
same settings, chat templates that cannot take a video are caught at start (and by dry-run, without
weights), one preprocessing per request, and a sample's own peak memory."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from test_plugin import (
    GEN,
    LMMS_EVAL,
    TASK,
    chat_request,
    docs,
    make_model,
    read_jsonl,
    results_files,
)

from lvspec_eval.backends.loading import DEMO_NAMES
from lvspec_eval.demo import tasks_data
from lvspec_eval.models import lvspec

DEMO_TARGET = DEMO_NAMES["demo"]
CONFIG_FILES = ("config.json", "generation_config.json", "preprocessor_config.json", "tokenizer.json",
                "tokenizer_config.json")


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    from test_plugin import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def synthvid(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("synthvid")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tasks_data.ENV_DOCS, "3")
        tasks_data.ensure(TASK, root)
    return root


def failing_on_call(runner, n: int, error: BaseException):
    """runner.generate that raises `error` on its n-th call (0-based) and decodes normally otherwise."""
    original, calls = runner.generate, []

    def generate(*args, **kwargs):
        calls.append(1)
        if len(calls) - 1 == n:
            raise error
        return original(*args, **kwargs)

    return generate


# ---- device failures -------------------------------------------------------------------------------------

DEVICE_FAILURES = {
    "device-side assert": torch.AcceleratorError("CUDA error: device-side assert triggered"),
    "out of memory": torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB"),
    "plain RuntimeError from CUDA": RuntimeError("CUDA error: an illegal memory access was encountered"),
}


@pytest.mark.parametrize("name", list(DEVICE_FAILURES))
def test_a_device_failure_aborts_the_run_naming_the_sample(name, tiny_model, synthvid, tmp_path, monkeypatch):
    lm = make_model("LVSpecChat", tiny_model, tmp_path / "stats.jsonl", max_new_tokens=4)
    lm.task_dict = {TASK: {"test": docs(synthvid)}}
    monkeypatch.setattr(lm.runner, "generate", failing_on_call(lm.runner, 1, DEVICE_FAILURES[name]))
    with pytest.raises(lvspec.DeviceFailure, match=f"task {TASK} doc 1 failed on the device") as caught:
        lm.generate_until([chat_request(i, GEN) for i in range(3)])
    assert caught.value.__cause__ is DEVICE_FAILURES[name] and "on_device_error=skip" in str(caught.value)
    ok, failed = read_jsonl(tmp_path / "stats.jsonl")  # doc 2 was never run
    assert ok["doc_id"] == 0 and ok["error"] is None
    assert failed["doc_id"] == 1 and failed["device_error"] is True and str(DEVICE_FAILURES[name]) in failed["error"]


def test_on_device_error_skip_fails_the_sample_alone(tiny_model, synthvid, tmp_path, monkeypatch):
    lm = make_model("LVSpecChat", tiny_model, tmp_path / "stats.jsonl", max_new_tokens=4, on_device_error="skip")
    lm.task_dict = {TASK: {"test": docs(synthvid)}}
    monkeypatch.setattr(lm.runner, "generate", failing_on_call(lm.runner, 1, DEVICE_FAILURES["out of memory"]))
    results = lm.generate_until([chat_request(i, GEN) for i in range(3)])
    assert results[1].text == "" and results[0].text and results[2].text
    records = read_jsonl(tmp_path / "stats.jsonl")
    assert [r["error"] is None for r in records] == [True, False, True]
    assert records[1]["device_error"] is True and "OutOfMemoryError" in records[1]["error"]


def test_bad_input_still_fails_alone_and_is_not_a_device_error(tiny_model, synthvid, tmp_path, monkeypatch):
    lm = make_model("LVSpecChat", tiny_model, tmp_path / "stats.jsonl", max_new_tokens=4)
    good = docs(synthvid)[:1]
    lm.task_dict = {TASK: {"test": good + [{**good[0], "video": str(tmp_path / "missing.mp4")}] + good}}
    results = lm.generate_until([chat_request(i, GEN) for i in range(3)])
    assert [r.text == "" for r in results] == [False, True, False]
    failed = read_jsonl(tmp_path / "stats.jsonl")[1]
    assert failed["device_error"] is False and "missing.mp4: no such file" in failed["error"]


def test_device_errors_are_told_from_input_errors():
    assert all(lvspec.is_device_error(e) for e in DEVICE_FAILURES.values())
    assert lvspec.is_device_error(torch.cuda.DeferredCudaCallError("CUDA call failed lazily"))
    for err in (ValueError("CUDA error"), RuntimeError("shape '[2, 3]' is invalid for input of size 5"),
                RuntimeError("Expected all tensors to be on the same device")):
        assert not lvspec.is_device_error(err), err


# ---- lmms-eval's response cache ----------------------------------------------------------------------------

def test_use_cache_resumes_from_stats_at_construction(tiny_model, tmp_path):
    """Through lmms-eval's own simple_evaluate (the model is built before its ResponseCache exists): the
    stats file is read and checked at construction, so a record of other settings stops the run at start."""
    from lmms_eval.evaluator import simple_evaluate

    stats = tmp_path / "stats.jsonl"
    stats.write_text(json.dumps({"task": TASK, "doc_id": 0, "settings": {"method": "fly"}}) + "\n")
    with pytest.raises(ValueError, match="made under other settings: .*method='fly' there, 'vanilla' now"):
        simple_evaluate(model="lvspec", model_args=f"pretrained={tiny_model},stats_path={stats}", tasks=[TASK],
                        use_cache=str(tmp_path / "cache"), task_manager=object(), limit=1)


# ---- chat templates ----------------------------------------------------------------------------------------

def checkpoint_with_template_in(folder: Path, where: str, weights: bool = False) -> Path:
    """The demo target's config and tokenizer files, its chat template moved to `where`
    (chat_template.json as a processor keeps it, or nowhere)."""
    folder.mkdir(parents=True)
    for name in CONFIG_FILES + (("model.safetensors",) if weights else ()):
        shutil.copy(DEMO_TARGET / name, folder / name)
    template = (DEMO_TARGET / "chat_template.jinja").read_text()
    if where == "chat_template.json":
        (folder / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    return folder


def text_only_template(folder: Path) -> Path:
    """A checkpoint whose processor template drops video parts (a text-only chat template)."""
    checkpoint_with_template_in(folder, "nowhere")
    template = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% for p in m['content'] %}{% if p['type'] == "
                "'text' %}{{ p['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endfor %}<|im_start|>assistant\n")
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": template}))
    return folder


def test_the_processor_chat_template_is_used_when_the_tokenizer_has_none(tmp_path):
    from transformers import AutoTokenizer

    from lvspec_eval.backends.chat_template import check_video_template, load_tokenizer

    folder = checkpoint_with_template_in(tmp_path / "ckpt", "chat_template.json")
    assert AutoTokenizer.from_pretrained(folder).chat_template is None  # what failed every sample
    tokenizer = load_tokenizer(str(folder))
    assert tokenizer.chat_template == (DEMO_TARGET / "chat_template.jinja").read_text()
    video_token = tokenizer.convert_tokens_to_ids("<|video_pad|>")
    assert "<|video_pad|>" in check_video_template(tokenizer, video_token, "pretrained")


def test_a_run_on_a_processor_template_checkpoint_answers(synthvid, tmp_path):
    folder = checkpoint_with_template_in(tmp_path / "ckpt", "chat_template.json", weights=True)
    lm = make_model("LVSpecChat", folder, tmp_path / "stats.jsonl", max_new_tokens=4)
    lm.task_dict = {TASK: {"test": docs(synthvid)[:1]}}
    assert lm.generate_until([chat_request(0, GEN)])[0].text
    assert read_jsonl(tmp_path / "stats.jsonl")[0]["error"] is None


def test_a_template_that_cannot_take_a_video_fails_at_start(tmp_path):
    folder = text_only_template(tmp_path / "ckpt")
    for name in ("model.safetensors",):
        shutil.copy(DEMO_TARGET / name, folder / name)
    with pytest.raises(ValueError, match="renders a video part as 0 video tokens .* it cannot take a video"):
        make_model("LVSpecChat", folder, tmp_path / "stats.jsonl")


# ---- dry-run: template and visual tokens without weights ---------------------------------------------------

def dry_run(capsys, model_args: str, video: str | None = None) -> tuple[int, str]:
    from lvspec_eval.measure import dry_run as dr

    code = dr.run(argparse.Namespace(model_args=model_args, tasks=TASK, include_path=str(dr.TASKS_DIR), videos=1,
                                     video=video))
    return code, capsys.readouterr().out


def test_dry_run_counts_the_tokens_a_loaded_model_gets(synthvid, capsys, tmp_path):
    from lvspec_eval.backends.loading import load_backend
    from lvspec_eval.models.video import load_video

    folder = checkpoint_with_template_in(tmp_path / "ckpt", "chat_template.json")  # config files only
    video = docs(synthvid)[0]["video"]
    code, out = dry_run(capsys, f"pretrained={folder},method=vanilla,fps=4,video_rule=fps", video)
    assert code == 0, out
    line = next(l for l in out.splitlines() if "chat template pretrained=" in l)
    # the same prompt, through a backend with the demo's weights loaded
    backend = load_backend("demo")
    loaded = load_video(video, plan=backend.frame_plan(4.0, 512))
    inputs = backend.prepare("Describe the video.", [(loaded.frames, loaded.fps)])
    assert line.startswith("OK") and "renders a video" in line
    assert f"{inputs.num_visual_tokens} visual tokens, {inputs.input_ids.shape[1]} prompt tokens" in line


def test_dry_run_fails_on_a_template_that_cannot_take_a_video(capsys, tmp_path):
    folder = text_only_template(tmp_path / "ckpt")
    code, out = dry_run(capsys, f"pretrained={folder},method=vanilla")
    assert code == 1
    assert f"FAIL  chat template pretrained={folder}: pretrained={folder}: its chat template renders a video " \
           "part as 0 video tokens" in out


def test_dry_run_fails_on_a_checkpoint_without_any_template(capsys, tmp_path):
    folder = checkpoint_with_template_in(tmp_path / "ckpt", "nowhere")
    code, out = dry_run(capsys, f"pretrained={folder},method=vanilla")
    assert code == 1 and "no chat template (none in tokenizer_config.json, chat_template.jinja or " \
                         "chat_template.json)" in out


# ---- one preprocessing per request ---------------------------------------------------------------------------

@pytest.mark.parametrize("extra", [{}, {"method": "sd_tree", "paired_timing": "true", "tree_depth": 2}])
def test_frames_are_preprocessed_once_per_request(extra, tiny_model, synthvid, tmp_path, monkeypatch):
    from lvspec_eval.backends import qwen2_5_vl

    lm = make_model("LVSpecChat", tiny_model, tmp_path / "stats.jsonl", max_new_tokens=4, **extra)
    lm.task_dict = {TASK: {"test": docs(synthvid)[:2]}}
    calls = []
    original = qwen2_5_vl.preprocess_video
    monkeypatch.setattr(qwen2_5_vl, "preprocess_video", lambda *a, **k: calls.append(1) or original(*a, **k))
    lm.generate_until([chat_request(0, GEN), chat_request(1, GEN)])
    assert len(calls) == 2  # was 2 per request (context check + loop), 3 with paired timing
    assert "prepare" not in vars(lm.runner.target)  # the per-request shortcut is gone afterwards
    for record in read_jsonl(tmp_path / "stats.jsonl"):
        assert record["preprocess_s"] > 0  # charged to the sample although the loop reused the inputs
        # e2e_s is read off the clock (request to answer), so it covers every part and a little more
        parts = record["preprocess_s"] + record["prefill_s"] + record["draft_prepare_s"] + record["decode_s"]
        assert parts <= record["e2e_s"] < parts + 0.5
        assert record["draft_prepare_s"] == pytest.approx(record["prune_s"] + record["draft_vision_s"]
                                                          + record["draft_prefill_s"])


# ---- peak memory per sample ------------------------------------------------------------------------------------

def test_cpu_peak_memory_is_reset_per_sample():
    from lvspec_eval.decoding.stats import peak_memory_mb, reset_peak_memory

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("peak RSS can only be reset on Linux")
    cpu = torch.device("cpu")
    big = np.ones(400 * 2**20 // 8)  # 400 MiB, touched
    high = peak_memory_mb(cpu)
    del big
    reset_peak_memory([cpu])
    low = peak_memory_mb(cpu)
    assert high - low > 300, (high, low)  # the old ru_maxrss reading stayed at the run's maximum


def test_cuda_peak_memory_is_reset_and_summed_over_every_device(monkeypatch):
    from lvspec_eval.decoding import stats

    peaks = {"cuda:0": 3 * 2**20, "cuda:1": 5 * 2**20, "cuda:2": 7 * 2**20}
    resets = []
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda d: resets.append(str(d)))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: peaks[str(d)])
    devices = (torch.device("cuda:0"), torch.device("cuda:1"))  # a model spread over two GPUs
    stats.reset_peak_memory(devices)
    assert resets == ["cuda:0", "cuda:1"] and stats.peak_memory_mb(devices) == 8.0


def test_memory_devices_are_those_of_every_parameter_and_buffer():
    from lvspec_eval.decoding.stats import memory_devices

    first, second = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2, device="meta")  # "meta" stands in for a 2nd GPU
    second.register_buffer("table", torch.zeros(2, device="meta"))
    assert memory_devices(first, None, second) == (torch.device("cpu"), torch.device("meta"))


# ---- through the real lmms-eval CLI (slow) ---------------------------------------------------------------------

CLI_WITH_A_FAILING_DEVICE = """
import sys, torch
from lvspec_eval.decoding.runner import Runner
original, calls = Runner.generate, []
def generate(self, *args, **kwargs):
    calls.append(1)
    if len(calls) == 2:
        raise torch.AcceleratorError("CUDA error: device-side assert triggered")
    return original(self, *args, **kwargs)
Runner.generate = generate
from lmms_eval.__main__ import cli_evaluate
sys.argv = ["lmms-eval"] + sys.argv[1:]
cli_evaluate()
"""


def run_lmms_eval(tmp_path: Path, synthvid: Path, model_args: str, *extra: str, prefix=(str(LMMS_EVAL),)):
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           tasks_data.ENV_DIR: str(synthvid), tasks_data.ENV_DOCS: "3"}
    cmd = [*prefix, "--model", "lvspec", "--model_args", model_args, "--tasks", TASK, "--limit", "3",
           "--output_path", str(tmp_path / "out"), "--log_samples", *extra]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800, check=False)


@pytest.mark.slow
def test_cli_device_failure_writes_no_results(tiny_model, synthvid, tmp_path):
    stats = tmp_path / "stats.jsonl"
    args = f"pretrained={tiny_model},method=vanilla,fps=4,video_rule=fps,max_new_tokens=4,stats_path={stats}"
    proc = run_lmms_eval(tmp_path, synthvid, args, prefix=(sys.executable, "-c", CLI_WITH_A_FAILING_DEVICE))
    log = proc.stdout + proc.stderr
    assert not results_files(tmp_path), log[-3000:]
    (failed,) = [r for r in read_jsonl(stats) if r["error"]]
    assert failed["device_error"] is True
    assert f"task {TASK} doc {failed['doc_id']} failed on the device (AcceleratorError" in log
    assert len(read_jsonl(stats)) == 2  # the third sample was never run


# ---- scripts/gpu_check.py ---------------------------------------------------------------------------------------

def gpu_check_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", Path(__file__).parent.parent / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_verdict_rules():
    check = gpu_check_module()
    sound = {"method": "sd_tree", "failed": 0, "tau": 2.5, "divergence": {"near_tie": 2, "elsewhere": 0}}
    assert check.row_problems(sound, 40, 25) == []  # near-ties are numerics (bf16), not a problem
    assert check.row_problems({"method": "vanilla", "failed": 0, "tau": 0.0}, 0, 0) == []
    assert check.row_problems({**sound, "tau": 0.0}, 0, 0) == []  # the adaptive policy drafted nothing
    assert "a bug" in check.row_problems({**sound, "divergence": {"near_tie": 0, "elsewhere": 1}}, 40, 25)[0]
    assert "none of its 40 draft tokens was accepted" in check.row_problems({**sound, "tau": 0.0}, 40, 0)[0]
    assert "2 failed samples" in check.row_problems({**sound, "failed": 2}, 40, 25)[0]
    records = [{"num_draft_nodes": [4, 4], "accepted_lengths": [3, 0]}, {"num_draft_nodes": [2], "accepted_lengths": [1]}]
    assert check.drafted(records) == (10, 4)


@pytest.mark.slow
def test_gpu_check_runs_end_to_end_on_the_cpu(tmp_path):
    """The script a GPU user runs first, on the demo pair on the CPU: real lmms-eval runs and the report."""
    env = {**os.environ, tasks_data.ENV_DIR: str(tmp_path / "synthvid"), "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(Path(__file__).parent.parent / "scripts" / "gpu_check.py"), "--pretrained", "demo",
           "--draft", "demo-draft", "--methods", "sd_tree", "--limit", "1", "--dtype", "float32", "--device", "cpu",
           "--out", str(tmp_path / "out")]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = proc.stdout.split("peak MiB")[1]
    assert "vanilla " in table and "sd_tree " in table and "install is SOUND" in proc.stdout
    assert (tmp_path / "out" / "report" / "summary.json").exists()
