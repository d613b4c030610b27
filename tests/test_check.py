"""`lvspec-eval check`: the CI gate passes and fails on crafted summaries."""

from __future__ import annotations

import argparse
import copy
import json
from pathlib import Path

import pytest

from lvspec_eval.reporting import check


def make_row(method: str, task: str = "videomme", **figures) -> dict:
    row = {
        "task": task,
        "method": method,
        "lossless": method in ("vanilla", "sd_tree"),
        "n": 100,
        "failed": 0,
        "tau": 2.0,
        "tokens_per_step": 3.0,
        "decode_speedup": 2.0,
        "e2e_speedup": 1.5,
        "decode_tokens_per_s": 50.0,
        "quality": 0.6,
        "metric": "acc",
        "retention": 1.0,
        "retention_ci": [0.995, 1.005],
        "non_inferior": True,
        "margin": 0.01,
        "exact_match_rate": 1.0,
        "p_value": 1.0,
        "p_holm": 1.0,
        "test": "mcnemar_exact",
    }
    if method == "vanilla":
        row.update(decode_speedup=1.0, e2e_speedup=1.0, retention_ci=[1.0, 1.0], test=None, p_value=None, p_holm=None)
    row.update(figures)
    return row


def make_summary(*rows: dict) -> dict:
    return {"version": 1, "baseline": "vanilla", "rows": list(rows), "plots": []}


GOOD = make_summary(
    make_row("vanilla"), make_row("sd_tree"), make_row("lvspec", exact_match_rate=0.8, retention_ci=[0.992, 1.01])
)


def run_check(tmp_path: Path, summary: dict, *extra: str, old: dict | None = None) -> int:
    path = tmp_path / "summary.json"
    path.write_text(json.dumps(summary))
    argv = ["check", str(path), "--min-retention", "0.99", *extra]
    if old is not None:
        (tmp_path / "old.json").write_text(json.dumps(old))
        argv += ["--baseline", str(tmp_path / "old.json")]
    parser = argparse.ArgumentParser()
    check.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


def test_good_summary_passes_with_ok_table(tmp_path, capsys):
    assert run_check(tmp_path, GOOD, "--min-speedup", "1.5") == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: 3 rows pass")
    assert "lvspec" in out and "0.992" in out


def test_low_retention_lower_bound_fails(tmp_path, capsys):
    bad = make_summary(make_row("vanilla"), make_row("fly", retention_ci=[0.97, 1.0], exact_match_rate=0.5))
    assert run_check(tmp_path, bad) == 1
    assert capsys.readouterr().out.splitlines() == ["FAIL fly on videomme: retention lower bound 0.97 < 0.99 (n=100)"]


def test_unknown_retention_bound_fails(tmp_path, capsys):
    bad = make_summary(make_row("vanilla"), make_row("lvspec", retention_ci=[None, None], n=1, exact_match_rate=0.0))
    assert run_check(tmp_path, bad) == 1
    assert "lvspec on videomme: retention lower bound unknown < 0.99 (n=1)" in capsys.readouterr().out


def test_lossless_method_with_changed_output_fails(tmp_path, capsys):
    bad = make_summary(make_row("vanilla"), make_row("sd_tree", exact_match_rate=0.98))
    assert run_check(tmp_path, bad) == 1
    assert (
        capsys.readouterr().out.strip() == "FAIL sd_tree on videomme: lossless method has exact_match_rate 0.98 < 1.0"
    )


def test_min_speedup_applies_to_non_baseline_rows_only(tmp_path, capsys):
    assert run_check(tmp_path, GOOD, "--min-speedup", "2.5") == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "FAIL sd_tree on videomme: decode_speedup 2 < 2.5",
        "FAIL lvspec on videomme: decode_speedup 2 < 2.5",
    ]


def test_min_e2e_speedup_fails_rows_slower_end_to_end(tmp_path, capsys):
    rows = make_summary(make_row("vanilla"), make_row("sd_tree", e2e_speedup=0.78), make_row("sparrow", e2e_speedup=1.2),
                        make_row("fly", e2e_speedup=None))
    assert run_check(tmp_path, rows, "--min-e2e-speedup", "0.97", "--min-speedup", "1.5") == 1
    assert capsys.readouterr().out.splitlines() == [
        "FAIL sd_tree on videomme: e2e_speedup 0.78 < 0.97",
        "FAIL fly on videomme: e2e_speedup unknown < 0.97",
    ]
    assert run_check(tmp_path, GOOD, "--min-e2e-speedup", "1.5") == 0


def test_regression_against_baseline_summary(tmp_path, capsys):
    old = copy.deepcopy(GOOD)
    new = copy.deepcopy(GOOD)
    new["rows"][1]["decode_speedup"] = 1.85  # 2.0 -> 1.85: -7.5 %, beyond 5 %
    new["rows"][2]["quality"] = 0.58  # 0.6 -> 0.58: -3.3 %, within 5 %
    assert run_check(tmp_path, new, old=old) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "FAIL sd_tree on videomme: decode_speedup 1.85 regressed from 2 (allowed down to 1.9, tolerance 0.05)"
    ]
    assert run_check(tmp_path, new, "--tolerance", "0.1", old=old) == 0


def test_rows_missing_from_new_summary_are_notes(tmp_path, capsys):
    old = make_summary(*GOOD["rows"], make_row("specvlm", task="vdc"))
    assert run_check(tmp_path, GOOD, old=old) == 0
    assert "note: specvlm on vdc is in the baseline summary but not in this one" in capsys.readouterr().out


