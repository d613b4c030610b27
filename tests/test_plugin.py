"""The lmms-eval plugin: registry resolution, both model classes on a tiny random Qwen2.5-VL, per-sample
failures that leave the run going, and (slow) real lmms-eval CLI runs on the synthvid tasks."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lvspec_eval.demo import models as demo_models
from lvspec_eval.demo import tasks_data
from lvspec_eval.reporting.report import metric_names

ROOT = Path(__file__).resolve().parent.parent
TOKENIZER = ROOT / "lvspec_eval" / "demo" / "checkpoints" / "tokenizer"
LMMS_EVAL = Path(sys.executable).parent / "lmms-eval"
TASK = "synthvid_caption"


def build_tiny_model(out: Path) -> Path:
    """A random-weight Qwen2.5-VL with the demo target's shape, tokenizer and pixel budget."""
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    torch.manual_seed(0)
    model = Qwen2_5_VLForConditionalGeneration(demo_models.target_config(tokenizer)).eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 784, "max_pixels": 200704}))
    return out


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


@pytest.fixture(scope="module")
def synthvid(tmp_path_factory) -> Path:
    """Three docs per task in a private cache (the env is set for the CLI subprocesses too)."""
    root = tmp_path_factory.mktemp("synthvid")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tasks_data.ENV_DOCS, "3")
        for task in ("synthvid_caption", "synthvid_mcq"):
            tasks_data.ensure(task, root)
    return root


def docs(root: Path, task: str = TASK) -> list[dict]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tasks_data.ENV_DOCS, "3")
        return tasks_data.load_docs(task, root)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


# ---- registry ----------------------------------------------------------------------------------------

def test_manifest_names_both_classes():
    from lvspec_eval.lmms_plugin import manifests

    (manifest,) = manifests()
    assert manifest.model_id == "lvspec"
    assert manifest.chat_class_path == "lvspec_eval.models.lvspec.LVSpecChat"
    assert manifest.simple_class_path == "lvspec_eval.models.lvspec.LVSpecSimple"


def test_lmms_eval_resolves_lvspec_through_the_entry_point():
    from lmms_eval.models import get_model

    from lvspec_eval.models.lvspec import LVSpecChat, LVSpecSimple

    assert get_model("lvspec") is LVSpecChat and LVSpecChat.is_simple is False
    assert get_model("lvspec", force_simple=True) is LVSpecSimple and LVSpecSimple.is_simple is True


# ---- the classes, driven as lmms-eval drives them ------------------------------------------------------

def chat_request(doc_id: int, gen_kwargs: dict, task: str = TASK):
    from lmms_eval.api.instance import Instance

    def doc_to_messages(doc):
        return [{"role": "user", "content": [{"type": "video", "url": doc["video"]},
                                             {"type": "text", "text": doc["prompt"]}]}]

    args = ("", doc_to_messages, gen_kwargs, doc_id, task, "test")
    return Instance("generate_until", args, 0, {"task": task, "doc_id": doc_id, "repeats": 1})


def simple_request(doc_id: int, gen_kwargs: dict, prompt: str, task: str = TASK):
    from lmms_eval.api.instance import Instance

    args = (prompt, gen_kwargs, lambda doc: [doc["video"]], doc_id, task, "test")
    return Instance("generate_until", args, 0, {"task": task, "doc_id": doc_id, "repeats": 1})


def make_model(cls_name: str, tiny_model: Path, stats: Path, **extra):
    from lvspec_eval.models import lvspec

    defaults = {"pretrained": str(tiny_model), "method": "vanilla", "stats_path": str(stats), "fps": demo_models.FPS,
                "video_rule": "fps"}  # every frame of the synthvid videos: 64 visual tokens
    return getattr(lvspec, cls_name)(**{**defaults, **extra})


def with_bad_videos(tmp_path: Path, good: list[dict]) -> list[dict]:
    """The good docs, then one whose video is missing and one whose video is garbage."""
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"\x00garbage" * 100)
    return good + [{**good[0], "video": str(tmp_path / "missing.mp4")}, {**good[0], "video": str(corrupt)}]


GEN = {"max_new_tokens": 6, "temperature": 0, "until": ["<|im_end|>"]}


