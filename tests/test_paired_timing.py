"""Paired timing that a stall cannot decide (decoding/runner.py): which arm counts as stalled, that
it is decoded again and the faster run kept, and that no garbage collection runs in a timed arm.
Fake decodes with set times: nothing here is timed."""
from __future__ import annotations

import gc
from types import SimpleNamespace

import pytest

from lvspec_eval.decoding import runner


def fake_decode(name: str, times: list[tuple[float, float]], calls: list[str]):
    """A decode whose k-th call reports times[k] = (prefill_s, e2e_s)."""
    def decode():
        prefill, e2e = times[sum(c == name for c in calls)]
        calls.append(name)
        return SimpleNamespace(name=name, stats=SimpleNamespace(prefill_s=prefill, e2e_s=e2e))
    return decode


@pytest.mark.parametrize("prefill_s, expected", [
    ({"method": 0.10, "vanilla": 0.11}, None),  # alike
    ({"method": 0.90, "vanilla": 0.10}, "method"),  # the stall: 0.9 s against 0.1 s
    ({"method": 0.10, "vanilla": 0.30}, "vanilla"),
    ({"method": 0.010, "vanilla": 0.025}, None),  # 2.5x, but 15 ms: below STALL_S, noise on a tiny prefill
])
def test_stalled_arm(prefill_s, expected):
    assert runner.stalled_arm(prefill_s) == expected


def test_a_stalled_arm_is_decoded_again_and_its_faster_run_kept():
    calls: list[str] = []
    method = fake_decode("method", [(0.9, 2.0), (0.1, 1.2)], calls)  # stalled, then not
    vanilla = fake_decode("vanilla", [(0.1, 2.4)], calls)
    out, base, retimed = runner.timed_pair(method, vanilla, vanilla_first=False)
    assert calls == ["method", "vanilla", "method"] and retimed == "method"
    assert (out.stats.e2e_s, base.stats.e2e_s) == (1.2, 2.4)


def test_a_pair_without_a_stall_is_decoded_once_each_in_the_given_order():
    calls: list[str] = []
    out, base, retimed = runner.timed_pair(fake_decode("method", [(0.1, 1.0)], calls),
                                           fake_decode("vanilla", [(0.1, 2.0)], calls), vanilla_first=True)
    assert calls == ["vanilla", "method"] and retimed is None
    assert (out.name, base.name) == ("method", "vanilla")


def test_the_rerun_is_kept_only_when_faster():
    calls: list[str] = []
    vanilla = fake_decode("vanilla", [(0.5, 2.0), (0.5, 2.5)], calls)  # stalled both times
    _, base, retimed = runner.timed_pair(fake_decode("method", [(0.1, 1.0)], calls), vanilla, vanilla_first=True)
    assert retimed == "vanilla" and base.stats.e2e_s == 2.0


def test_no_garbage_collection_inside_a_timed_arm():
    assert gc.isenabled()
    with runner.paused_gc():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with runner.paused_gc():
            pass
        assert not gc.isenabled()  # a caller's choice is left as it was
    finally:
        gc.enable()
