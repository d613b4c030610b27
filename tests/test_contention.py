"""backends/contention.py: a timing that starts while other runnable threads and ours oversubscribe
the cores is flagged (the cause of the spread between processes, docs/TIMING.md)."""
from __future__ import annotations

import warnings

import pytest

from lvspec_eval.backends import contention


def test_oversubscribed_cores_warn_and_name_a_thread_count_that_fits():
    with pytest.warns(RuntimeWarning, match="threads=1"):
        seen = contention.check(threads=2, cores=2, others=1)
    assert seen["oversubscribed"] and seen["runnable_others"] == 1 and "5.4x" in seen["warning"]


@pytest.mark.parametrize("threads,others", [(2, 0), (1, 1), (4, 4)])
def test_cores_enough_for_everyone_say_nothing(threads, others):
    cores = 8 if threads == 4 else 2
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        seen = contention.check(threads=threads, cores=cores, others=others)
    assert not seen["oversubscribed"] and "warning" not in seen


def test_the_runnable_count_leaves_out_the_reader(monkeypatch, tmp_path):
    fake = tmp_path / "loadavg"
    fake.write_text("2.50 1.90 1.60 3/412 9999\n")
    monkeypatch.setattr(contention, "Path", lambda _: fake)
    assert contention.runnable_others(samples=3) == 2
    fake.write_text("garbage\n")
    assert contention.runnable_others(samples=1) is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not contention.check(threads=2, cores=2)["oversubscribed"]  # unknown: no claim


def test_bench_records_what_it_saw_as_timing_started(tmp_path):
    from lvspec_eval import cli
    from lvspec_eval.measure import bench

    args = cli.build_parser().parse_args(["bench", "--methods", "vanilla", "--limit", "1", "--max-new-tokens", "4",
                                          "--threads", "1", "--cpu-kernels", "torch", "--device", "cpu"])
    result = bench.run(args)
    seen = result["env"]["at_start"]
    assert seen["threads"] == 1 and "runnable_others" in seen and "oversubscribed" in seen