def test_chat_class_generates_and_records_every_sample(tiny_model, synthvid, tmp_path):
    lm = make_model("LVSpecChat", tiny_model, tmp_path / "stats.jsonl")
    lm.task_dict = {TASK: {"test": with_bad_videos(tmp_path, docs(synthvid)[:2])}}
    results = lm.generate_until([chat_request(i, GEN) for i in range(4)])
    assert str(lm.device) == "cpu" and (lm.rank, lm.world_size) == (0, 1)
    assert [r.text for r in results[2:]] == ["", ""]
    records = read_jsonl(tmp_path / "stats.jsonl")
    assert [r.token_counts.output_tokens for r in results] == [len(r["tokens"]) for r in records]
    assert results[0].token_counts.input_tokens == records[0]["prompt_tokens"] > 64  # 64 visual tokens + text
    assert [r["doc_id"] for r in records] == [0, 1, 2, 3]
    ok, missing, corrupt = records[0], records[2], records[3]
    assert ok["error"] is None and ok["task"] == TASK and ok["rank"] == 0 and ok["method"] == "vanilla"
    assert ok["text"] == results[0].text and len(ok["token_texts"]) == len(ok["tokens"]) == ok["num_new_tokens"]
    assert ok["replaced_texts"] == [None] * len(ok["tokens"])  # vanilla: no draft token is ever overruled
    assert ok["visual_tokens"] == 64 and "tau" in ok and "decode_s" in ok and ok["sampling_ignored"] is False
    assert "missing.mp4: no such file" in missing["error"] and missing["text"] == ""
    assert "corrupt.mp4" in corrupt["error"] and corrupt["tokens"] == []


def test_simple_class_matches_the_chat_class(tiny_model, synthvid, tmp_path):
    # until=task: both take the request as the task gives it. By default (until=class) each follows its
    # own lmms-eval class, and those differ on purpose (system prompt, frames; tests/test_parity.py).
    chat = make_model("LVSpecChat", tiny_model, tmp_path / "chat.jsonl", until="task")
    simple = make_model("LVSpecSimple", tiny_model, tmp_path / "simple.jsonl", until="task")
    good = docs(synthvid)[:2]
    chat.task_dict = simple.task_dict = {TASK: {"test": good}}
    chat_out = chat.generate_until([chat_request(i, GEN) for i in range(2)])
    simple_out = simple.generate_until([simple_request(i, GEN, good[i]["prompt"]) for i in range(2)])
    assert [r.text for r in chat_out] == [r.text for r in simple_out]
    assert [r["tokens"] for r in read_jsonl(tmp_path / "chat.jsonl")] == [
        r["tokens"] for r in read_jsonl(tmp_path / "simple.jsonl")]


def test_sampling_is_refused_loudly_and_decoded_greedily(tiny_model, synthvid, tmp_path):
    lm = make_model("LVSpecChat", tiny_model, tmp_path / "stats.jsonl")
    lm.task_dict = {TASK: {"test": docs(synthvid)[:1]}}
    greedy = lm.generate_until([chat_request(0, GEN)])
    sampled = lm.generate_until([chat_request(0, {**GEN, "temperature": 0.8})])
    assert greedy[0].text == sampled[0].text
    records = read_jsonl(tmp_path / "stats.jsonl")
    assert [r["sampling_ignored"] for r in records] == [False, True]
    assert records[1]["requested_temperature"] == 0.8


def test_a_prompt_longer_than_the_context_fails_that_sample_only(tiny_model, synthvid, tmp_path):
    lm = make_model("LVSpecChat", tiny_model, tmp_path / "stats.jsonl")
    lm.task_dict = {TASK: {"test": docs(synthvid)[:1]}}
    lm.runner.target.model.config.get_text_config().max_position_embeddings = 40  # < 64 visual tokens
    results = lm.generate_until([chat_request(0, GEN), chat_request(0, GEN)])
    assert [r.text for r in results] == ["", ""]
    (first, second) = read_jsonl(tmp_path / "stats.jsonl")
    assert "more than the model's context of 40" in first["error"] and second["error"] == first["error"]


def test_unsupported_request_types_say_so(tiny_model, tmp_path):
    lm = make_model("LVSpecSimple", tiny_model, tmp_path / "stats.jsonl")
    with pytest.raises(NotImplementedError, match="loglikelihood requests"):
        lm.loglikelihood([])
    with pytest.raises(NotImplementedError, match="generate_until_multi_round"):
        lm.generate_until_multi_round([])


