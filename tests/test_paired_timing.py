"""Paired timing that a stall cannot decide (decoding/runner.py): which arm counts as stalled, that
the pair is then decoded again (the method's learning rewound) and the new pair kept, and that no
garbage collection runs in a timed arm. Fake decodes with set times: nothing here is timed."""
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


def test_a_stall_has_both_arms_decoded_again_and_the_new_pair_kept():
    calls: list[str] = []
    rewound = []
    method = fake_decode("method", [(0.9, 2.0), (0.1, 1.4)], calls)  # stalled, then not
    vanilla = fake_decode("vanilla", [(0.1, 2.4), (0.1, 2.6)], calls)
    pair = runner.timed_pair(method, vanilla, vanilla_first=False, rewind=lambda: rewound.append(calls[:]))
    assert calls == ["method", "vanilla", "method", "vanilla"] and pair.retimed == "method"
    assert rewound == [["method", "vanilla"]]  # the method's learning rewound once, between the two pairs
    assert (pair.method.stats.e2e_s, pair.vanilla.stats.e2e_s) == (1.4, 2.6) and not pair.untimed


def test_a_pair_without_a_stall_is_decoded_once_each_in_the_given_order():
    calls: list[str] = []
    pair = runner.timed_pair(fake_decode("method", [(0.1, 1.0)], calls),
                             fake_decode("vanilla", [(0.1, 2.0)], calls), vanilla_first=True,
                             rewind=lambda: pytest.fail("nothing to rewind without a stall"))
    assert calls == ["vanilla", "method"] and pair.retimed is None and not pair.untimed
    assert (pair.method.name, pair.vanilla.name) == ("method", "vanilla")


def test_the_new_pair_is_kept_even_when_slower_and_a_second_stall_leaves_it_untimed():
    calls: list[str] = []
    vanilla = fake_decode("vanilla", [(0.5, 2.0), (0.5, 2.5)], calls)  # stalled both times
    method = fake_decode("method", [(0.1, 1.0), (0.1, 1.1)], calls)
    pair = runner.timed_pair(method, vanilla, vanilla_first=True)
    assert calls == ["vanilla", "method", "vanilla", "method"]
    assert pair.retimed == "vanilla" and pair.untimed
    assert (pair.vanilla.stats.e2e_s, pair.method.stats.e2e_s) == (2.5, 1.1)  # not the minimum of two runs


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