def test_empty_summary_fails(tmp_path, capsys):
    assert run_check(tmp_path, make_summary()) == 1
    assert "no rows" in capsys.readouterr().out


def test_bad_version_and_tolerance_are_errors(tmp_path):
    with pytest.raises(ValueError, match="version 2; supported: 1"):
        run_check(tmp_path, {**GOOD, "version": 2})
    with pytest.raises(ValueError, match="--tolerance 5.0; allowed"):
        run_check(tmp_path, GOOD, "--tolerance", "5")


def test_check_summary_is_usable_without_the_cli():
    failures, notes = check.check_summary(GOOD, check.Gate(min_retention=0.995))
    assert failures == ["FAIL lvspec on videomme: retention lower bound 0.992 < 0.995 (n=100)"] and notes == []


MIXED = make_summary(
    make_row("vanilla"), make_row("sd_tree"), make_row("lvspec", exact_match_rate=0.8, retention_ci=[0.992, 1.01]),
    make_row("fly", retention_ci=[0.9, 0.97], exact_match_rate=0.3),  # lossy by design: fails the 0.99 bar
)


def test_methods_gates_the_named_methods_only(tmp_path, capsys):
    assert run_check(tmp_path, MIXED) == 1
    assert "FAIL fly on videomme" in capsys.readouterr().out
    assert run_check(tmp_path, MIXED, "--methods", "vanilla,sd_tree,lvspec") == 0
    out = capsys.readouterr().out
    assert out.startswith("OK: 3 rows pass (min retention 0.99; methods vanilla, sd_tree, lvspec)")
    assert "fly" not in out


def test_methods_still_fails_a_named_method(tmp_path, capsys):
    assert run_check(tmp_path, MIXED, "--methods", "sd_tree,fly") == 1
    assert capsys.readouterr().out.splitlines() == ["FAIL fly on videomme: retention lower bound 0.9 < 0.99 (n=100)"]


def test_methods_unknown_name_lists_the_summary_methods(tmp_path):
    with pytest.raises(ValueError, match=r"--methods: lvspek, eagle not in the summary; its methods: fly, lvspec, "
                                         r"sd_tree, vanilla"):
        run_check(tmp_path, MIXED, "--methods", "lvspec,lvspek,eagle")
    with pytest.raises(ValueError, match="--methods ' , ' names no method"):
        run_check(tmp_path, MIXED, "--methods", " , ")


def test_methods_limits_the_baseline_comparison(tmp_path, capsys):
    old = copy.deepcopy(MIXED)
    old["rows"].append(make_row("specvlm"))  # not gated now: no note about it
    new = copy.deepcopy(MIXED)
    new["rows"][3]["decode_speedup"] = 1.0  # fly regressed, but fly is not gated
    assert run_check(tmp_path, new, "--methods", "sd_tree,lvspec", old=old) == 0
    out = capsys.readouterr().out
    assert "fly" not in out and "specvlm" not in out


def _div_row(match, **div):
    return {"task": "t", "method": "sd_tree", "lossless": True, "exact_match_rate": match,
            "retention_ci": [1.0, 1.0], "decode_speedup": 2.0, "divergence": div}


def test_check_passes_near_ties_and_fails_divergences_elsewhere():
    from lvspec_eval.reporting.check import Gate, row_failures
    near = _div_row(0.9, compared=10, diverged=1, near_tie=1, elsewhere=0, unclassified=0)
    assert row_failures(near, "vanilla", Gate()) == []  # bf16 numerics: not a failure
    bug = _div_row(0.9, compared=10, diverged=2, near_tie=1, elsewhere=1, unclassified=0)
    assert any("neither run was near a tie" in f for f in row_failures(bug, "vanilla", Gate()))
    unknown = _div_row(0.9, compared=10, diverged=1, near_tie=0, elsewhere=0, unclassified=1)
    assert any("exact_match_rate" in f for f in row_failures(unknown, "vanilla", Gate()))


def test_a_speedup_over_too_few_requests_is_named_in_a_note(tmp_path, capsys):
    few = make_row("sd_tree", e2e_speedup=1.2, e2e_verdict="too few requests", n_timed=4)
    assert run_check(tmp_path, make_summary(make_row("vanilla"), few), "--min-e2e-speedup", "1.1") == 0
    out = capsys.readouterr().out
    assert "note: sd_tree on videomme: e2e speedup over 4 requests, too few for an interval" in out
    assert run_check(tmp_path, make_summary(make_row("vanilla"), few)) == 0  # no speed bar: nothing to say
    assert "too few" not in capsys.readouterr().out


def test_the_gated_speedup_is_the_reports_per_token_figure(tmp_path):
    """check reads the report's e2e_speedup, per generated token: a method whose answers are half as
    long at the same time per token reads 1.0 there and fails a bar of 1.1, whatever its per-request
    figure says."""
    from judges import stats

    s = stats.per_token_speedup([2.0] * 6, [40] * 6, [1.0] * 6, [20] * 6)
    row = make_row("lvspec", e2e_speedup=s.median, e2e_request_speedup=2.0, length_ratio=0.5)
    failures, _ = check.check_summary(make_summary(make_row("vanilla"), row), check.Gate(min_e2e_speedup=1.1))
    assert failures == ["FAIL lvspec on videomme: e2e_speedup 1 < 1.1"]
