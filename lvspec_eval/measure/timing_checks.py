"""Checks that a speedup figure measures the method and nothing else (`lvspec-eval bench --aa` and
`lvspec-eval bench --separate-runs N`).

A/A checks (`--aa`): paired timing (decoding/runner.py, model_arg paired_timing) run where both arms
do the same work, so the figure must read 1.00x within its interval:
- `vanilla~vanilla`: vanilla paired with a second vanilla (paired_with=self);
- `<method>~<method>`: each method paired with a second, independent instance of itself (its own
  drafter and policy, the same models);
- `<method>:no-drafts~vanilla`: the method's own drafter forced never to draft (NeverDrafts: its policy
  or gate decides every step, its bookkeeping and captures run, its draft is never prepared, every step
  is a plain step) paired with vanilla: within 1 % of it, or the method's per-step machinery costs time
  of its own;
- `rotation`: a second vanilla in `bench`'s own rotation (the unpaired, interleaved comparison).
Each row gives the median of per-request ratios (the arm beside over the arm, per generated token)
with its interval and verdict (judges.stats.speedup_interval), whether both arms said the same
tokens, and the pairs decoded again after a stall.

Separate runs (`--separate-runs N`): what a user does who compares two lmms-eval runs'
`results["throughput"]`: N processes of vanilla and N of the method, alternated (v m m v v m ...),
each timing its method alone on the same samples, and one process in the middle that times both
interleaved (the paired figure, as `bench` reports it). Each separate comparison is the ratio of
the method's tokens/s to vanilla's in the neighbouring process (as `results["throughput"]` compares
runs), and the median over requests of the per-token ratio across the two processes (as the paired
figure is defined); the result says whether each range brackets the paired figure of the same
definition, and how far vanilla's own rate moved between processes.
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from judges import stats as judge_stats

from ..decoding.types import Draft

NEAR_VANILLA = 0.01  # a method that never drafts reads within this share of vanilla


class NeverDrafts:
    """The `<method>:no-drafts` arm: the method's own drafter, forced never to draft.

    What it runs is the method's, every step: its policy or draft gate decides whether to draft (and
    learns from the step), a Sparrow or MTP head records the target's hidden states, the prefill captures
    and the per-step hidden layers the drafter asks for are captured, and its estimates go to the record.
    Then no step drafts (its TreePlanner's `never_draft`), and its draft is never prepared (no pruning,
    no draft vision tower or prefill: an eager method runs lazily here). Each step is verified as a plain
    step, as vanilla's (decoding/loop.py sends a step without draft nodes to the plain verifier, whatever
    the method's verifier). So the arm against vanilla measures the method's per-step machinery where it
    drafts nothing; not its draft's preparation, nor its verifier's work on drafts."""

    def __init__(self, drafter):
        self.inner = drafter
        self.name = f"{drafter.name}:no-drafts"
        self.hidden_layers = drafter.hidden_layers
        self.prefill_layers = getattr(drafter, "prefill_layers", ())
        self.needs_visual_attention = drafter.needs_visual_attention
        drafter.eager = False  # preparing the draft is drafting's work: never done here

    @property
    def planner(self):
        """The drafter's TreePlanner (what the runner's rewinder copies and puts back)."""
        return self.inner.planner

    @planner.setter
    def planner(self, planner) -> None:
        self.inner.planner = planner

    @property
    def preparation(self):
        return self.inner.preparation

    def may_draft(self, budget: int | None) -> bool:
        return self.inner.may_draft(budget)

    def start(self, target, inputs, target_state, clock) -> dict:
        figures = self.inner.start(target, inputs, target_state, clock)  # its planner exists from here on
        self.inner.planner.never_draft = True
        return figures

    def propose(self, generated: list[int]) -> Draft:
        draft = self.inner.propose(generated)  # the policy or the gate decides, then drafts nothing
        if draft.num_nodes:
            raise RuntimeError(f"{self.name}: {self.inner.name} drafted with drafting off: its propose must "
                               "take the step's shape from its TreePlanner")
        return draft

    def observe(self, verdict, scores, step=None) -> None:
        self.inner.observe(verdict, scores, step)

    def estimates(self) -> dict | None:
        return self.inner.estimates()

    def finish(self) -> None:
        self.inner.finish()


# ---- A/A ----------------------------------------------------------------------------------------------
def aa_runners(make_runner, methods: list[str]) -> dict:
    """name -> runner of each A/A check (see the module docstring). make_runner(method, **kw) builds a
    decoding.runner.Runner on the already loaded models."""
    runners = {"vanilla~vanilla": make_runner("vanilla", paired_timing=True, paired_with="self"),
               "rotation:vanilla": make_runner("vanilla"), "rotation:vanilla#2": make_runner("vanilla")}
    for m in (m for m in methods if m != "vanilla"):
        runners[f"{m}~{m}"] = make_runner(m, paired_timing=True, paired_with="self")
        silent = make_runner(m, paired_timing=True)
        silent.drafter = NeverDrafts(silent.drafter)
        runners[f"{m}:no-drafts~vanilla"] = silent
    return runners


def pair_ratios(records: list[dict], key: str) -> tuple[list[float], list[float]]:
    """(the arm beside's, the arm's) seconds per generated token of each timed pair ("e2e_s" or
    "decode_s"); pairs left untimed after two stalls are left out."""
    timed = [r for r in records if not r.get("untimed") and not r.get("error")]
    beside = [r[f"vanilla_{key}"] / max(1, r["vanilla_num_new_tokens"]) for r in timed]
    arm = [r[key] / max(1, r["num_new_tokens"]) for r in timed]
    return beside, arm


def aa_row(name: str, records: list[dict], other: list[dict] | None = None) -> dict:
    """One check's figures. `other`: for a rotation check, the records of the second arm (they carry
    no paired fields: the two arms are separate runners in the same rotation)."""
    if other is not None:  # rotation: pair the two runners' records sample by sample
        records = [{**r, "vanilla_e2e_s": o["e2e_s"], "vanilla_decode_s": o["decode_s"],
                    "vanilla_num_new_tokens": o["num_new_tokens"], "vanilla_tokens": o["tokens"]}
                   for r, o in zip(records, other)]
    row = {"check": name, "n": sum(1 for r in records if not r.get("untimed")),
           "same_tokens": all(r["tokens"] == r["vanilla_tokens"] for r in records),
           "retimed": sum(bool(r.get("retimed")) for r in records),
           "untimed": sum(bool(r.get("untimed")) for r in records)}
    for figure, key in (("e2e", "e2e_s"), ("decode", "decode_s")):
        s = judge_stats.speedup_interval(*pair_ratios(records, key))
        row.update({f"{figure}_ratio": s.median, f"{figure}_ci": [s.lo, s.hi], f"{figure}_verdict": s.verdict})
    lo, hi = row["e2e_ci"]
    row["holds"] = bool(row["same_tokens"] and lo <= 1.0 <= hi)
    if ":no-drafts" in name:  # never drafting: the method's own machinery must cost nearly nothing
        row["holds"] = row["holds"] and abs(row["e2e_ratio"] - 1.0) <= NEAR_VANILLA
    return row


def aa_rows(records: dict[str, list[dict]]) -> list[dict]:
    rows = [aa_row(name, recs) for name, recs in records.items() if "~" in name]
    rows.append(aa_row("rotation", records["rotation:vanilla"], records["rotation:vanilla#2"]))
    return rows


AA_COLUMNS = ("n", "e2e_ratio", "e2e_ci", "e2e_verdict", "decode_ratio", "decode_ci", "same_tokens", "retimed",
              "untimed", "holds")


def format_aa(result: dict) -> str:
    lines = ["| A/A check | " + " | ".join(AA_COLUMNS) + " |", "|---" * (len(AA_COLUMNS) + 1) + "|"]
    for row in result["aa"]:
        cells = []
        for c in AA_COLUMNS:
            v = row[c]
            cells.append(f"[{v[0]:.3f}, {v[1]:.3f}]" if isinstance(v, list) else f"{v:.3f}" if isinstance(v, float)
                         else str(v))
        lines.append(f"| {row['check']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---- separate runs --------------------------------------------------------------------------------------
FORWARDED = ("model", "draft", "task", "prompts", "limit", "frames", "max_new_tokens", "options", "device", "dtype",
             "threads", "cpu_kernels", "draft_dtype", "draft_vocab", "draft_vocab_table")


def child_command(args: argparse.Namespace, methods: str, out: Path, solo: bool) -> list[str]:
    """`lvspec-eval bench` in a fresh process on the same samples and settings, timing `methods`
    (alone with `solo`, else interleaved with vanilla)."""
    cmd = [sys.executable, "-m", "lvspec_eval.cli", "bench", "--methods", methods, "--out", str(out)]
    for name in FORWARDED:
        value = getattr(args, name, None)
        if value not in (None, ""):
            cmd += [f"--{name.replace('_', '-')}", str(value)]
    return cmd + (["--solo"] if solo else [])


def run_child(cmd: list[str]) -> dict:
    out = Path(cmd[cmd.index("--out") + 1])
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def separate_order(n: int) -> list[str]:
    """v m, m v, v m, ...: each method's process as often first as second within its pair."""
    return [arm for k in range(n) for arm in (("vanilla", "method") if k % 2 == 0 else ("method", "vanilla"))]


