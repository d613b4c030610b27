"""Run this first on a GPU machine: is the install sound for your checkpoint?

    python scripts/gpu_check.py --pretrained Qwen/Qwen2.5-VL-7B-Instruct                # Self-SD
    python scripts/gpu_check.py --pretrained Qwen/Qwen2.5-VL-32B-Instruct \
        --draft Qwen/Qwen2.5-VL-7B-Instruct --device_map auto --attn flash_attention_2
    python scripts/gpu_check.py --pretrained Qwen/Qwen3-VL-8B-Instruct --draft Qwen/Qwen3-VL-2B-Instruct
    python scripts/gpu_check.py --pretrained Qwen/Qwen3.5-27B --draft Qwen/Qwen3.5-2B  # hybrid Gated DeltaNet

It runs, through lmms-eval exactly as a real run does, a few samples of the demo's synthvid_caption
task (synthetic videos generated locally: no data download) with vanilla and each method, paired
timing on (vanilla decoded beside every request in the same process), then `lvspec-eval report`,
and prints per method: failed samples, exact match with vanilla and, for the exact methods, how
many divergences are near-ties of the target's logits (numerics in bf16) and how many are not (a
bug), tau, decode and end-to-end speedups, and the peak memory of a sample. It ends with a verdict
and exits 1 when the install is not sound:
  - every run wrote its results, and no sample failed;
  - no exact method diverges from vanilla anywhere but at a near-tie;
  - every method that proposed draft tokens had some accepted (the draft and target agree at all).
Speedups on a few short synthetic captions are indicative only; they are not part of the verdict.
Qwen3.5 thinks by default, as lmms-eval's qwen3_5 class does: its answers (what follows `</think>`) may be
empty within the task's budget; the check compares tokens, so the verdict holds (`--model_args thinking=off`
for plain answers).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

TASK = "synthvid_caption"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--pretrained", required=True, help="target: a local folder or a hub id")
    p.add_argument("--draft", default="self", help="draft checkpoint, or self (Self-SD; the default)")
    p.add_argument("--methods", default="sd_tree,specvlm,fly,lvspec", help="besides vanilla (comma-separated)")
    p.add_argument("--limit", type=int, default=3, help="samples per method (default 3)")
    p.add_argument("--dtype", default="bfloat16")
    p.add_argument("--attn", default="sdpa", help="attn_implementation: sdpa, flash_attention_2 or eager")
    p.add_argument("--device_map", default=None, help="e.g. auto, to spread the models over the visible GPUs")
    p.add_argument("--device", default=None, help="default: cuda when available, else cpu")
    p.add_argument("--model_args", default="", help="more model_args for every run, e.g. sparrow_head=DIR")
    p.add_argument("--out", type=Path, default=Path("runs/gpu_check"))
    return p.parse_args(argv)


def environment(args) -> list[str]:
    """What the machine offers; problems found here are returned (an empty list: none)."""
    import torch

    print(f"torch {torch.__version__}, CUDA build {torch.version.cuda}, CUDA available {torch.cuda.is_available()}")
    for i in range(torch.cuda.device_count()):
        props = torch.cuda.get_device_properties(i)
        print(f"  cuda:{i} {props.name}, {props.total_memory / 2**30:.0f} GiB")
    problems = []
    if not torch.cuda.is_available():
        print("no GPU here: the check runs on the CPU (slow for real checkpoints)")
    if "flash" in args.attn:
        try:
            import flash_attn  # noqa: F401
        except ImportError as err:
            problems.append(f"attn_implementation={args.attn} but flash_attn does not import ({err})")
    return problems


def model_args(args, method: str, stats: Path) -> str:
    parts = [f"pretrained={args.pretrained}", f"draft={args.draft}", f"method={method}", f"dtype={args.dtype}",
             f"attn_implementation={args.attn}", "paired_timing=true", f"stats_path={stats}"]
    parts += [f"device_map={args.device_map}"] if args.device_map else []
    parts += [f"device={args.device}"] if args.device else []
    return ",".join(parts + ([args.model_args] if args.model_args else []))


def run(cmd: list[str], log: Path, limit: int) -> int:
    """Run a command, its output to `log`; its exit status. Only `limit` synthvid docs are generated."""
    print("$", " ".join(cmd), flush=True)
    env = {**os.environ, "LVSPEC_SYNTHVID_DOCS": str(limit)}
    with open(log, "w") as f:
        return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, check=False, env=env).returncode


def lmms_eval(args, method: str) -> tuple[Path, str | None]:
    """One lmms-eval run of `method`; (its folder, a problem or None)."""
    folder = args.out / method
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "lmms_eval", "--model", "lvspec", "--model_args",
           model_args(args, method, folder / "stats.jsonl"), "--tasks", TASK, "--limit", str(args.limit),
           "--output_path", str(folder), "--log_samples"]
    run(cmd, folder / "lmms_eval.log", args.limit)
    if not list(folder.rglob("*_results.json")):  # lmms-eval exits 0 even when a run fails
        return folder, f"{method}: no results written (see {folder / 'lmms_eval.log'})"
    return folder, None


def records_of(folder: Path) -> list[dict]:
    path = folder / "stats.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def peak_memory(records: list[dict]) -> float | None:
    peaks = [r["peak_memory_mb"] for r in records if r.get("peak_memory_mb")]
    return max(peaks) if peaks else None


def drafted(records: list[dict]) -> tuple[int, int]:
    """(draft tokens proposed, draft tokens accepted) over a run's records."""
    return (sum(sum(r.get("num_draft_nodes") or []) for r in records),
            sum(sum(r.get("accepted_lengths") or []) for r in records))


