"""A stall in paired timing leaves no trace in what the method learns (decoding/runner.timed_pair).

The demo's sd_tree (adaptive policy, lazy draft) runs three requests paired with vanilla, twice: once
as is and once with the method's target prefill of the second request stalled by a second. Every
clock is a counter (one tick per reading), so the policy's decisions depend on the work done, not on
the machine: the stalled run must end with the same plans, tokens and policy state as the other.
Nothing here is timed.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from lvspec_eval.decoding import loop, runner
from lvspec_eval.decoding.runner import Runner
from lvspec_eval.measure import bench

TICK = 2.0 ** -10  # seconds per clock reading (a power of two: every difference of readings is exact)
STALL = 1.0  # seconds the stalled prefill takes on top


class Ticks:
    """A clock that moves by TICK per reading, plus whatever `stall` adds."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        self.now += TICK
        return self.now


def state(obj):
    """Plain, comparable values of an object's whole state (floats by repr, so nan equals nan)."""
    if isinstance(obj, torch.Tensor):
        return state(obj.tolist())
    if isinstance(obj, np.ndarray):
        return state(obj.tolist())
    if isinstance(obj, float):
        return repr(obj)
    if isinstance(obj, dict):
        return {repr(k): state(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [state(v) for v in obj]
    if isinstance(obj, (torch.device, frozenset, str, int, bool, type(None))):
        return repr(obj)
    return {k: state(v) for k, v in vars(obj).items()}


def paired_run(monkeypatch, stall_request: int | None, warmup: bool = False) -> tuple[list[dict], dict]:
    """Three caption requests through a paired sd_tree runner; the method's target prefill of
    request `stall_request` (the first time it runs) takes STALL seconds more. Returns the records
    and the policy's state after them."""
    ticks = Ticks()
    monkeypatch.setattr(loop, "make_clock", lambda devices: ticks)
    monkeypatch.setattr(runner, "STALL_S", 0.0)  # with this clock any 1.5x difference is a stall
    sd_tree = Runner("demo", "sd_tree", draft="demo-draft", paired_timing=True, cpu_kernels="torch", warmup=warmup)
    arm, request, stalled = {"drafter": None}, {"n": 0}, []
    real_generate, real_prefill = GENERATE, sd_tree.target.prefill

    def generate(backend, drafter, *rest):
        arm["drafter"] = drafter
        DECODES.append(rest[-2])  # max_new_tokens
        return real_generate(backend, drafter, *rest)

    def prefill(*args, **kwargs):
        if arm["drafter"] is sd_tree.drafter and request["n"] == stall_request and not stalled:
            stalled.append(True)
            ticks.now += STALL
        return real_prefill(*args, **kwargs)

    monkeypatch.setattr(runner.loop, "generate", generate)
    monkeypatch.setattr(sd_tree.target, "prefill", prefill)
    records = []
    for s in bench.make_samples("synthvid_caption", 3):
        records.append(sd_tree.generate(s["prompt"], [s["video"]], 24).stats)
        request["n"] += 1
    assert stalled == ([True] if stall_request is not None else [])
    return records, state(sd_tree.drafter.planner.policy)


GENERATE = loop.generate  # before any test wraps it
DECODES: list[int] = []  # max_new_tokens of every decode paired_run made

PLAN_KEYS = ("tokens", "plan_depth", "plan_width", "num_draft_nodes", "accepted_lengths", "policy",
             "vanilla_tokens", "draft_prepared_at")


def test_a_stalled_request_is_learnt_from_once(monkeypatch):
    torch.set_num_threads(1)
    plain, plain_policy = paired_run(monkeypatch, None)
    stalled, stalled_policy = paired_run(monkeypatch, 1)
    assert [r["retimed"] for r in plain] == [None, None, None]
    assert [r["retimed"] for r in stalled] == [None, "method", None]
    assert not any(r["untimed"] for r in stalled)  # the second pair ran without a stall
    assert any(d for r in plain for d in r["plan_depth"])  # the policy drafted: there is something to learn
    for a, b in zip(plain, stalled):
        assert {k: a.get(k) for k in PLAN_KEYS} == {k: b.get(k) for k in PLAN_KEYS}
        assert (a["e2e_s"], a["vanilla_e2e_s"]) == pytest.approx((b["e2e_s"], b["vanilla_e2e_s"]))
    assert stalled_policy == plain_policy


def test_a_planner_is_rewound_to_its_state_before_the_request(monkeypatch):
    """The rewind restores the planner as it was (None before the first request), not a reference to it."""
    sd_tree = Runner("demo", "sd_tree", draft="demo-draft", cpu_kernels="torch")
    s = bench.make_samples("synthvid_caption", 1)[0]
    rewind = runner.rewinder(sd_tree.drafter)
    sd_tree.generate(s["prompt"], [s["video"]], 8)
    assert sd_tree.drafter.planner is not None
    rewind()
    assert sd_tree.drafter.planner is None
    sd_tree.generate(s["prompt"], [s["video"]], 8)
    before = state(sd_tree.drafter.planner.policy)
    rewind = runner.rewinder(sd_tree.drafter)
    sd_tree.generate(s["prompt"], [s["video"]], 8)
    assert state(sd_tree.drafter.planner.policy) != before
    rewind()
    rewind()  # twice: each rewind restores a fresh copy
    assert state(sd_tree.drafter.planner.policy) == before


def test_the_report_leaves_a_twice_stalled_request_out_of_its_speed_figures():
    from pathlib import Path

    from lvspec_eval.reporting import report
    from lvspec_eval.reporting.runs import TaskRun

    rec = {"e2e_s": 1.0, "decode_s": 0.8, "vanilla_e2e_s": 2.0, "vanilla_decode_s": 1.6}
    method = {"0": rec, "1": {**rec, "untimed": True}, "2": rec}
    vanilla = {i: {"e2e_s": 2.0, "decode_s": 1.6} for i in method}
    runs = [TaskRun(m, "t", ("m",), {}, stats, Path("x"), True) for m, stats in (("sd_tree", method),
                                                                                ("vanilla", vanilla))]
    pairs = report.timed_pairs(*runs)
    assert [m is rec for m, _ in pairs] == [True, True]


def test_the_warm_up_decodes_every_arm_untimed_and_teaches_nothing(monkeypatch):
    torch.set_num_threads(1)
    cold, cold_policy = paired_run(monkeypatch, None)
    DECODES.clear()
    warm, warm_policy = paired_run(monkeypatch, None, warmup=True)
    assert DECODES == [runner.WARMUP_TOKENS] * 2 + [24] * 6  # both arms warmed up, then three pairs
    for a, b in zip(cold, warm):
        assert {k: a.get(k) for k in PLAN_KEYS} == {k: b.get(k) for k in PLAN_KEYS}
    assert warm_policy == cold_policy
