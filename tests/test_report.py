"""`lvspec-eval report` on fake lmms-eval run folders with the real file layout:
RUN/<model>/<date>_results.json, RUN/<model>/<date>_samples_<task>.jsonl, plus decode stats."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest
from scipy import stats as sps

from lvspec_eval.reporting import overview as report_overview
from lvspec_eval.reporting import plots as report_plots
from lvspec_eval.reporting import report
from lvspec_eval.reporting import speed as report_speed

DATE = "20250101_120000"
MC = "demo_mc"  # 0/1 accuracy: McNemar
CAP = "demo_cap"  # graded f1: Wilcoxon
MC_ACC = {
    "vanilla": [1, 1, 0, 1, 0, 1],
    "sd_tree": [1, 1, 0, 1, 0, 1],
    "lvspec": [1, 0, 0, 1, 0, 0],  # doc 1 lost, doc 5 failed (scored 0)
}
CAP_F1 = {
    "vanilla": [0.5, 0.8, 0.6, 0.7],
    "sd_tree": [0.5, 0.8, 0.6, 0.7],
    "lvspec": [0.5, 0.7, 0.6, 0.75],
}
FACTS = {"vanilla": ["background", "count"], "sd_tree": ["background", "count"], "lvspec": ["count"]}  # doc 1's
DECODE_S = {"vanilla": 1.0, "sd_tree": 0.5, "lvspec": 0.25}  # per sample
ACCEPTED = {"vanilla": [0] * 7, "sd_tree": [2, 3], "lvspec": [4, 4]}  # per sample


def stats_record(method: str, task: str, doc: int) -> dict:
    accepted = ACCEPTED[method]
    steps = len(accepted)
    failed = method == "lvspec" and task == MC and doc == 5
    changed = method == "lvspec" and doc in (1, 5)
    return {
        "task": task,
        "doc_id": doc,
        "method": method,
        "error": "CUDA out of memory" if failed else None,
        # a caption is long enough for the speedup-vs-visual-tokens plot (>= 8 tokens), an MC answer is not
        "num_new_tokens": 0 if failed else (7 if task == MC else 9),
        "num_steps": steps,
        "accepted_lengths": accepted,
        "tau": sum(accepted) / steps,
        "tokens_per_step": sum(accepted) / steps + 1,
        "prefill_s": 0.4,
        "prune_s": 0.0,
        "draft_prefill_s": 0.1,
        "decode_s": DECODE_S[method],
        "draft_s": 0.0,
        "verify_s": 0.0,
        "e2e_s": DECODE_S[method] + 0.5,
        "num_target_forwards": steps,
        "visual_tokens": 100 * (doc + 1),
        "kept_visual_tokens": 10 * (doc + 1),
        "peak_memory_mb": 10.0,
        "tokens": [] if failed else ([9, 9, doc] if changed else [1, 2, doc]),
        # per committed token, as lvspec_eval/decoding/runner.py writes them (parallel lists)
        "kinds": ["loose", "exact", "target"] if method == "lvspec" else ["exact", "exact", "target"],
        "relevance": [0.1, 0.8, 0.7] if method == "lvspec" else [None, None, None],  # 0.7: the rejected token's
        "token_texts": [" a", " red", "."],
        "replaced": [None, None, 7],  # the draft said " the" where the target said "."
        "replaced_texts": [None, None, " the"],
    }


def write_run(root: Path, method: str, stats_path: Path | None) -> Path:
    """One lmms-eval --output_path folder for `method`, both tasks."""
    run_dir = root / method
    model_dir = run_dir / "demo"
    model_dir.mkdir(parents=True)
    model_args = f"pretrained=demo,method={method}" + (f",stats_path={stats_path}" if stats_path else "")
    results = {
        "results": {
            MC: {"alias": MC, "acc,none": sum(MC_ACC[method]) / 6, "acc_stderr,none": 0.2},
            CAP: {"alias": CAP, "f1,none": 0.6, "f1_stderr,none": "N/A", "precision,none": 0.6},
        },
        "group_subtasks": {MC: [], CAP: []},
        "config": {"model": "lvspec", "model_args": model_args, "limit": None},
        "date": DATE,
    }
    (model_dir / f"{DATE}_results.json").write_text(json.dumps(results))
    for task, values, key in ((MC, MC_ACC[method], "acc"), (CAP, CAP_F1[method], "f1")):
        lines = [
            {
                "doc_id": d,
                "target": "A",
                "filtered_resps": f"{method}-{d}" if method == "lvspec" and d in (1, 5) else f"answer {d}",
                "token_counts": [None],
                "doc_hash": "x",
                "input": "q",
                key: float(v),
                "precision": 1.0,
                # the facts a caption states right (synthvid's visual_fact_accuracy logs them)
                **({"vfa": {"correct": 1, "stated": 1, "facts_right": FACTS[method] if d == 1 else ["count"]}}
                   if task == CAP else {}),
            }
            for d, v in enumerate(values)
        ]
        (model_dir / f"{DATE}_samples_{task}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return run_dir


def write_stats(path: Path, methods: list[str]) -> None:
    records = [stats_record(m, t, d) for m in methods for t, n in ((MC, 6), (CAP, 4)) for d in range(n)]
    with path.open("a") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)


def make_runs(root: Path) -> list[Path]:
    """vanilla and lvspec share a stats file named by stats_path (outside their folders);
    sd_tree's stats lie inside its RUN folder as stats_sd.jsonl."""
    shared = root / "stats_shared.jsonl"
    write_stats(shared, ["vanilla", "lvspec"])
    dirs = [write_run(root, "vanilla", shared), write_run(root, "sd_tree", None), write_run(root, "lvspec", shared)]
    write_stats(dirs[1] / "stats_sd.jsonl", ["sd_tree"])
    return dirs


