"""Resuming a killed run (lmms-eval --use_cache with stats_path, models/resume.py), lmms-eval's
throughput fields, and bad inputs on long runs: unit tests on the model class, then (slow) a real
`lmms-eval --model lvspec` run killed with SIGKILL after some samples and rerun."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from test_plugin import GEN, TASK, chat_request, docs, make_model, read_jsonl

from lvspec_eval.demo import tasks_data
from lvspec_eval.models import lvspec
from lvspec_eval.models.resume import ResumeMismatch
from lvspec_eval.models.stats_writer import StatsWriter

from test_failures import synthvid, tiny_model  # noqa: F401  (the same module fixtures: a tiny model, 3 docs)


def through_response_cache(lm, requests, cache_dir: Path):
    """What lmms-eval does with --use_cache: its ResponseCache calls the model on its misses."""
    from lmms_eval.caching.response_cache import ResponseCache

    cache = ResponseCache.create(str(cache_dir), model="lvspec", model_args="x", task_dict={})
    try:
        return cache.execute(lm, "generate_until", requests)
    finally:
        cache.close()


def counting_generate(lm) -> list[int]:
    """Count the runner's decodes (a served sample is not decoded)."""
    original, calls = lm.runner.generate, []

    def generate(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    lm.runner.generate = generate
    return calls


# ---- resume, unit ---------------------------------------------------------------------------------------

def test_a_rerun_serves_completed_samples_from_their_records_and_decodes_the_rest(tiny_model, synthvid, tmp_path):
    stats = tmp_path / "stats.jsonl"
    first = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4)
    first.task_dict = {TASK: {"test": docs(synthvid)}}
    first.generate_until([chat_request(i, GEN) for i in range(2)])  # killed after two samples
    before = stats.read_text()

    again = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4)  # built outside simple_evaluate
    again.task_dict = first.task_dict
    decodes = counting_generate(again)
    results = through_response_cache(again, [chat_request(i, GEN) for i in range(3)], tmp_path / "cache")
    assert len(decodes) == 1  # doc 2 only
    assert stats.read_text().startswith(before)  # the records of the first run are kept as they were
    records = read_jsonl(stats)
    assert [r["doc_id"] for r in records] == [0, 1, 2]
    assert [r.text for r in results] == [r["text"] for r in records]
    assert [r.token_counts.output_tokens for r in results] == [len(r["tokens"]) for r in records]
    assert records[0]["settings"] == records[2]["settings"] and records[0]["settings"]["method"] == "vanilla"


def answered_first(tiny_model, synthvid, stats):
    """A model writing to `stats` that has answered doc 0 (the run a rerun resumes from)."""
    first = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4)
    first.task_dict = {TASK: {"test": docs(synthvid)}}
    first.generate_until([chat_request(0, GEN)])
    return first


@pytest.mark.parametrize("change, named", [
    ({"method": "sd_tree"}, "method='vanilla' there, 'sd_tree' now"),
    ({"tree_depth": 2}, "options.tree_depth=None there, 2 now"),
    ({"dtype": "bfloat16"}, "dtype='float32' there, 'bfloat16' now"),
])
def test_a_record_from_other_settings_is_never_reused(change, named, tiny_model, synthvid, tmp_path):
    stats = tmp_path / "stats.jsonl"
    first = answered_first(tiny_model, synthvid, stats)
    other = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4, **change)
    other.task_dict = first.task_dict
    with pytest.raises(ResumeMismatch, match=f"made under other settings: .*{named}"):
        through_response_cache(other, [chat_request(0, GEN)], tmp_path / "cache")


def test_a_record_of_another_checkpoint_is_never_reused(tiny_model, synthvid, tmp_path):
    from test_plugin import build_tiny_model

    stats = tmp_path / "stats.jsonl"
    first = answered_first(tiny_model, synthvid, stats)
    retrained = build_tiny_model(tmp_path / "retrained")  # same shape and config, other weights
    torch.manual_seed(1)
    from safetensors.torch import load_file, save_file

    weights = load_file(retrained / "model.safetensors")
    save_file({k: torch.randn_like(v) for k, v in weights.items()}, retrained / "model.safetensors")
    other = make_model("LVSpecChat", retrained, stats, max_new_tokens=4)
    other.task_dict = first.task_dict
    with pytest.raises(ResumeMismatch, match="weights.pretrained="):
        through_response_cache(other, [chat_request(0, GEN)], tmp_path / "cache")


