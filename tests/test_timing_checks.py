"""The A/A checks and the separate-runs check of `lvspec-eval bench` (measure/timing_checks.py): that
they pair identical work (same tokens, both arms decoded, the ratio taken from the pair) and run the
processes they claim, in the claimed order. Nothing here asserts a timing."""
from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import pytest
import torch

from lvspec_eval.decoding import runner as runner_module
from lvspec_eval.decoding.runner import Runner
from lvspec_eval.measure import bench, timing_checks


def record(e2e: float, beside: float, tokens: int = 4, **extra) -> dict:
    return {"e2e_s": e2e, "decode_s": e2e / 2, "num_new_tokens": tokens, "tokens": [1] * tokens,
            "vanilla_e2e_s": beside, "vanilla_decode_s": beside / 2, "vanilla_num_new_tokens": tokens,
            "vanilla_tokens": [1] * tokens, **extra}


def test_an_aa_row_takes_its_ratio_from_each_pair_and_leaves_untimed_pairs_out():
    recs = [record(1.0, 1.1), record(2.0, 1.8), record(1.0, 1.0), record(9.0, 1.0, untimed=True, retimed="method")]
    row = timing_checks.aa_row("vanilla~vanilla", recs)
    assert row["n"] == 3 and row["untimed"] == 1 and row["retimed"] == 1 and row["same_tokens"]
    assert row["e2e_ratio"] == pytest.approx(statistics.median([1.1, 0.9, 1.0]))
    assert row["decode_ratio"] == pytest.approx(row["e2e_ratio"])
    other = [record(1.0, 1.0) for _ in range(3)]
    other[1]["tokens"] = [2] * 4
    assert not timing_checks.aa_row("x~x", other)["same_tokens"]  # different work: the check fails
    assert not timing_checks.aa_row("x~x", other)["holds"]


def test_a_method_that_never_drafts_must_read_within_one_percent_of_vanilla():
    recs = [record(1.0, r) for r in (1.04, 1.05, 1.06, 1.05, 1.04, 1.06, 1.05, 1.05)]
    row = timing_checks.aa_row("sd_tree:no-drafts~vanilla", recs)
    assert row["e2e_ratio"] == pytest.approx(1.05) and not row["holds"]


def test_a_rotation_row_pairs_two_runners_sample_by_sample():
    a = [{"e2e_s": 1.0, "decode_s": 0.5, "num_new_tokens": 2, "tokens": [3, 4]} for _ in range(3)]
    b = [{"e2e_s": 2.0, "decode_s": 1.0, "num_new_tokens": 2, "tokens": [3, 4]} for _ in range(3)]
    row = timing_checks.aa_row("rotation", a, b)
    assert row["e2e_ratio"] == pytest.approx(2.0) and row["same_tokens"]


def test_the_aa_runners_pair_identical_work_on_the_demo(monkeypatch):
    torch.set_num_threads(1)
    monkeypatch.setattr(runner_module, "STALL_RATIO", float("inf"))  # no re-timing: one decode per arm
    target = Runner("demo", "vanilla", cpu_kernels="torch").target

    def make_runner(method: str, **kw) -> Runner:
        return Runner("demo", method, draft="demo-draft", target_backend=target, cpu_kernels="torch", **kw)

    runners = timing_checks.aa_runners(make_runner, ["vanilla", "sd_tree"])
    assert set(runners) == {"vanilla~vanilla", "rotation:vanilla", "rotation:vanilla#2", "sd_tree~sd_tree",
                            "sd_tree:no-drafts~vanilla"}
    arms = {name: (r.drafter, r.baseline and r.baseline[0]) for name, r in runners.items()}
    assert arms["sd_tree~sd_tree"][0] is not arms["sd_tree~sd_tree"][1]  # two instances: two policies
    assert type(arms["sd_tree~sd_tree"][0]) is type(arms["sd_tree~sd_tree"][1])
    calls, real = [], runner_module.loop.generate
    monkeypatch.setattr(runner_module.loop, "generate",
                        lambda backend, drafter, *rest: calls.append(drafter) or real(backend, drafter, *rest))
    records = bench.run_methods(runners, bench.make_samples("synthvid_caption", 2), 12)
    for name, (arm, beside) in arms.items():
        if beside is not None:  # warm-up once, then each sample once per arm
            assert sum(c is arm for c in calls) == 3 and sum(c is beside for c in calls) == 3, name
    assert not any(d for r in records["sd_tree:no-drafts~vanilla"] for d in r["num_draft_nodes"])
    rows = {row["check"]: row for row in timing_checks.aa_rows(records)}
    assert set(rows) == {"vanilla~vanilla", "sd_tree~sd_tree", "sd_tree:no-drafts~vanilla", "rotation"}
    for name, row in rows.items():
        assert row["n"] == 2 and row["same_tokens"], name
    for name, recs in records.items():
        if "~" in name:
            beside, arm = timing_checks.pair_ratios(recs, "e2e_s")
            assert rows[name]["e2e_ratio"] == pytest.approx(statistics.median(b / a for b, a in zip(beside, arm)))


def test_paired_with_is_checked():
    with pytest.raises(ValueError, match="paired_with='twin'; expected one of vanilla, self"):
        Runner("demo", "vanilla", paired_timing=True, paired_with="twin", cpu_kernels="torch")