@pytest.fixture
def runs(tmp_path: Path) -> list[Path]:
    return make_runs(tmp_path)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> tuple[dict, Path]:
    """One full report (with plots, which are slow to render) shared by the read-only tests."""
    root = tmp_path_factory.mktemp("report")
    return report.build_report(make_runs(root), root / "out", n_boot=500), root / "out"


@pytest.fixture
def summary(built) -> dict:
    return built[0]


def row(summary: dict, task: str, method: str) -> dict:
    (found,) = [r for r in summary["rows"] if r["task"] == task and r["method"] == method]
    return found


def test_rows_are_ordered_baseline_first(summary):
    assert [(r["task"], r["method"]) for r in summary["rows"]] == [
        (CAP, "vanilla"),
        (CAP, "sd_tree"),
        (CAP, "lvspec"),
        (MC, "vanilla"),
        (MC, "sd_tree"),
        (MC, "lvspec"),
    ]
    assert summary["version"] == 1 and summary["baseline"] == "vanilla"


def test_speed_figures_match_hand_computation(summary):
    sd = row(summary, MC, "sd_tree")
    assert sd["tau"] == pytest.approx(2.5)  # 5 accepted over 2 steps, every sample
    assert sd["tokens_per_step"] == pytest.approx(3.5)
    assert sd["decode_speedup"] == pytest.approx(6 * 1.0 / (6 * 0.5))
    assert sd["e2e_speedup"] == pytest.approx(6 * 1.5 / (6 * 1.0))
    # every request has the same ratio: the interval is that point, the summed ratio the same
    assert sd["e2e_speedup_ci"] == [pytest.approx(1.5)] * 2 and sd["e2e_speedup_total"] == pytest.approx(1.5)
    assert sd["e2e_verdict"] == "faster" and sd["decode_verdict"] == "faster"
    assert sd["e2e_paired_s_per_token"] == [[pytest.approx(1.5 / 7), pytest.approx(1.0 / 7)]] * 6
    assert sd["e2e_request_speedup"] == pytest.approx(1.5) and sd["length_ratio"] == 1.0
    assert sd["decode_tokens_per_s"] == pytest.approx(42 / 3.0)
    lv = row(summary, MC, "lvspec")
    assert lv["failed"] == 1 and lv["n_timed"] == 5  # the failed sample is left out of speed
    assert lv["decode_speedup"] == pytest.approx(5 * 1.0 / (5 * 0.25))
    assert lv["tau"] == pytest.approx(4.0)
    van = row(summary, MC, "vanilla")
    assert (van["tau"], van["tokens_per_step"], van["decode_speedup"]) == (0.0, 1.0, 1.0)
    assert van["e2e_verdict"] is None and van["e2e_speedup_ci"] == [1.0, 1.0]  # the baseline against itself


def _timed(e2e: float, vanilla_e2e: float, tokens: int = 9, vanilla_tokens: int = 9) -> dict:
    return {"decode_s": e2e / 2, "e2e_s": e2e, "num_new_tokens": tokens, "num_steps": 3, "accepted_lengths": [1, 1, 1],
            "vanilla_decode_s": vanilla_e2e / 2, "vanilla_e2e_s": vanilla_e2e, "vanilla_num_new_tokens": vanilla_tokens}


def test_e2e_speedup_is_the_median_of_paired_ratios_with_its_interval():
    # nine requests at 2x, one of them stalled (0.2x): the summed ratio says 0.95x, the median 2x; at n = 9
    # the 95 % interval is [r_(2), r_(8)] (binomial), so the one stall stays outside it: [2, 2]
    pairs = [(m, report_speed._beside(m, {})) for m in [_timed(1.0, 2.0)] * 8 + [_timed(10.0, 2.0)]]
    fields = report_speed.speed_fields(pairs)
    assert fields["e2e_speedup"] == 2.0 and fields["e2e_speedup_total"] == pytest.approx(18 / 18)
    assert fields["e2e_speedup_ci"] == [2.0, 2.0] and fields["e2e_verdict"] == "faster"
    assert fields["retimed"] == 0
    # one stall in eight: the interval is the min-max range [r_(1), r_(8)], which holds 1.0, and the row
    # says so instead of claiming a speedup or a loss
    pairs = [(m, report_speed._beside(m, {})) for m in [_timed(1.0, 2.0)] * 7 + [_timed(10.0, 2.0)]]
    fields = report_speed.speed_fields(pairs)
    assert fields["e2e_speedup"] == 2.0 and fields["e2e_speedup_ci"] == [pytest.approx(0.2), 2.0]
    assert fields["e2e_verdict"] == "no clear difference" and fields["decode_verdict"] == "no clear difference"
    # four requests at 2x: no 95 % interval exists over four, the verdict says so
    pairs = [(m, report_speed._beside(m, {})) for m in [_timed(1.0, 2.0)] * 4]
    assert report_speed.speed_fields(pairs)["e2e_verdict"] == "too few requests"