def test_data_parallel_rank_on_cpu(tiny_model, synthvid, tmp_path, monkeypatch):
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    lm = make_model("LVSpecChat", tiny_model, tmp_path / "stats.jsonl", device="cpu")
    assert (lm.rank, lm.world_size, str(lm.device)) == (1, 2, "cpu")
    lm.task_dict = {TASK: {"test": docs(synthvid)[:1]}}
    lm.generate_until([chat_request(0, GEN)])
    assert read_jsonl(tmp_path / "stats.jsonl")[0]["rank"] == 1


def test_self_drafted_tree_decoding_passes_options_through(tiny_model, synthvid, tmp_path):
    vanilla = make_model("LVSpecChat", tiny_model, tmp_path / "v.jsonl")
    tree = make_model("LVSpecChat", tiny_model, tmp_path / "t.jsonl", method="sd_tree", tree_depth=3, tree_topk=2,
                      tree_total=6, paired_timing="true")
    vanilla.task_dict = tree.task_dict = {TASK: {"test": docs(synthvid)[:1]}}
    assert vanilla.generate_until([chat_request(0, GEN)])[0].text == tree.generate_until([chat_request(0, GEN)])[0].text
    record = read_jsonl(tmp_path / "t.jsonl")[0]
    assert record["method"] == "sd_tree" and record["num_steps"] >= 1
    assert record["vanilla_tokens"] == record["tokens"] and record["vanilla_decode_s"] > 0  # paired_timing
    # the draft token each of the target's step-closing tokens overruled, as ids and as text
    assert len(record["replaced"]) == len(record["replaced_texts"]) == len(record["tokens"])
    assert [t is None for t in record["replaced"]] == [t is None for t in record["replaced_texts"]]
    assert all(r is None for r, k in zip(record["replaced"], record["kinds"]) if k != "target")


# ---- lmms-eval CLI (slow) -------------------------------------------------------------------------------

def run_cli(tmp_path: Path, model_args: str, tasks: str, *extra: str, data_root: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           tasks_data.ENV_DIR: str(data_root), tasks_data.ENV_DOCS: "3"}
    cmd = [str(LMMS_EVAL), "--model", "lvspec", "--model_args", model_args, "--tasks", tasks,
           "--limit", "2", "--output_path", str(tmp_path / "out"),  # no --include_path: the plugin adds our tasks
           "--log_samples", "--verbosity", "DEBUG", *extra]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=3600,
                          check=False)


def results_files(tmp_path: Path) -> list[Path]:
    return sorted((tmp_path / "out").rglob("*_results.json"))


@pytest.mark.slow
def test_cli_run_writes_results_and_survives_a_corrupt_video(tiny_model, synthvid, tmp_path):
    synthvid = Path(shutil.copytree(synthvid, tmp_path / "synthvid"))  # a private copy: the module's stays whole
    (synthvid / TASK / "videos" / "00001.mp4").write_bytes(b"not a video")  # doc 1 fails; the run goes on
    stats = tmp_path / "stats.jsonl"
    proc = run_cli(tmp_path, f"pretrained={tiny_model},method=vanilla,fps=4,stats_path={stats}", f"{TASK},synthvid_mcq",
                   data_root=synthvid)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (results_path,) = results_files(tmp_path)
    results = json.loads(results_path.read_text())["results"]
    assert metric_names(results[TASK])[:4] == ("fidelity_f1", "fidelity_precision", "fidelity_recall",
                                               "visual_fact_accuracy")
    assert metric_names(results["synthvid_mcq"]) == ("accuracy",)
    assert len(list(results_path.parent.glob("*_samples_*.jsonl"))) == 2
    records = read_jsonl(stats)
    by_task = {(r["task"], r["doc_id"]): r for r in records}
    assert len(records) == 4 and set(by_task) == {(TASK, 0), (TASK, 1), ("synthvid_mcq", 0), ("synthvid_mcq", 1)}
    assert "00001.mp4" in by_task[(TASK, 1)]["error"] and by_task[(TASK, 0)]["error"] is None
    assert "failed, answering with an empty string" in proc.stdout + proc.stderr


@pytest.mark.slow
def test_cli_simple_interface(tiny_model, synthvid, tmp_path):
    stats = tmp_path / "stats.jsonl"
    proc = run_cli(tmp_path, f"pretrained={tiny_model},method=vanilla,fps=4,stats_path={stats}", "synthvid_mcq",
                   "--force_simple", data_root=synthvid)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert results_files(tmp_path) and len(read_jsonl(stats)) == 2