def separate_runs(args: argparse.Namespace, run=run_child) -> dict:
    """N separate processes per arm, alternated, and one paired process in the middle (module docstring)."""
    method = next((m for m in args.methods.split(",") if m != "vanilla"), None)
    if method is None or args.separate_runs < 1:
        raise ValueError(f"--separate-runs {args.separate_runs} with --methods {args.methods!r}: give N >= 1 and one "
                         "method besides vanilla")
    rates: dict[str, list[float]] = {"vanilla": [], "method": []}
    per_token: dict[str, list[list[float]]] = {"vanilla": [], "method": []}
    with tempfile.TemporaryDirectory() as tmp:
        order = separate_order(args.separate_runs)
        for k, arm in enumerate(order):
            if k == 2 * (args.separate_runs // 2):  # between two pairs of processes, halfway: the paired one
                paired = run(child_command(args, method, Path(tmp) / "paired.json", solo=False))
            name = "vanilla" if arm == "vanilla" else method
            solo = run(child_command(args, name, Path(tmp) / f"{k}.json", solo=True))
            rates[arm].append(solo["tokens_per_s"])
            per_token[arm].append(solo["e2e_per_token_s"])
    return separate_summary(method, rates, paired["methods"][method], per_token)


def separate_summary(method: str, rates: dict[str, list[float]], paired_row: dict,
                     per_token: dict[str, list[list[float]]]) -> dict:
    """Each separate comparison (the method against vanilla in the neighbouring process) against the
    paired figure (`bench`'s median per-sample e2e ratio, and its summed ratio).

    Each separate comparison is given twice: as results["throughput"] compares two runs (summed
    tokens over summed seconds), held against the paired process's summed ratio, and as the paired
    figure is defined (the median over requests of vanilla's seconds per token over the method's, the
    requests matched by sample across the two processes), held against the paired median. Like is
    compared with like: where per-request speedups vary (a text prompt the draft predicts well, one
    it does not), the median of ratios and the ratio of sums differ by more than the noise."""
    throughput = [m / v for v, m in zip(rates["vanilla"], rates["method"])]
    separate = [judge_stats.speedup_interval(v, m).median for v, m in zip(per_token["vanilla"], per_token["method"])]
    figure, total = paired_row["e2e_speedup"], paired_row["e2e_speedup_total"]
    return {"method": method, "vanilla_tokens_per_s": rates["vanilla"], "method_tokens_per_s": rates["method"],
            "vanilla_spread": max(rates["vanilla"]) / min(rates["vanilla"]),
            "separate_speedups": separate, "paired_speedup": figure,
            "paired_speedup_ci": paired_row["e2e_speedup_ci"],
            "separate_throughput_speedups": throughput, "paired_speedup_total": total,
            "brackets": min(separate) <= figure <= max(separate),
            # a weaker check that does not depend on N: every separate figure inside the paired interval
            "within_interval": all(paired_row["e2e_speedup_ci"][0] <= x <= paired_row["e2e_speedup_ci"][1]
                                   for x in separate),
            "brackets_total": min(throughput) <= total <= max(throughput)}


def format_separate(result: dict) -> str:
    s = result["separate"]
    runs = ", ".join(f"{x:.2f}x" for x in s["separate_speedups"])
    sums = ", ".join(f"{x:.2f}x" for x in s["separate_throughput_speedups"])
    return (f"{s['method']}: separate runs {runs} as the median of per-request ratios (vanilla's own tokens/s moved "
            f"{s['vanilla_spread']:.2f}x between processes); paired in one process {s['paired_speedup']:.2f}x "
            f"[{s['paired_speedup_ci'][0]:.2f}, {s['paired_speedup_ci'][1]:.2f}]: "
            f"{'bracketed' if s['brackets'] else 'NOT bracketed'} by the separate runs, which lie "
            f"{'inside' if s.get('within_interval') else 'NOT all inside'} its interval. As results[\"throughput\"] "
            f"compares runs (summed tokens over summed seconds): separate {sums}, paired {s['paired_speedup_total']:.2f}x: "
            f"{'bracketed' if s['brackets_total'] else 'NOT bracketed'}")


def solo_summary(records: list[dict]) -> dict:
    """A --solo process's figure: its method's end-to-end tokens/s (as results["throughput"] gives it)."""
    per_token = [r["e2e_s"] / max(1, r["num_new_tokens"]) for r in records]  # in sample order
    return {"tokens_per_s": sum(r["num_new_tokens"] for r in records) / sum(r["e2e_s"] for r in records),
            "median_e2e_per_token_s": statistics.median(per_token), "e2e_per_token_s": per_token,
            "n": len(records)}