def test_shorter_answers_are_not_a_speedup():
    """A method whose answers are half vanilla's length at vanilla's time per token: per request it
    takes half the time (2x), per generated token (the speedup) 1.0x; both are in the row, with the
    answer-length ratio."""
    pairs = [(m, report_speed._beside(m, {})) for m in [_timed(1.0, 2.0, tokens=10, vanilla_tokens=20)] * 8]
    fields = report_speed.speed_fields(pairs)
    assert fields["e2e_speedup"] == 1.0 and fields["decode_speedup"] == 1.0 and fields["e2e_speedup_total"] == 1.0
    assert fields["e2e_verdict"] == "no clear difference"
    assert fields["e2e_request_speedup"] == 2.0 and fields["length_ratio"] == 0.5


def test_multiple_choice_quality_uses_mcnemar(summary):
    lv = row(summary, MC, "lvspec")
    assert lv["metric"] == "acc"
    assert lv["quality"] == pytest.approx(2 / 6)
    assert lv["vanilla_quality"] == pytest.approx(4 / 6)
    assert lv["retention"] == pytest.approx(0.5)
    assert lv["test"] == "mcnemar_exact"
    assert lv["p_value"] == pytest.approx(0.5)  # 2 discordant pairs, both against: 2 * (1/2)^2
    assert lv["p_holm"] == pytest.approx(1.0)  # family {0.5, 1.0}: 0.5 * 2
    assert lv["non_inferior"] is False and lv["margin"] == 0.01
    assert lv["exact_match_rate"] == pytest.approx(4 / 6) and lv["exact_match_basis"] == "tokens"
    assert lv["lossless"] is False
    lo, hi = lv["retention_ci"]
    assert lo < 0.5 < hi


def test_lossless_method_collapses_to_vanilla(summary):
    sd = row(summary, MC, "sd_tree")
    assert sd["lossless"] is True
    assert sd["retention"] == 1.0 and sd["retention_ci"] == [1.0, 1.0]
    assert sd["non_inferior"] is True and sd["non_inferior_by_margin"] == {"0.01": True, "0.02": True}
    assert sd["exact_match_rate"] == 1.0
    assert sd["p_value"] == 1.0
    van = row(summary, MC, "vanilla")
    assert van["test"] is None and van["p_value"] is None and van["p_holm"] is None


def test_graded_quality_uses_wilcoxon(summary):
    lv = row(summary, CAP, "lvspec")
    assert lv["metric"] == "f1"
    assert lv["quality"] == pytest.approx(sum(CAP_F1["lvspec"]) / 4)
    assert lv["retention"] == pytest.approx(sum(CAP_F1["lvspec"]) / sum(CAP_F1["vanilla"]))
    diffs = [a - b for a, b in zip(CAP_F1["lvspec"], CAP_F1["vanilla"])]
    assert lv["test"] == "wilcoxon" and lv["zero_method"] == "zsplit"
    assert lv["p_value"] == pytest.approx(sps.wilcoxon(diffs, zero_method="zsplit").pvalue)
    assert lv["exact_match_rate"] == pytest.approx(3 / 4)  # doc 1's tokens differ
    assert (lv["facts_lost"], lv["fact_error_rate"]) == (1, pytest.approx(1 / 5))  # doc 1 lost "background"
    assert row(summary, CAP, "sd_tree")["facts_lost"] == 0
    assert row(summary, MC, "lvspec")["facts_lost"] is None  # the MC task logs no facts


def test_outputs_are_written(built):
    summary, out = built
    text = (out / "summary.json").read_text()
    json.loads(text, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    names = ["speedup_vs_retention", "tau_distribution", "speedup_vs_visual_tokens", "relevance", "loose_tokens",
             "overruled_tokens"]
    assert [p["name"] for p in summary["plots"]] == names
    for plot in summary["plots"][:4]:
        assert (out / plot["path"]).read_bytes()[:4] == b"\x89PNG"
    assert summary["plots"][4]["path"] is None
    assert summary["plots"][4]["top_loose_tokens"] == [[" a", 9]]  # lvspec's 9 timed samples, one each
    md = (out / "leaderboard.md").read_text()
    assert "| demo_mc | lvspec | no | 6 | 1 | 4.00 | 5.00 |" in md
    assert "most frequent loosely accepted tokens" in md and "| 1 | a | 9 |" in md
    assert "| lvspec | the -> . | 9 |" in md and "| vanilla |" not in md.split("overruled")[-1]
    page = (out / "leaderboard.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and "<table>" in page


def test_metric_override_and_text_fallback(runs, tmp_path):
    for run_dir in runs:  # drop the token ids: exact match falls back to the logged answers
        for path in run_dir.rglob("stats*.jsonl"):
            path.unlink()
    (tmp_path / "stats_shared.jsonl").unlink()
    summary = report.build_report(runs, tmp_path / "o2", metrics={CAP: "precision"}, n_boot=200, plots=False)
    lv = row(summary, CAP, "lvspec")
    assert lv["metric"] == "precision" and lv["retention"] == 1.0
    assert lv["exact_match_basis"] == "text" and lv["exact_match_rate"] == pytest.approx(3 / 4)
    assert lv["decode_speedup"] is None and lv["n_timed"] == 0
    assert any("no decode statistics" in w for w in summary["warnings"])


def test_latest_results_file_wins(runs, tmp_path):
    model_dir = runs[2] / "demo"
    later = "20250102_090000"
    for path in model_dir.iterdir():
        text = path.read_text().replace('"acc": 0.0', '"acc": 1.0')
        (model_dir / path.name.replace(DATE, later)).write_text(text)
    summary = report.build_report(runs, tmp_path / "o3", n_boot=200, plots=False)
    assert row(summary, MC, "lvspec")["quality"] == 1.0
    assert any("twice" in w for w in summary["warnings"])


def test_missing_baseline_is_an_error(runs, tmp_path):
    with pytest.raises(ValueError, match="no run with method=vanilla.*sd_tree, lvspec"):
        report.build_report(runs[1:], tmp_path / "o4")


def test_unknown_option_and_bad_metric_are_errors(runs, tmp_path):
    with pytest.raises(ValueError, match="unknown report option.*n_boots.*allowed"):
        report.build_report(runs, tmp_path / "o5", n_boots=10)
    with pytest.raises(ValueError, match="no metric 'bleu'; available: acc, precision"):
        report.build_report(runs, tmp_path / "o6", metrics={MC: "bleu"})


def test_cli_prints_the_summary_and_leaderboard(runs, tmp_path, capsys):
    parser = argparse.ArgumentParser()
    report.register(parser.add_subparsers())
    args = parser.parse_args(
        [
            "report",
            *map(str, runs),
            "-o",
            str(tmp_path / "cli"),
            "--metric",
            f"{CAP}=f1",
            "--n-boot",
            "100",
            "--no-plots",
        ]
    )
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert out.startswith("## Summary: which method to use\n\n| task | use | e2e speedup |")
    assert "| method | demo_cap | demo_mc | tau | e2e overall | decode overall |" in out
    assert (tmp_path / "cli" / "leaderboard.html").is_file()


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            "pretrained=demo,method=sd_tree,stats_path=/x/s.jsonl",
            {"pretrained": "demo", "method": "sd_tree", "stats_path": "/x/s.jsonl"},
        ),
        ({"method": "vanilla", "max_new_tokens": 8}, {"method": "vanilla", "max_new_tokens": "8"}),
        ("", {}),
    ],
)
def test_parse_model_args(args, expected):
    assert report.parse_model_args(args) == expected