def test_separate_runs_alternate_processes_and_put_the_paired_one_in_the_middle(tmp_path):
    args = argparse.Namespace(methods="vanilla,sd_tree", separate_runs=4, model="demo", draft="demo-draft",
                              task="synthvid_caption", prompts=None, limit=3, frames=None, max_new_tokens=16,
                              options="", device="cpu", dtype="float32", threads=2, cpu_kernels="auto",
                              draft_dtype="bfloat16", draft_vocab=512, draft_vocab_table=None)
    seen = []
    # per request, seconds per token: the method is 2x faster on the first request and no faster on
    # the other two, so the median of per-request ratios is 1.0 where the ratio of sums is 1.2; each
    # process runs at its own speed (the factor)
    per_token = {"vanilla": [1.0, 1.0, 1.0], "sd_tree": [0.5, 1.0, 1.0]}
    factors = {"vanilla": iter([1.0, 0.9, 1.1, 1.05]), "sd_tree": iter([1.0, 1.02, 0.97, 1.0])}

    def run(cmd: list[str]) -> dict:
        method, solo = cmd[cmd.index("--methods") + 1], "--solo" in cmd
        seen.append(method if solo else "paired")
        assert cmd[cmd.index("--limit") + 1] == "3" and cmd[cmd.index("--threads") + 1] == "2"
        assert cmd[cmd.index("--draft-dtype") + 1] == "bfloat16" and cmd[cmd.index("--draft-vocab") + 1] == "512"
        if not solo:
            return {"methods": {"sd_tree": {"e2e_speedup": 1.0, "e2e_speedup_ci": [0.9, 1.1],
                                            "e2e_speedup_total": 1.2}}}
        f = next(factors[method])
        times = [t * f for t in per_token[method]]
        return {"tokens_per_s": len(times) / sum(times), "e2e_per_token_s": times}

    result = timing_checks.separate_runs(args, run=run)
    assert seen == ["vanilla", "sd_tree", "sd_tree", "vanilla", "paired", "vanilla", "sd_tree", "sd_tree", "vanilla"]
    # as results["throughput"] compares runs: about 1.2, bracketing the paired summed ratio
    assert result["separate_throughput_speedups"] == pytest.approx([1.2, 1.2 * 0.9 / 1.02, 1.2 * 1.1 / 0.97,
                                                                   1.2 * 1.05])
    assert result["brackets_total"]
    # as the paired figure is defined (median of per-request ratios): about 1.0, bracketing 1.0
    assert result["separate_speedups"] == pytest.approx([1.0, 0.9 / 1.02, 1.1 / 0.97, 1.05])
    assert result["brackets"] and result["vanilla_spread"] == pytest.approx(1.1 / 0.9)
    assert not result["within_interval"]  # 0.9 / 1.02 and 1.1 / 0.97 fall outside [0.9, 1.1]
    # the two definitions do not bracket each other's figure: comparing them would be a false alarm
    assert not min(result["separate_throughput_speedups"]) <= 1.0
    text = timing_checks.format_separate({"separate": result})
    assert "bracketed by the separate runs" in text and 'results["throughput"]' in text


def test_a_solo_process_times_only_its_method(tmp_path):
    args = bench_args(tmp_path, methods="sd_tree", solo=True)
    result = bench.run(args)
    assert set(result["solo"]) == {"sd_tree"} and result["tokens_per_s"] > 0 and result["n"] == 1
    assert len(result["e2e_per_token_s"]) == 1 and result["e2e_per_token_s"][0] > 0


def bench_args(tmp_path: Path, **changes) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    bench.register(sub)
    args = parser.parse_args(["bench", "--limit", "1", "--max-new-tokens", "6", "--threads", "1",
                              "--cpu-kernels", "torch", "--device", "cpu"])
    for k, v in changes.items():
        setattr(args, k, v)
    return args


@pytest.mark.parametrize("method", ["sd_tree", "sage", "sparrow"])
def test_drafting_off_runs_the_methods_own_drafter_and_never_drafts(method, monkeypatch):
    """The `<method>:no-drafts` arm (issue 52, item 8): the method's drafter with its adaptive policy
    (sd_tree, sparrow) or its draft gate (sage) deciding every step, the head's bookkeeping of the target's
    hidden states (sparrow) and the policy's estimates, never a draft node and never its draft prepared
    (no pruning, no draft prefill); the answer is vanilla's."""
    from lvspec_eval.decoding import loop
    from lvspec_eval.decoding.policy.adaptive import AdaptivePolicy
    from lvspec_eval.decoding.policy.gate import DraftGate

    torch.set_num_threads(1)
    decided = []
    for cls, name in ((AdaptivePolicy, "plan"), (DraftGate, "decide")):
        real = getattr(cls, name)
        monkeypatch.setattr(cls, name, lambda self, *a, _real=real, **k: decided.append(1) or _real(self, *a, **k))
    runner = Runner("demo", method, draft="demo-draft", cpu_kernels="torch")
    silent = timing_checks.NeverDrafts(runner.drafter)
    vanilla = Runner("demo", "vanilla", target_backend=runner.target, cpu_kernels="torch")
    for sample in bench.make_samples("synthvid_caption", 2):
        decided.clear()
        request = (sample["prompt"], [sample["video"].request()], 24)
        out = loop.generate(runner.target, silent, runner.verifier, *request)
        steps = out.stats.steps
        assert len(decided) >= len(steps) > 0  # the policy or the gate decided every step
        assert all(step.num_draft_nodes == 0 for step in steps)
        assert any(step.plan and step.plan.get("drafting_off") for step in steps)  # it wanted to, and did not
        assert silent.preparation is None and out.stats.draft_prepare_s == 0.0
        assert out.stats.policy is not None  # the method's estimates, in the record
        assert out.tokens == loop.generate(runner.target, vanilla.drafter, vanilla.verifier, *request).tokens