def test_a_record_for_another_request_is_never_reused(tiny_model, synthvid, tmp_path):
    stats = tmp_path / "stats.jsonl"
    first = answered_first(tiny_model, synthvid, stats)
    again = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4)
    again.task_dict = first.task_dict
    with pytest.raises(ResumeMismatch, match="task synthvid_caption doc 0 was answered for another request"):
        through_response_cache(again, [chat_request(0, {**GEN, "max_new_tokens": 5})], tmp_path / "cache")


def test_a_torn_last_line_is_cut_before_appending(tmp_path):
    stats = tmp_path / "stats.jsonl"
    stats.write_text('{"doc_id": 0}\n{"doc_id": 1, "tex')  # a writer killed in the middle of a line
    writer = StatsWriter(stats)
    assert stats.read_text() == '{"doc_id": 0}\n'
    writer.write({"doc_id": 1})
    assert read_jsonl(stats) == [{"doc_id": 0}, {"doc_id": 1}]


SEPARATORS = "line\u2028para\u2029next\x85end"  # json.dumps(ensure_ascii=False) leaves them raw; splitlines splits


def _answers_with_separators(stats: Path) -> list[str]:
    """Rewrite every record's answer to hold U+2028, U+2029 and U+0085, as the writer would write them."""
    records = [json.loads(line) for line in stats.read_text(encoding="utf-8").split("\n") if line]
    texts = [f"{SEPARATORS} {k}" for k in range(len(records))]
    stats.write_text("".join(json.dumps({**r, "text": t}, ensure_ascii=False) + "\n" for r, t in zip(records, texts)),
                     encoding="utf-8")
    assert len(stats.read_text(encoding="utf-8").splitlines()) > len(records)  # what used to break resume
    return texts


def test_answers_holding_unicode_line_separators_resume_and_report(tiny_model, synthvid, tmp_path):
    from lvspec_eval.reporting import runs

    stats = tmp_path / "stats.jsonl"
    first = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4)
    first.task_dict = {TASK: {"test": docs(synthvid)}}
    first.generate_until([chat_request(i, GEN) for i in range(2)])
    texts = _answers_with_separators(stats)
    again = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4)
    again.task_dict = first.task_dict
    decodes = counting_generate(again)
    results = through_response_cache(again, [chat_request(i, GEN) for i in range(3)], tmp_path / "cache")
    assert len(decodes) == 1 and [r.text for r in results[:2]] == texts
    loaded = runs.load_stats([stats], "vanilla")[TASK]  # the report reads the same file
    assert [loaded[str(i)]["text"] for i in range(2)] == texts and len(loaded) == 3


def test_the_judge_annotates_samples_whose_answers_hold_line_separators(tmp_path):
    from judges.cli import annotate_samples

    samples = tmp_path / "samples.jsonl"
    lines = [{"doc_id": k, "filtered_resps": [f"{SEPARATORS} {k}"]} for k in range(2)]
    samples.write_text("".join(json.dumps(x, ensure_ascii=False) + "\n" for x in lines), encoding="utf-8")
    annotate_samples(samples, [{"key": "t/1", "score": 4.0, "errors": []}], "caption", "m")
    out = [json.loads(line) for line in samples.read_text(encoding="utf-8").split("\n") if line]
    assert [x["filtered_resps"] for x in out] == [x["filtered_resps"] for x in lines]
    assert "judge_caption" not in out[0] and out[1]["judge_caption"]["score"] == 4.0


def test_resume_reads_under_the_writers_lock_and_skips_a_line_being_written(tmp_path):
    """Another rank appending a record holds the exclusive lock: resume waits for the whole line
    instead of reading half of it; a last line without its newline (a killed writer's) is not read."""
    from lvspec_eval.models.resume import read_records

    stats = tmp_path / "stats.jsonl"
    writer = StatsWriter(stats)
    writer.write({"doc_id": 0, "text": SEPARATORS})
    line = (json.dumps({"doc_id": 1, "text": "x" * 100_000}) + "\n").encode()
    read, holding = [], threading.Event()

    def append_slowly():
        with writer.locked() as fd:
            os.write(fd, line[:1000])
            holding.set()
            time.sleep(0.5)  # the reader must wait for the rest, not parse the first 1,000 bytes
            os.write(fd, line[1000:])

    appender = threading.Thread(target=append_slowly)
    appender.start()
    holding.wait(10)
    reader = threading.Thread(target=lambda: read.extend(read_records(stats)))
    reader.start()
    appender.join()
    reader.join(30)
    assert [r["doc_id"] for _, r in read] == [0, 1] and read[0][1]["text"] == SEPARATORS
    with stats.open("a") as f:
        f.write('{"doc_id": 2, "te')  # a writer killed mid-line
    assert [r["doc_id"] for _, r in read_records(stats)] == [0, 1]