@pytest.mark.parametrize(
    ("method", "lossless"),
    [
        ("vanilla", True),
        ("specvlm", True),
        ("fly", False),
        ("lvspec", False),
        ("custom:sparrow+exact", True),
        ("custom:model+loose", False),
    ],
)
def test_lossless_methods(method, lossless):
    assert report.is_lossless(method) is lossless


def test_pareto_front():
    points = [(1.0, 1.0), (0.99, 2.0), (0.95, 1.5), (0.9, 2.5)]
    assert report_plots.pareto_front(points) == [3, 1, 0]


def test_binned_speedup_is_a_ratio_of_summed_times():
    pairs = [
        ({"decode_s": 1.0}, {"decode_s": 2.0, "visual_tokens": 10}),
        ({"decode_s": 1.0}, {"decode_s": 4.0, "visual_tokens": 1000}),
    ]
    assert report_plots.binned_speedup(pairs, num_bins=2) == [(10.0, 2.0, 1), (1000.0, 4.0, 1)]


def pair(decode_method: float, decode_vanilla: float, visual: int, new_tokens: int | None = 20) -> tuple[dict, dict]:
    vanilla = {"decode_s": decode_vanilla, "visual_tokens": visual}
    if new_tokens is not None:
        vanilla["num_new_tokens"] = new_tokens
    return {"decode_s": decode_method}, vanilla


def test_few_distinct_visual_token_counts_give_one_point_each():
    # the demo's lengths: 2 samples at 64 and 2,048, one at 256, 1,024 and 4,096; quantile bins
    # would merge some of them, one point per count keeps all five
    pairs = [pair(1.0, 2.0, 64), pair(1.0, 4.0, 64), pair(1.0, 1.5, 256), pair(2.0, 1.0, 1024),
             pair(4.0, 2.0, 2048), pair(4.0, 2.0, 2048), pair(4.0, 1.0, 4096)]
    assert report_plots.binned_speedup(pairs) == [
        (64.0, 3.0, 2), (256.0, 1.5, 1), (1024.0, 0.5, 1), (2048.0, 0.5, 2), (4096.0, 0.25, 1)]


def test_short_vanilla_answers_are_left_out_of_the_length_curve():
    pairs = [pair(1.0, 2.0, 64, new_tokens=1), pair(1.0, 3.0, 64, new_tokens=8), pair(1.0, 9.0, 256, new_tokens=7),
             pair(1.0, 5.0, 512, new_tokens=None)]  # no field: kept
    assert report_plots.binned_speedup(pairs) == [(64.0, 3.0, 1), (512.0, 5.0, 1)]
    assert report_plots.binned_speedup(pairs[:1]) == []


def test_many_distinct_counts_keep_quantile_bins():
    pairs = [pair(1.0, 2.0, 100 + k) for k in range(10)]  # 10 distinct counts > 8
    bins = report_plots.binned_speedup(pairs, num_bins=2)
    assert [n for _, _, n in bins] == [5, 5] and [x for x, _, _ in bins] == [102.0, 107.0]


def test_length_plot_is_log_scaled_and_says_what_it_shows(tmp_path):
    pairs = {("cap", "sd_tree"): [pair(1.0, 2.0, 64), pair(4.0, 2.0, 4096)], ("mcq", "sd_tree"): [pair(1.0, 9.0, 64, 1)]}
    rows = [{"task": "cap", "method": "vanilla"}, {"task": "cap", "method": "sd_tree"}]
    data = report_plots.PlotInput(rows=rows, pairs=pairs, baseline="vanilla", out_dir=tmp_path)
    (plot,) = report_plots.speedup_vs_visual_tokens(data)
    assert plot.path.read_bytes()[:4] == b"\x89PNG"
    assert "log scale" in plot.caption and "fewer than 8 tokens are left out" in plot.caption