@pytest.mark.slow
def test_cli_bad_model_args_fail_at_start(synthvid, tmp_path):
    proc = run_cli(tmp_path, "pretrained=/no/such/model,method=vanilla", TASK, data_root=synthvid)
    assert proc.returncode != 0
    assert "pretrained='/no/such/model' looks like a local path but does not exist" in proc.stdout + proc.stderr
    assert not results_files(tmp_path)


def _qwen_folders(root: Path, build, target_args: tuple, draft_args: tuple) -> dict[str, Path]:
    """A tiny random target, a smaller draft (its own tower), and a Sparrow head trained for the
    target by `train-sparrow` on two short videos."""
    from test_sparrow_any_target import VIDEOS, _train, write_mp4

    target = build(root / "target", *target_args)
    draft = build(root / "draft", *draft_args)
    for seed, (name, frames, fps, height, width) in enumerate(VIDEOS[:2]):
        write_mp4(root / "videos" / name, frames, fps, height, width, seed)
    assert _train(str(target), root / "videos", root / "head") == 0
    return {"target": target, "draft": draft, "head": root / "head"}


@pytest.fixture(scope="module")
def qwen3_folders(tmp_path_factory) -> dict[str, Path]:
    """Qwen3-VL: the draft has its own DeepStack (after layer 1; the target's after layers 1-2)."""
    from conftest import build_qwen3_checkpoint

    return _qwen_folders(tmp_path_factory.mktemp("qwen3"), build_qwen3_checkpoint, (64, 3, 5, 2), (32, 2, 6, 1))


@pytest.fixture(scope="module")
def qwen3_5_folders(tmp_path_factory) -> dict[str, Path]:
    """Qwen3.5: target layers linear, full, linear, full; draft linear, full."""
    from conftest import build_qwen3_5_checkpoint

    return _qwen_folders(tmp_path_factory.mktemp("qwen3_5"), build_qwen3_5_checkpoint, (64, 4, 11), (32, 2, 12))


# Exact methods run a tree of width 2 (the adaptive default may settle on chains on a CPU).
WIDE = "tree=dynamic,tree_depth=3,tree_topk=2,tree_total=6"
QWEN3_METHOD_ARGS = {"vanilla": "", "sd_tree": "draft={draft}," + WIDE, "specvlm": WIDE,
                     "sparrow": "sparrow_head={head}," + WIDE, "fly": "draft={draft}", "lvspec": "draft={draft}"}
EXACT = ("sd_tree", "specvlm", "sparrow")


def _cli_every_method(folders: dict[str, Path], synthvid, tmp_path, method_args: dict[str, str]) -> dict:
    """Run `lmms-eval --model lvspec` once per method; the exact ones must equal vanilla."""
    tokens = {}
    for method, extra in method_args.items():
        out = tmp_path / method.replace(",", "_").replace("=", "_")
        out.mkdir()
        stats = out / "stats.jsonl"
        args = f"pretrained={folders['target']},method={method},stats_path={stats}"
        if extra:
            args += "," + extra.format(**folders)
        proc = run_cli(out, args, TASK, data_root=synthvid)
        assert proc.returncode == 0 and results_files(out), method + proc.stdout[-3000:] + proc.stderr[-3000:]
        records = read_jsonl(stats)
        assert len(records) == 2 and all(r["error"] is None for r in records), method
        tokens[method] = [r["tokens"] for r in records]
    return tokens


@pytest.mark.slow
def test_cli_runs_every_method_on_a_tiny_qwen3_vl(qwen3_folders, synthvid, tmp_path):
    """`lmms-eval --model lvspec --model_args pretrained=<tiny qwen3-vl>,method=M --tasks synthvid_caption
    --limit 2` for every method; the exact ones token-identical to vanilla."""
    tokens = _cli_every_method(qwen3_folders, synthvid, tmp_path, QWEN3_METHOD_ARGS)
    for method in EXACT:
        assert tokens[method] == tokens["vanilla"], method


@pytest.mark.slow
def test_cli_runs_every_method_on_a_tiny_qwen3_5(qwen3_5_folders, synthvid, tmp_path):
    """The same through lmms-eval on a tiny hybrid Qwen3.5 (Gated DeltaNet and full-attention layers):
    every method runs, the exact ones (trees of width 2, Self-SD included) token-identical to vanilla."""
    args = {**QWEN3_METHOD_ARGS, "sd_tree,draft=self": WIDE}
    tokens = _cli_every_method(qwen3_5_folders, synthvid, tmp_path, args)
    for method in (*EXACT, "sd_tree,draft=self"):
        assert tokens[method] == tokens["vanilla"], method