def test_failed_samples_are_served_again_not_retried(tiny_model, synthvid, tmp_path, monkeypatch):
    """A corrupt video, a doc function that raises, and an out-of-memory sample (on_device_error=skip)
    each fail alone; a resumed run serves their empty answers and keeps their error records."""
    stats = tmp_path / "stats.jsonl"
    good = docs(synthvid)
    corrupt = tmp_path / "corrupt.mp4"
    corrupt.write_bytes(b"\x00garbage" * 100)
    large = tmp_path / "large.mp4"  # runs out of device memory the first time
    large.write_bytes(Path(good[0]["video"]).read_bytes())
    task_docs = [good[0], {**good[1], "video": str(corrupt)}, {**good[2], "video": "raise"},
                 {**good[0], "video": str(large)}]
    original_load = lvspec.load_video

    def load_video(path, plan):
        if path == str(large) and load_video.oom_left:
            load_video.oom_left -= 1
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return original_load(path, plan=plan)

    load_video.oom_left = 0
    monkeypatch.setattr(lvspec, "load_video", load_video)

    def doc_to_messages(doc):
        if doc["video"] == "raise":
            raise KeyError("scene")
        return [{"role": "user", "content": [{"type": "video", "url": doc["video"]}, {"type": "text", "text": "x"}]}]

    def requests():
        return [chat_request(i, GEN) for i in range(4)]

    def run(first: bool):
        lm = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4, on_device_error="skip")
        lm.task_dict = {TASK: {"test": task_docs}}
        for r in (reqs := requests()):
            r.arguments = (r.args[0], doc_to_messages, *r.args[2:])
        load_video.oom_left = 1 if first else 0  # a retry of the out-of-memory sample would now succeed
        decodes = counting_generate(lm)
        return decodes, (lm.generate_until(reqs) if first else through_response_cache(lm, reqs, tmp_path / "cache"))

    _, results = run(first=True)
    assert [bool(r.text) for r in results] == [True, False, False, False]
    records = read_jsonl(stats)
    assert "corrupt.mp4" in records[1]["error"] and not records[1]["device_error"]
    assert "doc_to_messages raised KeyError" in records[2]["error"]
    assert records[3]["device_error"] is True and "out of memory" in records[3]["error"]
    decodes, again = run(first=False)
    assert [r.text for r in again] == [r.text for r in results] and not decodes
    assert read_jsonl(stats) == records  # nothing retried, nothing added


def test_the_sample_a_device_failure_stopped_the_run_on_is_decoded_again(tiny_model, synthvid, tmp_path):
    from lvspec_eval.reporting.runs import load_stats

    stats = tmp_path / "stats.jsonl"
    first = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4)  # on_device_error=abort
    first.task_dict = {TASK: {"test": docs(synthvid)}}
    original = first.runner.generate

    def generate(*args, **kwargs):
        if generate.calls == 1:
            raise torch.AcceleratorError("CUDA error: device-side assert triggered")
        generate.calls += 1
        return original(*args, **kwargs)

    generate.calls = 0
    first.runner.generate = generate
    with pytest.raises(lvspec.DeviceFailure, match="doc 1 failed on the device"):
        first.generate_until([chat_request(i, GEN) for i in range(3)])
    again = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4)
    again.task_dict = first.task_dict
    decodes = counting_generate(again)
    results = through_response_cache(again, [chat_request(i, GEN) for i in range(3)], tmp_path / "cache")
    assert len(decodes) == 2 and all(r.text for r in results)  # docs 1 and 2
    records = read_jsonl(stats)
    assert [(r["doc_id"], r.get("stopped_run", False)) for r in records] == [(0, False), (1, True), (1, False), (2, False)]
    assert {d: r["error"] for d, r in load_stats([stats], "vanilla")[TASK].items()} == {"0": None, "1": None, "2": None}


def test_a_doc_to_visual_that_raises_fails_that_sample_alone(tiny_model, synthvid, tmp_path):
    from lmms_eval.api.instance import Instance

    def doc_to_visual(doc):
        if doc["video"] == "raise":
            raise FileNotFoundError("annotations/scene_7.json")
        return [doc["video"]]

    lm = make_model("LVSpecSimple", tiny_model, tmp_path / "stats.jsonl", max_new_tokens=4)
    good = docs(synthvid)[0]
    lm.task_dict = {TASK: {"test": [{**good, "video": "raise"}, good]}}
    requests = [Instance("generate_until", ("x", GEN, doc_to_visual, i, TASK, "test"), 0,
                         {"task": TASK, "doc_id": i, "repeats": 1}) for i in range(2)]
    results = lm.generate_until(requests)
    assert results[0].text == "" and results[1].text
    failed, ok = read_jsonl(tmp_path / "stats.jsonl")
    assert failed["error"] == "TaskFunctionError: the task's doc_to_visual raised FileNotFoundError: annotations/scene_7.json"
    assert ok["error"] is None and failed["device_error"] is False