def test_length_tasks_come_last_in_their_order(runs, tmp_path):
    assert report.task_order({"b", "a", "len2", "len1"}, ("len1", "len2", "absent")) == ["a", "b", "len1", "len2"]
    summary = report.build_report(runs, tmp_path / "out", n_boot=200, plots=False, length_tasks=[MC])
    assert [r["task"] for r in summary["rows"]] == [CAP] * 3 + [MC] * 3
    assert row(summary, MC, "sd_tree")["decode_speedup"] == pytest.approx(2.0)  # still paired with vanilla
    assert f"The last tasks ({MC})" in (tmp_path / "out" / "leaderboard.md").read_text()


def test_summary_feeds_the_check_gate(summary):
    from lvspec_eval.reporting import check

    failures, _ = check.check_summary(summary, check.Gate(min_retention=0.9))
    assert all(line.startswith("FAIL lvspec on demo_") for line in failures)
    assert any("demo_mc: retention lower bound" in line for line in failures)


def test_custom_method_is_named_like_the_runner_names_it(runs, tmp_path):
    """method=custom,drafter=model,verifier=exact is row "custom:model+exact", matched to the
    stats records the runner labels that way, and lossless because its verifier is exact."""
    results = next((runs[1] / "demo").glob("*_results.json"))
    data = json.loads(results.read_text())
    data["config"]["model_args"] = "pretrained=demo,method=custom,drafter=model,verifier=exact"
    results.write_text(json.dumps(data))
    stats_file = runs[1] / "stats_sd.jsonl"
    stats_file.write_text(stats_file.read_text().replace('"method": "sd_tree"', '"method": "custom:model+exact"'))
    summary = report.build_report(runs, tmp_path / "o7", n_boot=100, plots=False)
    custom = row(summary, MC, "custom:model+exact")
    assert custom["lossless"] is True and custom["decode_speedup"] == pytest.approx(2.0)
    assert [r["method"] for r in summary["rows"] if r["task"] == MC] == ["vanilla", "lvspec", "custom:model+exact"]


def test_run_method_defaults_and_custom():
    assert report.run_method({}, "x") == "vanilla"
    assert (
        report.run_method({"method": "custom", "drafter": "sparrow", "verifier": "lvspec"}, "x")
        == "custom:sparrow+lvspec"
    )
    with pytest.raises(ValueError, match="method=custom without drafter"):
        report.run_method({"method": "custom", "drafter": "model"}, "results.json")
    assert report.is_lossless("lvspec", verifier="exact") is True
    assert report.is_lossless("sd_tree", verifier="fly") is False


def test_relevance_plot_separates_exact_loose_and_rejected_tokens(tmp_path):
    rec = {"kinds": ["loose", "exact", "pst", "target", "exact", "target"],
           "relevance": [0.1, 0.8, 0.4, 0.7, 0.6, None]}  # the last target token is a bonus: no draft token
    data = report_plots.PlotInput(rows=[{"method": "vanilla"}, {"method": "lvspec"}],
                                  pairs={("t", "lvspec"): [(rec, {})]}, baseline="vanilla", out_dir=tmp_path)
    relevance, loose = report_plots._relevance_by_kind(data)
    assert sum(loose.values()) == 1
    assert relevance == {("lvspec", "loose"): [0.1], ("lvspec", "exact"): [0.8, 0.6], ("lvspec", "rejected"): [0.7]}
    assert [p.name for p in report_plots.relevance_histogram(data)] == ["relevance"]


def test_token_records_from_either_layout():
    explicit = {"token_records": [{"token": 5, "text": " a", "kind": "loose", "relevance": 0.1}]}
    assert report_plots.token_records(explicit) == explicit["token_records"]
    parallel = {"tokens": [5, 6], "token_texts": [" a", " red"], "kinds": ["loose", "exact"], "relevance": [0.1, None]}
    none = {"replaced": None, "replaced_text": None}  # lists the record lacks read as None
    assert report_plots.token_records(parallel) == [
        {"token": 5, "text": " a", "kind": "loose", "relevance": 0.1, **none},
        {"token": 6, "text": " red", "kind": "exact", "relevance": None, **none},
    ]
    assert report_plots.token_records({"tokens": [1, 2]}) == []


def test_overruled_tokens_pair_the_draft_token_with_the_targets():
    rec = {"kinds": ["target", "exact", "target", "target", "target"], "token_texts": ["There", " is", " red", ".", " A"],
           "replaced": [None, None, 11, 12, None], "replaced_texts": [None, None, " blue", " and", None]}
    vanilla = {"kinds": ["target"] * 3, "replaced": [None] * 3}
    data = report_plots.PlotInput(rows=[{"method": "vanilla"}, {"method": "specvlm"}],
                                  pairs={("t", "specvlm"): [(rec, {}), (rec, {})], ("t", "vanilla"): [(vanilla, {})]},
                                  baseline="vanilla", out_dir=Path("unused"))
    (plot,) = report_plots.overruled_tokens(data)
    # the prefill's token and the bonus token (None) are not overruled draft tokens; vanilla drafts nothing
    assert plot.extra["top_overruled_tokens"] == {"specvlm": [["blue", "red", 2], ["and", ".", 2]]}
    assert "| specvlm | `blue` -> `red` | 2 |" in plot.markdown
    assert report_plots.overruled_tokens(report_plots.PlotInput(
        rows=[], pairs={("t", "vanilla"): [(vanilla, {})]}, baseline="vanilla", out_dir=Path("unused"))) == []


