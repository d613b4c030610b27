"""`lvspec-eval demo`: every method through lmms-eval on the demo world, then the leaderboard.

Each method is a real lmms-eval run (the registered `lvspec` model, the synthvid tasks, results
and per-sample logs written by lmms-eval itself), all in this one process, back to back. Runs one
after another see different CPU states (slow spells of 1.5x were seen), so every method but
vanilla also decodes each request with vanilla, beside it (model_arg paired_timing=true), and the
report's speedups come from those same-moment pairs (`--unpaired` turns this off: faster, noisier).
lmms-eval exits 0 even when a run fails, so each run's results file is checked before the report
is built.

Everything goes to `--out`: by default DEFAULT_OUT (runs/demo, ignored by git, so a demo leaves the
checkout clean). The committed reference report in REFERENCE_OUT (results/demo) is rewritten only
when asked: `lvspec-eval demo --out results/demo` (`make demo-reference`).

Main stage: `--methods` on DEMO_TASKS (the trained length, 8 frames = 64 visual tokens), `--limit`
samples per task, one run per method in <out>/runs/<method>.
Length stage (for the report's speedup-vs-visual-tokens curve): `--length-methods` (vanilla
always among them, as the baseline; "" skips the stage) on LENGTH_TASKS, synthvid_caption at
32 / 128 / 256 / 512 frames (256 / 1,024 / 2,048 / 4,096 visual tokens), `--length-limit`
samples per task, one run per method in <out>/runs/<method>_lengths. The report pairs each row with
vanilla's run of the same task, so length rows compare with vanilla's length run; they are
listed after the trained-length rows (report.py's length_tasks). The demo models were trained on
8-frame clips only and fail on long videos, so speedups under 1 at long lengths are expected.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import time
from pathlib import Path
from unittest import mock

DEFAULT_OUT = Path("runs/demo")
REFERENCE_OUT = Path("results/demo")
DEMO_METHODS = ("vanilla", "sd_tree", "specvlm", "sparrow", "fly", "lvspec")
DEMO_TASKS = ("synthvid_caption", "synthvid_mcq")
LENGTH_METHODS = ("vanilla", "sd_tree", "specvlm", "sparrow", "fly", "lvspec")
LENGTH_TASKS = ("synthvid_caption_f32", "synthvid_caption_f128", "synthvid_caption_long", "synthvid_caption_f512")


def available_methods(requested: tuple[str, ...]) -> list[str]:
    """The requested methods whose drafter and verifier exist in this build."""
    from ..decoding import methods

    out = []
    for name in requested:
        spec = methods.METHODS[name]
        if spec.drafter in methods.DRAFTERS and spec.verifier in methods.VERIFIERS:
            out.append(name)
    return out


def results_files(run_dir: Path) -> list[Path]:
    return sorted(run_dir.rglob("*_results.json"))


def run_lmms_eval(method: str, run_dir: Path, tasks: tuple[str, ...], limit: int, extra_args: str = "",
                  draft: str = "demo-draft") -> Path:
    """One real lmms-eval CLI run, in-process; returns its results file or raises. The synthvid
    tasks need no --include_path: the plugin registers the package's task folder."""
    from lmms_eval.__main__ import cli_evaluate

    # A rerun replaces the method's previous run (results, samples, stats): the report reads one.
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    stats = run_dir / "stats.jsonl"
    model_args = f"pretrained=demo,draft={draft},method={method},stats_path={stats}" + (
        f",{extra_args}" if extra_args else "")
    argv = ["lmms-eval", "--model", "lvspec", "--model_args", model_args, "--tasks", ",".join(tasks),
            "--limit", str(limit), "--output_path", str(run_dir),
            "--log_samples", "--verbosity", "INFO"]
    with mock.patch.object(sys, "argv", argv):
        cli_evaluate()
    new = results_files(run_dir)
    if not new:
        raise RuntimeError(f"lmms-eval wrote no results for method {method!r} in {run_dir}; see the log above")
    strip_install_root(new[-1])
    return new[-1]