def row_problems(row: dict, proposed: int, accepted: int) -> list[str]:
    """What is wrong with a method's row; `proposed`/`accepted`: its draft tokens (drafted())."""
    method, problems = row["method"], []
    if row.get("failed"):
        problems.append(f"{method}: {row['failed']} failed samples (their errors are in its stats.jsonl)")
    div = row.get("divergence") or {}
    if div.get("elsewhere"):
        problems.append(f"{method}: {div['elsewhere']} divergences from vanilla away from a near-tie: a bug "
                        f"(first divergences: {div.get('first_divergences')})")
    if proposed and not accepted:
        problems.append(f"{method}: none of its {proposed} draft tokens was accepted: draft and target disagree "
                        "throughout")
    return problems


def fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def print_table(rows: list[dict], peaks: dict) -> None:
    print(f"\n{'method':10s} {'failed':>6s} {'exact':>6s} {'near-tie':>8s} {'bug':>4s} {'tau':>5s} "
          f"{'decode x':>8s} {'e2e x':>6s} {'peak MiB':>9s}")
    for row in rows:
        div = row.get("divergence") or {}
        print(f"{row['method']:10s} {row.get('failed', 0):6d} {fmt(row.get('exact_match_rate')):>6s} "
              f"{fmt(div.get('near_tie'), 'd'):>8s} {fmt(div.get('elsewhere'), 'd'):>4s} {fmt(row.get('tau')):>5s} "
              f"{fmt(row.get('decode_speedup')):>8s} {fmt(row.get('e2e_speedup')):>6s} "
              f"{fmt(peaks.get(row['method']), '.0f'):>9s}")


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    problems = environment(args)
    dry = [sys.executable, "-m", "lvspec_eval.cli", "dry-run", "--model_args",
           model_args(args, "vanilla", args.out / "dry_run_stats.jsonl"), "--tasks", TASK]
    if run(dry, args.out / "dry_run.log", args.limit) != 0:
        print((args.out / "dry_run.log").read_text()[-3000:])
        print("NOT SOUND: dry-run failed")
        return 1
    methods = ["vanilla"] + [m for m in args.methods.split(",") if m and m != "vanilla"]
    folders = {}
    for method in methods:
        folders[method], problem = lmms_eval(args, method)
        problems += [problem] if problem else []
    report = args.out / "report"
    if run([sys.executable, "-m", "lvspec_eval.cli", "report", *map(str, folders.values()), "-o", str(report),
            "--no-plots"], args.out / "report.log", args.limit) != 0:
        problems.append(f"lvspec-eval report failed (see {args.out / 'report.log'})")
    summary = json.loads((report / "summary.json").read_text()) if (report / "summary.json").exists() else {}
    rows = [r for r in summary.get("rows", []) if r["task"] == TASK]
    records = {m: records_of(f) for m, f in folders.items()}
    print_table(rows, {m: peak_memory(r) for m, r in records.items()})
    for row in rows:
        proposed, accepted = drafted(records.get(row["method"], []))
        problems += row_problems(row, proposed, accepted)
        if row["method"] != "vanilla" and not proposed:  # the adaptive policy may find drafting does not pay
            print(f"note: {row['method']} proposed no draft token (tree=adaptive found drafting does not pay here; "
                  "tree=dynamic in --model_args forces drafts)")
    for problem in problems:
        print("PROBLEM:", problem)
    print("\ninstall is SOUND" if not problems else f"\nNOT SOUND: {len(problems)} problem(s)")
    print(f"(leaderboard: {report / 'leaderboard.md'}; exact match in bf16 below 1.0 with near-ties only is numerics)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