def test_divergence_of_exact_methods_is_reported(runs, tmp_path):
    """sd_tree in bf16 leaves vanilla's tokens on two captions: doc 1 at a near-tie (margins 0.1 and
    0.2: within 2 x 0.5), doc 2 where both margins are 3 logits (a bug); the report counts both and
    `check` can fail on the second (lvspec_eval/reporting/divergence.py)."""
    from lvspec_eval.reporting import divergence

    def with_margins(path, method, changes):
        recs = [json.loads(line) for line in path.read_text().splitlines()]
        for r in recs:
            r.update(dtype="bfloat16", margins=[3.0, 3.0, 3.0])
            if r["method"] == method and r["task"] == CAP and r["doc_id"] in changes:
                r.update(changes[r["doc_id"]])
        path.write_text("".join(json.dumps(r) + "\n" for r in recs))

    with_margins(runs[0].parent / "stats_shared.jsonl", "vanilla", {1: {"margins": [3.0, 0.2, 3.0]}})
    with_margins(runs[1] / "stats_sd.jsonl", "sd_tree", {1: {"tokens": [1, 5, 1], "margins": [3.0, 0.1, 3.0]},
                                                         2: {"tokens": [1, 2, 7]}})
    summary = report.build_report(runs, tmp_path / "out", n_boot=200, plots=False)
    cap = row(summary, CAP, "sd_tree")["divergence"]
    assert (cap["compared"], cap["diverged"], cap["near_tie"], cap["elsewhere"], cap["unclassified"]) == (4, 2, 1, 1, 0)
    assert (cap["dtype"], cap["tolerance"], cap["basis"]) == ("bfloat16", 0.5, "runs")
    assert row(summary, MC, "sd_tree")["divergence"]["diverged"] == 0
    assert "divergence" not in row(summary, CAP, "lvspec") and "divergence" not in row(summary, CAP, "vanilla")
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "## Divergence of exact methods" in md and "| demo_cap | sd_tree | bfloat16 | 0.5 | runs | 4 | 2 | 1 | 1 | 0 |" in md
    assert "max(4 * eps(dtype) * L, 0.001)" in md and "2@2 (3 / 3, elsewhere)" in md and "1@1 (0.1 / 0.2, near-tie)" in md
    assert "Divergence of exact methods" in (tmp_path / "out" / "leaderboard.html").read_text()
    (line,) = divergence.failures(summary)
    assert line.startswith("FAIL sd_tree on demo_cap: 1 of 4 samples first diverge")


# ---- plots: one look per method, the Pareto front, labels apart --------------------------------------

def all_figures(tmp_path, monkeypatch) -> dict[str, object]:
    """Every plot hook on data of every named method and a custom one; the figures by file name."""
    from lvspec_eval.decoding import methods

    names = [*methods.METHODS, "custom:model+loose"]
    rows = [{"task": "t", "method": m, "retention": 1.0 - 0.01 * k, "retention_ci": [0.9, 1.0],
             "decode_speedup": 1.0 + 0.02 * k} for k, m in enumerate(names)]
    rec = {"accepted_lengths": [1, 2, 3], "kinds": ["exact", "loose", "target"], "relevance": [0.5, 0.2, 0.7]}
    pairs = {("t", m): [(dict(rec, decode_s=1.0), {"decode_s": 2.0, "visual_tokens": v}) for v in (64, 256)]
             for m in names}
    figures = {}
    monkeypatch.setattr(report_plots, "_save", lambda fig, path: figures.setdefault(path.name, fig) and path)
    report_plots.draw_all(report_plots.PlotInput(rows=rows, pairs=pairs, baseline="vanilla", out_dir=tmp_path))
    return figures


def hex_color(c) -> str:
    from matplotlib.colors import to_hex

    return to_hex(c, keep_alpha=False)


def test_every_plot_draws_a_method_in_its_one_colour_and_marker(tmp_path, monkeypatch):
    """METHOD_STYLES is the one map: each method has the same colour (and marker, where a plot
    has markers) in the speed-vs-retention, speed-vs-length, tau and relevance plots."""
    figs = all_figures(tmp_path, monkeypatch)
    assert set(figs) == {"speedup_vs_retention.png", "speedup_vs_visual_tokens.png", "tau_distribution.png",
                         "relevance.png"}
    style = report_plots.method_style
    (ax,) = figs["speedup_vs_retention.png"].axes
    drawn = {(hex_color(line.get_color()), line.get_marker()) for line in ax.lines}
    labels = {t.get_text(): hex_color(t.get_color()) for t in ax.texts}
    for method in labels:
        assert (style(method)["color"], style(method)["marker"]) in drawn and labels[method] == style(method)["color"]
    assert len(labels) == len(report_plots.METHOD_STYLES) + 1  # every named method and the custom one
    (ax,) = figs["speedup_vs_visual_tokens.png"].axes
    curves = {line.get_label(): (hex_color(line.get_color()), line.get_marker()) for line in ax.lines}
    assert all(curves[m] == (style(m)["color"], style(m)["marker"]) for m in curves if not m.startswith("_"))
    (ax,) = figs["tau_distribution.png"].axes
    names = [t.get_text() for t in ax.get_xticklabels()]
    assert [hex_color(p.get_facecolor()) for p in ax.patches] == [style(m)["color"] for m in names]
    means = [(hex_color(line.get_color()), line.get_marker()) for line in ax.lines if line.get_marker() not in ("None", "o", "")]
    assert means == [(style(m)["color"], style(m)["marker"]) for m in names if style(m)["marker"] != "o"]
    (ax,) = figs["relevance.png"].axes
    for patch in ax.patches:
        method = patch.get_label().split(" ")[0]
        assert hex_color(patch.get_edgecolor() if patch.get_fill() is False else patch.get_facecolor()) == \
            style(method)["color"], patch.get_label()


