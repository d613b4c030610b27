"""`lvspec-eval report --baseline-run DIR`: a run of lmms-eval's own class (no method, no stats) as the
quality baseline, on the fake run folders of test_report.py."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_report import CAP, DATE, MC, MC_ACC, make_runs

from lvspec_eval.reporting import baseline_run, report
from lvspec_eval.cli import main

REFERENCE_MC = [1, 1, 1, 1, 0, 1]  # lmms-eval's own class got doc 2 right, where vanilla did not


def write_reference_run(root: Path, tasks: tuple[str, ...] = (MC,)) -> Path:
    """What `lmms-eval --model qwen2_5_vl --log_samples --output_path root` writes (no stats, no method)."""
    model_dir = root / "Qwen__Qwen2.5-VL-7B-Instruct"
    model_dir.mkdir(parents=True)
    results = {"results": {t: {"alias": t, "acc,none": sum(REFERENCE_MC) / 6} for t in tasks},
               "config": {"model": "qwen2_5_vl", "model_args": "pretrained=Qwen/Qwen2.5-VL-7B-Instruct"}}
    (model_dir / f"{DATE}_results.json").write_text(json.dumps(results))
    for task in tasks:
        lines = [{"doc_id": d, "target": "A", "filtered_resps": ["A"], "acc": float(v)}
                 for d, v in enumerate(REFERENCE_MC)]
        (model_dir / f"{DATE}_samples_{task}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return root


def rows(summary: dict, task: str) -> dict:
    return {r["method"]: r for r in summary["rows"] if r["task"] == task}


def test_quality_against_the_reference_run_speed_against_vanilla(tmp_path):
    runs = make_runs(tmp_path)
    reference = write_reference_run(tmp_path / "lmms")
    plain = report.build_report(runs, tmp_path / "plain", n_boot=200, plots=False)
    summary = report.build_report(runs, tmp_path / "out", baseline_run=reference, n_boot=200, plots=False)
    assert summary["baseline"] == baseline_run.NAME
    mc, before = rows(summary, MC), rows(plain, MC)
    assert set(mc) == {"vanilla", "sd_tree", "lvspec", baseline_run.NAME}
    # quality: against the reference run's scores (5 of 6 right), not vanilla's (4 of 6)
    assert mc["vanilla"]["vanilla_quality"] == pytest.approx(5 / 6)
    assert mc["vanilla"]["retention"] == pytest.approx(sum(MC_ACC["vanilla"]) / sum(REFERENCE_MC))
    assert mc[baseline_run.NAME]["retention"] == pytest.approx(1.0)
    # speed, exact match and divergence: still against this project's vanilla run
    for method in ("sd_tree", "lvspec"):
        for key in ("decode_speedup", "e2e_speedup", "tau", "exact_match_rate"):
            assert mc[method][key] == pytest.approx(before[method][key]), (method, key)
    # a task the reference run lacks keeps no row for it, and is left out (no baseline there)
    assert rows(summary, CAP) == {}


def test_a_reference_run_without_common_tasks_is_an_error(tmp_path):
    runs = make_runs(tmp_path)
    reference = write_reference_run(tmp_path / "lmms", tasks=("other_task",))
    (tmp_path / "lmms" / "empty").mkdir()
    with pytest.raises(ValueError, match="no task in common"):
        report.build_report(runs, tmp_path / "out", baseline_run=reference, plots=False)
    with pytest.raises(ValueError, match="no \\*_results.json"):
        report.build_report(runs, tmp_path / "out", baseline_run=tmp_path / "lmms" / "empty", plots=False)


def test_cli_takes_baseline_run(tmp_path, capsys):
    runs = make_runs(tmp_path)
    reference = write_reference_run(tmp_path / "lmms")
    code = main(["report", *map(str, runs), "-o", str(tmp_path / "out"), "--baseline-run", str(reference),
                 "--no-plots", "--n-boot", "100"])
    assert code == 0 and baseline_run.NAME in capsys.readouterr().out