def strip_install_root(results_file: Path) -> None:
    """lmms-eval records each task's config, with the absolute path of our tasks' data files: make
    those paths relative to the folder the package is installed in, so a results file names no
    folder of the machine it ran on (results/demo is committed as the reference report)."""
    root = str(Path(__file__).resolve().parents[2]) + os.sep
    text = results_file.read_text()
    if root in text:
        results_file.write_text(text.replace(root, ""))


def length_methods(value: str) -> list[str]:
    """--length-methods: "" -> none; else the available ones, vanilla (the baseline) first."""
    names = [m for m in value.split(",") if m]
    return available_methods(tuple(dict.fromkeys(["vanilla", *names]))) if names else []


def timing_args(method: str, paired: bool) -> str:
    return "paired_timing=true" if paired and method != "vanilla" else ""


def run_demo(out: Path, methods: list[str], limit: int, threads: int, lengths: tuple[str, ...] | list[str] = (),
             length_limit: int = 4, draft: str = "demo-draft", paired: bool = True) -> dict:
    """The main runs, then the length runs of `lengths` (if any), then the report."""
    import torch

    from ..reporting import report

    torch.set_num_threads(threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    run_dirs = []
    for method in methods:
        t0 = time.time()
        run_lmms_eval(method, out / "runs" / method, DEMO_TASKS, limit, timing_args(method, paired), draft=draft)
        print(f"[demo] {method}: lmms-eval run done in {time.time() - t0:.0f} s", flush=True)
        run_dirs.append(out / "runs" / method)
    t_lengths = time.time()
    for method in lengths:
        t0 = time.time()
        run_lmms_eval(method, out / "runs" / f"{method}_lengths", LENGTH_TASKS, length_limit,
                      timing_args(method, paired), draft=draft)
        print(f"[demo] {method}: length run ({', '.join(LENGTH_TASKS)}) done in {time.time() - t0:.0f} s", flush=True)
        run_dirs.append(out / "runs" / f"{method}_lengths")
    if lengths:
        print(f"[demo] length stage: {len(lengths)} methods in {time.time() - t_lengths:.0f} s", flush=True)
    return report.build_report(run_dirs, out, echo=True, length_tasks=LENGTH_TASKS if lengths else ())


def _main(args: argparse.Namespace) -> int:
    requested = tuple(args.methods.split(",")) if args.methods else DEMO_METHODS
    methods = available_methods(requested)
    lengths = length_methods(args.length_methods)
    t0 = time.time()
    run_demo(Path(args.out), methods, args.limit, args.threads, lengths, args.length_limit, args.draft,
             paired=not args.unpaired)
    stages = f"{len(methods)} methods" + (f" + {len(lengths)} length runs" if lengths else "")
    print(f"[demo] {stages} in {time.time() - t0:.0f} s; report in {args.out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("demo", help="run every method through lmms-eval on the demo world and report")
    p.add_argument("--out", default=str(DEFAULT_OUT),
                   help=f"where runs, summary.json and the leaderboard go (default {DEFAULT_OUT}, ignored by git; "
                        f"{REFERENCE_OUT} holds the committed reference report: `--out {REFERENCE_OUT}` refreshes it)")
    p.add_argument("--methods", default="", help=f"comma-separated methods (default {', '.join(DEMO_METHODS)}; also sage, std)")
    p.add_argument("--limit", type=int, default=20, help="samples per task")
    p.add_argument("--draft", default="demo-draft",
                   help="the model drafters' draft: demo-draft (distilled on the target) or demo-draft-restyled "
                        "(the same draft fine-tuned on another phrasing style), or a folder")
    p.add_argument("--length-methods", default=",".join(LENGTH_METHODS),
                   help="methods also run on the synthvid caption task at 256 to 4,096 visual tokens for the "
                        "speedup-vs-visual-tokens plot (vanilla always added; '' skips this stage)")
    p.add_argument("--length-limit", type=int, default=4, help="samples per length task (each has 4 videos)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--unpaired", action="store_true",
                   help="time each method against vanilla's own run only (faster; noisier on a shared machine) "
                        "instead of decoding vanilla beside every request")
    p.set_defaults(func=_main)