# ---- lmms-eval's throughput fields, unit -----------------------------------------------------------------

def test_each_call_logs_lmms_eval_throughput_with_our_figures(tiny_model, synthvid, tmp_path):
    from lmms_eval.models.model_utils.gen_metrics import (
        get_logged_metrics_history,
        reset_logged_metrics,
        summarize_logged_metrics,
    )

    lm = make_model("LVSpecChat", tiny_model, tmp_path / "stats.jsonl", method="sd_tree", tree="chain",
                    tree_depth=2, max_new_tokens=4)
    lm.task_dict = {TASK: {"test": docs(synthvid)}}
    reset_logged_metrics()
    lm.generate_until([chat_request(i, GEN) for i in range(2)])
    (logged,) = get_logged_metrics_history()
    records = read_jsonl(tmp_path / "stats.jsonl")
    assert logged["total_gen_tokens"] == sum(r["num_new_tokens"] for r in records)
    assert logged["total_elapsed_time"] == pytest.approx(sum(r["e2e_s"] for r in records))
    assert logged["avg_speed"] == pytest.approx(logged["total_gen_tokens"] / logged["total_elapsed_time"])
    steps = sum(r["num_steps"] for r in records)
    assert logged["tau"] == pytest.approx(sum(sum(r["accepted_lengths"]) for r in records) / steps)
    assert 0 < logged["draft_share"] < 1 and logged["method"] == "sd_tree" and logged["total_requests"] == 2
    summary = summarize_logged_metrics()
    assert summary["avg_tau"] == logged["tau"] and summary["avg_latency"] > 0


# ---- a real lmms-eval run, killed and resumed (slow) -----------------------------------------------------

# The run's bad inputs, made inside the real CLI process: doc 2's task function raises, and doc 3's video
# load runs out of device memory (on_device_error=skip). Doc 1's video file is corrupt on disk.
CLI_WITH_BAD_DOCS = """
import sys, torch
from lvspec_eval.models import lvspec
original_call, original_load = lvspec.call_task_function, lvspec.load_video
def call_task_function(fn, doc):
    def task_function(d):
        if d["video"].endswith("00002.mp4"):
            raise KeyError("scene")
        return fn(d)
    task_function.__name__ = fn.__name__
    return original_call(task_function, doc)
def load_video(path, plan):
    if path.endswith("00003.mp4"):
        print("LOADING 00003", file=sys.stderr)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB")
    return original_load(path, plan=plan)
lvspec.call_task_function, lvspec.load_video = call_task_function, load_video
from lmms_eval.__main__ import cli_evaluate
sys.argv = ["lmms-eval"] + sys.argv[1:]
cli_evaluate()
"""
NUM_DOCS = 6


def cli(tmp_path: Path, out: str, data: Path, stats: Path, *extra: str) -> list[str]:
    args = (f"pretrained={tmp_path / 'model'},method=sd_tree,tree=chain,tree_depth=2,fps=4,video_rule=fps,"
            f"on_device_error=skip,stats_path={stats}")
    return [sys.executable, "-c", CLI_WITH_BAD_DOCS, "--model", "lvspec", "--model_args", args, "--tasks", TASK,
            "--limit", str(NUM_DOCS), "--output_path", str(tmp_path / out), "--log_samples", "--verbosity", "DEBUG",
            *extra]


def cli_env(data: Path) -> dict:
    return {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
            tasks_data.ENV_DIR: str(data), tasks_data.ENV_DOCS: str(NUM_DOCS)}


def samples_by_doc(out: Path) -> dict[int, dict]:
    (path,) = out.rglob(f"*_samples_{TASK}.jsonl")
    return {s["doc_id"]: s for s in read_jsonl(path)}


def kill_after(cmd: list[str], env: dict, cwd: Path, stats: Path, k: int) -> str:
    """Start the run, SIGKILL it once `stats` holds k records; its log."""
    log = cwd / "killed.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if stats.exists() and stats.read_text().count("\n") >= k:
                proc.send_signal(signal.SIGKILL)
                break
            time.sleep(0.01)
        proc.wait(timeout=60)
    return log.read_text()