def test_method_styles_are_distinct_and_fixed():
    from lvspec_eval.decoding import methods

    styles = report_plots.METHOD_STYLES
    assert set(methods.METHODS) <= set(styles)
    assert len({s["color"] for s in styles.values()}) == len({s["marker"] for s in styles.values()}) == len(styles)
    custom = report_plots.method_style("custom:sparrow+lvspec")
    assert custom == report_plots.method_style("custom:sparrow+lvspec")  # the same in every plot and run
    assert custom["color"] not in {s["color"] for s in styles.values()}


def test_pareto_staircase_runs_from_the_left_edge_to_the_bottom():
    front = [(0.9, 2.5), (0.99, 2.0), (1.0, 1.0)]
    assert report_plots.pareto_staircase(front, 0.8, 0.0) == [
        (0.8, 2.5), (0.9, 2.5), (0.9, 2.0), (0.99, 2.0), (0.99, 1.0), (1.0, 1.0), (1.0, 0.0)]
    assert report_plots.pareto_staircase([(1.0, 2.4)], 0.93, 0.9) == [(0.93, 2.4), (1.0, 2.4), (1.0, 0.9)]


def test_the_pareto_front_named_in_the_legend_is_drawn(tmp_path, monkeypatch):
    figs = all_figures(tmp_path, monkeypatch)
    (ax,) = figs["speedup_vs_retention.png"].axes
    (front,) = [line for line in ax.lines if line.get_label() == "Pareto front"]
    assert len(front.get_xdata()) >= 3  # a visible corner, not a one-point line
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["Pareto front"]


def test_spread_keeps_labels_apart_and_inside():
    assert report_plots.spread([0.1, 0.5]) == [0.1, 0.5]  # far apart: left where they are
    assert report_plots.spread([0.3, 0.3, 0.31], gap=0.1) == pytest.approx([0.3, 0.4, 0.5])
    assert report_plots.spread([0.95, 0.96, 0.97], gap=0.1, high=0.97) == pytest.approx([0.77, 0.87, 0.97])
    assert report_plots.spread([0.0], low=0.03) == [0.03]


