"""Data parallel for real: two processes appending to one stats file, and (slow) `torchrun
--nproc_per_node 2 -m lmms_eval --model lvspec` on CPU against a one-process run of the same command,
and such a run killed and rerun with --use_cache while another process holds the kernel budget."""
from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_plugin import LMMS_EVAL, TASK, build_tiny_model, read_jsonl
from test_records import hold_the_budget
from test_resume import cli_env, report_and_check, samples_by_doc

from lvspec_eval.demo import tasks_data
from lvspec_eval.models.stats_writer import StatsWriter

NUM_DOCS = 4
# the README's data-parallel command on a CPU (accelerate launch --cpu starts one process there)
CPU_LAUNCH = "torchrun --standalone --nproc_per_node 2 -m lmms_eval"


def _append(path: str, rank: int, count: int) -> None:
    writer = StatsWriter(path)
    for i in range(count):  # lines far larger than a pipe buffer or a BufferedWriter's 8 KiB
        writer.write({"rank": rank, "doc_id": i, "token_texts": [f"r{rank}d{i}"] * 4000})


def test_two_processes_append_whole_lines_to_one_stats_file(tmp_path):
    path = tmp_path / "stats.jsonl"
    context = multiprocessing.get_context("fork")  # the children only write lines
    workers = [context.Process(target=_append, args=(str(path), rank, 40)) for rank in range(2)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert [w.exitcode for w in workers] == [0, 0]
    raw = path.read_bytes()
    assert raw.endswith(b"\n")
    records = [json.loads(line) for line in raw.splitlines()]  # a torn or interleaved line would not parse
    assert sorted((r["rank"], r["doc_id"]) for r in records) == [(k, i) for k in range(2) for i in range(40)]
    assert all(set(r["token_texts"]) == {f"r{r['rank']}d{r['doc_id']}"} for r in records)


def test_the_readme_names_the_cpu_launcher_tested_here():
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    assert f"`{CPU_LAUNCH} --model lvspec" in " ".join(readme.split())  # the line may wrap


def lmms_eval_command(tmp_path: Path, out: str, stats: Path, launcher: list[str]) -> list[str]:
    args = f"pretrained={tmp_path / 'model'},method=sd_tree,tree=chain,tree_depth=2,fps=4,video_rule=fps,stats_path={stats}"
    return [*launcher, "--model", "lvspec", "--model_args", args, "--tasks", TASK, "--limit", str(NUM_DOCS),
            "--output_path", str(tmp_path / out), "--log_samples", "--verbosity", "DEBUG"]


@pytest.mark.slow
def test_torchrun_two_cpu_processes_answer_every_sample_once_as_one_process_does(tmp_path):
    build_tiny_model(tmp_path / "model")
    data = tmp_path / "synthvid"
    env = {**cli_env(data), tasks_data.ENV_DOCS: str(NUM_DOCS)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tasks_data.ENV_DOCS, str(NUM_DOCS))
        tasks_data.ensure(TASK, data)
    program, *args = CPU_LAUNCH.split()
    torchrun = [str(LMMS_EVAL.parent / program), *args]  # the README's command, from this environment
    runs = {"two": (tmp_path / "two.jsonl", torchrun), "one": (tmp_path / "one.jsonl", [sys.executable, "-m", "lmms_eval"])}
    procs = {name: subprocess.Popen(lmms_eval_command(tmp_path, name, stats, launcher), cwd=tmp_path, env=env,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, (stats, launcher) in runs.items()}  # side by side
    for name, proc in procs.items():
        log = proc.communicate(timeout=600)[0]
        assert list((tmp_path / name).rglob("*_results.json")), log[-3000:]

    raw = (tmp_path / "two.jsonl").read_bytes()
    assert raw.endswith(b"\n")
    records = [json.loads(line) for line in raw.splitlines()]  # no torn or interleaved line
    assert sorted(r["doc_id"] for r in records) == list(range(NUM_DOCS))  # one record per sample
    assert {r["rank"] for r in records} == {0, 1}  # both ranks decoded
    single = {r["doc_id"]: r for r in read_jsonl(tmp_path / "one.jsonl")}
    assert all(r["tokens"] == single[r["doc_id"]]["tokens"] and r["error"] is None for r in records)
    # lmms-eval gathered every answer once, equal to the one-process run's
    two, one = samples_by_doc(tmp_path / "two"), samples_by_doc(tmp_path / "one")
    assert sorted(two) == list(range(NUM_DOCS))
    assert {d: s["filtered_resps"] for d, s in two.items()} == {d: s["filtered_resps"] for d, s in one.items()}
    (results,) = (tmp_path / "two").rglob("*_results.json")
    assert json.loads(results.read_text())["throughput"]["avg_tau"] > 0  # rank 0's figures
    (row,) = report_and_check(tmp_path / "two", tmp_path / "report")["rows"]
    assert (row["n"], row["failed"], row["n_timed"]) == (NUM_DOCS, 0, NUM_DOCS)


# lmms-eval with the kernels' measurement replaced: a prepacked copy wins every shape (no timing taken),
# so a rank packs whatever its allowance lets it
PREPACK_WINS = """
import sys
from lvspec_eval.backends import linear_kernels as lk
lk.measure = lambda w, b, onednn: lk.ShapeCurve({m: 10.0 for m in lk.ROWS}, {m: 1.0 for m in lk.ROWS} if onednn else {})
from lmms_eval.__main__ import cli_evaluate
sys.argv = ["lmms-eval"] + sys.argv[1:]
cli_evaluate()
"""


def descendants(pid: int) -> list[int]:
    """The processes below `pid` (torchrun's ranks start their own sessions: no process group holds them)."""
    parents = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        parents[int(stat.parent.name)] = int(text[text.rindex(")") + 2:].split()[1])
    found, frontier = [], {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier}
        found += sorted(frontier)
    return found


def kill_tree_after(cmd: list[str], env: dict, cwd: Path, stats: Path, k: int) -> str:
    """Start `cmd`, SIGKILL it and every process below it (torchrun and its ranks) once `stats` holds k
    records; the log."""
    log = cwd / "killed.log"
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=f, stderr=subprocess.STDOUT)
        try:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and proc.poll() is None:
                if stats.exists() and stats.read_text().count("\n") >= k:
                    break
                time.sleep(0.01)
        finally:
            for pid in [*descendants(proc.pid), proc.pid]:  # the ranks first: the agent would restart them
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            proc.wait(timeout=60)
    return log.read_text()


@pytest.mark.slow
@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN: nothing is prepacked")
def test_a_killed_torchrun_run_resumes_with_its_ranks_while_another_process_holds_the_kernel_budget(tmp_path):
    """Issue 52: two CPU ranks share one kernel budget (the second packs what the first left), and the
    rerun finds another process holding all of it: every rank's kernel choices differ from its
    records', on the same machine, and the rerun is served from the records all the same."""
    build_tiny_model(tmp_path / "model")
    data, cache = tmp_path / "synthvid", tmp_path / "kernel-cache"
    env = {**cli_env(data), tasks_data.ENV_DOCS: str(NUM_DOCS), "LVSPEC_CACHE_DIR": str(cache)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tasks_data.ENV_DOCS, str(NUM_DOCS))
        tasks_data.ensure(TASK, data)
    script = tmp_path / "lmms_eval_prepack_wins.py"
    script.write_text(PREPACK_WINS)
    stats = tmp_path / "stats.jsonl"
    program, *args = CPU_LAUNCH.split()
    torchrun = [str(LMMS_EVAL.parent / program), *args[:-2], str(script)]  # the README's launcher, our script
    command = [*lmms_eval_command(tmp_path, "resumed", stats, torchrun), "--use_cache", str(tmp_path / "cache")]
    killed_log = kill_tree_after(command, env, tmp_path, stats, k=2)
    time.sleep(2)  # nothing of the killed run writes any more
    kept = stats.read_text()
    assert 2 <= kept.count("\n") < NUM_DOCS, killed_log[-3000:]
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"]) as other:
        try:
            hold_the_budget(other, cache)
            rerun = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600,
                                   check=False)
        finally:
            other.kill()
    log = rerun.stdout + rerun.stderr
    assert list((tmp_path / "resumed").rglob("*_results.json")), log[-3000:]
    assert stats.read_text().startswith(kept)  # the records made before the kill, as they were
    records = read_jsonl(stats)
    assert sorted(r["doc_id"] for r in records) == list(range(NUM_DOCS))  # each sample once: served, not redone
    served, decoded = records[:kept.count("\n")], records[kept.count("\n"):]
    assert all(r["load"]["packed_mb.pretrained"] for r in served)  # prepacked before the kill
    assert not any(r["load"]["packed_mb.pretrained"] for r in decoded)  # nothing fitted on the rerun
    assert sorted(samples_by_doc(tmp_path / "resumed")) == list(range(NUM_DOCS))