@pytest.mark.slow
def test_a_killed_run_resumes_with_use_cache_and_equals_an_uninterrupted_run(tmp_path):
    from test_plugin import build_tiny_model

    build_tiny_model(tmp_path / "model")
    data = tmp_path / "synthvid"
    env = cli_env(data)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tasks_data.ENV_DOCS, str(NUM_DOCS))
        tasks_data.ensure(TASK, data)
    (data / TASK / "videos" / "00001.mp4").write_bytes(b"not a video")

    whole_stats = tmp_path / "whole.jsonl"  # the uninterrupted run, beside the one to be killed
    whole = subprocess.Popen(cli(tmp_path, "whole", data, whole_stats), cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    stats, cache = tmp_path / "stats.jsonl", str(tmp_path / "cache")
    command = cli(tmp_path, "resumed", data, stats, "--use_cache", cache)
    killed_log = kill_after(command, env, tmp_path, stats, k=2)
    whole_log = whole.communicate(timeout=600)[0]
    assert list((tmp_path / "whole").rglob("*_results.json")), whole_log[-3000:]
    kept = stats.read_text()
    assert 2 <= kept.count("\n") < NUM_DOCS and not list((tmp_path / "resumed").rglob("*_results.json")), killed_log
    resumed = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False)
    log = resumed.stdout + resumed.stderr
    (results_path,) = (tmp_path / "resumed").rglob("*_results.json")

    assert stats.read_text().startswith(kept)  # the records made before the kill, as they were
    records, reference = read_jsonl(stats), read_jsonl(whole_stats)
    assert sorted(r["doc_id"] for r in records) == list(range(NUM_DOCS))  # once per sample
    by_doc = {r["doc_id"]: r for r in records}
    for ref in reference:
        mine = by_doc[ref["doc_id"]]
        assert (mine["tokens"], mine["text"], mine["error"]) == (ref["tokens"], ref["text"], ref["error"])
        assert ("decode_s" in mine) == (ref["error"] is None)  # timings once per decoded sample
    assert [by_doc[d]["error"] is not None for d in range(NUM_DOCS)] == [False, True, True, True, False, False]
    assert by_doc[3]["device_error"] is True and "doc_to_messages raised KeyError" in by_doc[2]["error"]
    # what lmms-eval scored: the same answers, each doc once
    resumed_samples, whole_samples = samples_by_doc(tmp_path / "resumed"), samples_by_doc(tmp_path / "whole")
    answers = lambda samples: {d: (s["filtered_resps"], s["token_counts"]) for d, s in samples.items()}
    assert answers(resumed_samples) == answers(whole_samples)
    # served samples were not decoded again: a failure before the kill is not retried
    served = [json.loads(line)["doc_id"] for line in kept.splitlines()]
    assert log.count("LOADING 00003") == (0 if 3 in served else 1)
    for doc in served:
        assert f"doc {doc} failed" not in log
    # lmms-eval's throughput fields, with our figures
    (whole_results,) = (tmp_path / "whole").rglob("*_results.json")
    whole_throughput = json.loads(whole_results.read_text())["throughput"]
    decoded = [r for r in reference if r["error"] is None]
    assert whole_throughput["total_gen_tokens"] == sum(r["num_new_tokens"] for r in decoded)
    assert whole_throughput["total_elapsed_time"] == pytest.approx(sum(r["e2e_s"] for r in decoded))
    assert whole_throughput["avg_speed"] > 0 and whole_throughput["avg_failed"] == 3
    assert 0 < whole_throughput["avg_draft_share"] < 1 and whole_throughput["avg_latency"] > 0
    throughput = json.loads(results_path.read_text())["throughput"]
    assert throughput["total_gen_tokens"] == sum(by_doc[d]["num_new_tokens"] for d in by_doc if d not in served)
    assert throughput["avg_served_from_stats"] == len(served) and throughput["avg_tau"] > 0
    # the report and check read the union, each sample once
    summary = report_and_check(tmp_path / "resumed", tmp_path / "report")
    (row,) = summary["rows"]
    assert (row["n"], row["failed"], row["n_timed"]) == (NUM_DOCS, 3, 3)


def report_and_check(run: Path, out: Path) -> dict:
    """`lvspec-eval report` (the run is its own baseline) then `lvspec-eval check` of its summary."""
    from lvspec_eval.cli import main

    assert main(["report", str(run), "-o", str(out), "--baseline", "sd_tree", "--no-plots"]) == 0
    assert main(["check", str(out / "summary.json")]) == 0
    return json.loads((out / "summary.json").read_text())