def test_crowded_point_labels_do_not_overlap(tmp_path):
    """The demo's multiple-choice panel: five methods at retention 1.0 within 0.07x of speed."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.text import Text

    speeds = {"vanilla": 1.0, "sd_tree": 0.33, "specvlm": 0.34, "sparrow": 0.32, "fly": 0.34, "lvspec": 0.385}
    rows = [{"method": m, "retention": 1.0, "retention_ci": [1.0, 1.0], "decode_speedup": s} for m, s in speeds.items()]
    fig = Figure(figsize=(4.5, 4))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    report_plots._speedup_retention_axes(ax, rows, "synthvid_mcq")
    fig.tight_layout()
    fig.canvas.draw()
    boxes = {t.get_text(): Text.get_window_extent(t) for t in ax.texts}  # the text alone, not its leader line
    assert len(boxes) == 6
    names = list(boxes)
    assert [(a, b) for i, a in enumerate(names) for b in names[i + 1:] if boxes[a].overlaps(boxes[b])] == []


def test_length_plot_states_the_baselines_quality_at_each_length(tmp_path):
    """A speedup where vanilla itself fails says little: the baseline's quality of each task that
    holds one visual-token count alone is read for the x labels; tasks mixing counts or with short
    answers (multiple choice) are not."""
    pairs = {("cap", "sd_tree"): [pair(1.0, 2.0, 64)], ("cap_long", "sd_tree"): [pair(1.0, 1.0, 4096)],
             ("mixed", "sd_tree"): [pair(1.0, 1.0, 100), pair(1.0, 1.0, 200)], ("mcq", "sd_tree"): [pair(1.0, 1.0, 64, 1)]}
    rows = [{"task": t, "method": "vanilla", "metric": "fidelity_f1", "quality": q}
            for t, q in (("cap", 1.0), ("cap_long", 0.14), ("mixed", 0.5), ("mcq", 0.9))]
    rows.append({"task": "cap", "method": "sd_tree", "metric": "fidelity_f1", "quality": 1.0})
    data = report_plots.PlotInput(rows=rows, pairs=pairs, baseline="vanilla", out_dir=tmp_path)
    assert report_plots.baseline_quality_by_visual_tokens(data) == {64.0: ("fidelity_f1", 1.0),
                                                                    4096.0: ("fidelity_f1", 0.14)}
    (plot,) = report_plots.speedup_vs_visual_tokens(data)
    assert "the baseline's quality there" in plot.caption


# ---- one story: the time breakdown reads the leaderboard's pairs, cold starts apart -------------------

def _rewrite_stats(path: Path, change) -> None:
    recs = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps(change(r) or r) + "\n" for r in recs))


def test_time_breakdown_and_leaderboard_use_the_same_baseline_arms(runs, tmp_path):
    """vanilla's own run is slow (3 s a request) while the vanilla decodes paired beside sd_tree take
    2 s, and sd_tree 1 s: the leaderboard says 2x (paired), and the breakdown must put the same
    baseline arms beside sd_tree (not vanilla's own 3 s, nor a slower-looking sd_tree). Each process's
    first request (request_index 0: 10 s on both arms) is left out of both and counted."""
    order = {}

    def vanilla_own(r):
        if r["method"] == "vanilla":
            r.update(e2e_s=3.0, decode_s=2.5, request_index=order.setdefault(("v", r["task"], r["doc_id"]), len(order)))

    def paired(r):
        index = order.setdefault(("s", r["task"], r["doc_id"]), len(order))
        cold = r["task"] == MC and r["doc_id"] == 0
        r.update(request_index=0 if cold else index + 100, e2e_s=10.0 if cold else 1.0, decode_s=0.5,
                 vanilla_e2e_s=10.0 if cold else 2.0, vanilla_decode_s=1.5, vanilla_prefill_s=0.4,
                 vanilla_num_new_tokens=r["num_new_tokens"])

    _rewrite_stats(runs[0].parent / "stats_shared.jsonl", vanilla_own)
    _rewrite_stats(runs[1] / "stats_sd.jsonl", paired)
    summary = report.build_report(runs, tmp_path / "out", plots=False)
    sd = row(summary, MC, "sd_tree")
    assert (sd["timing"], sd["n_timed"], sd["cold_starts"]) == ("paired", 5, 1)
    assert sd["e2e_speedup"] == pytest.approx(2.0) and sd["e2e_speedup_total"] == pytest.approx(2.0)
    assert sd["time_breakdown"]["e2e"] == pytest.approx(1.0)  # the cold 10 s request is not in the mean
    assert sd["baseline_time_breakdown"]["e2e"] == pytest.approx(2.0)  # the paired arms, not the own run's 3 s
    assert sd["baseline_time_breakdown"]["draft preparation"] == 0.0
    cells = {(c[0], c[1]): c for c in report_overview.breakdown_cells(summary["rows"], "vanilla")}
    assert cells[(MC, "sd_tree")][2] == "5 (1)" and cells[(MC, "sd_tree")][-3] == "1000.0"
    assert (MC, "vanilla (own run)") in cells  # vanilla's own line is labelled as such
    # every cell: baseline ms/token over the method's is the row's summed per-token speedup, and it points
    # the same way as the leaderboard's verdict
    for r in summary["rows"]:
        cell = cells.get((r["task"], r["method"]))
        if cell is None or r["method"] == "vanilla":
            continue
        ratio = float(cell[-1]) / float(cell[-2])
        assert ratio == pytest.approx(r["e2e_speedup_total"], rel=0.01), (r["task"], r["method"])
        if r["e2e_verdict"] in ("faster", "slower"):
            assert (ratio > 1) == (r["e2e_verdict"] == "faster")
    md = (tmp_path / "out" / "leaderboard.md").read_text()
    assert "| demo_mc | sd_tree | 5 (1) |" in md and "baseline ms/token" in md


def test_a_first_request_decoded_after_a_warm_up_is_timed():
    """warmup=true (the default) decodes a process's first request once untimed before timing it: that
    request is warm and counts; without the warm-up it is a cold start and is left out."""
    from lvspec_eval.reporting.speed import is_cold

    assert is_cold({"request_index": 0}, {"request_index": 5})
    assert is_cold({"request_index": 0, "warmed_up": False}, {})
    assert not is_cold({"request_index": 0, "warmed_up": True}, {"request_index": 0, "warmed_up": True})
    assert not is_cold({"request_index": 3}, {})


def test_time_breakdown_carries_the_engines_cost_per_step():
    """Host work and host syncs per decode step (stats records) reach the breakdown, pooled by requests;
    records from before the count leave the cells empty rather than read as zero."""
    def rec(overhead_ms, syncs):
        return {"e2e_s": 1.0, "decode_s": 0.5, "num_new_tokens": 10, "timed_steps": 4,
                "overhead_step_ms": overhead_ms, "host_syncs_per_step": syncs}

    one = report_overview.breakdown_fields([rec(1.0, 1.0), rec(3.0, 2.0)])
    two = report_overview.breakdown_fields([rec(5.0, 3.0)])
    assert (one["host_ms_per_step"], one["host_syncs_per_step"]) == (2.0, 1.5)
    pooled = report_overview.pooled_breakdown([one, two])
    assert pooled["host_ms_per_step"] == pytest.approx(3.0) and pooled["host_syncs_per_step"] == pytest.approx(2.0)
    old = report_overview.breakdown_fields([{"e2e_s": 1.0, "decode_s": 0.5, "num_new_tokens": 10}])
    assert "host_ms_per_step" not in old and "host_ms_per_step" not in report_overview.pooled_breakdown([one, old])
    row = {"task": "t", "method": "m", "time_breakdown": one, "baseline_time_breakdown": one}
    cell = report_overview.breakdown_cells([row], "vanilla")[0]
    headers = report_overview.BREAKDOWN_HEADERS
    assert cell[headers.index("host ms/step")] == "2.00" and cell[headers.index("host syncs/step")] == "1.5"
