"""The report as a person sees it: real HTML tables (never a table in <pre>), a summary first, a
leaderboard that fits its column budget (a 1280 px window), on the committed demo runs."""
from __future__ import annotations

from html.parser import HTMLParser
from pathlib import Path

import pytest

from lvspec_eval.reporting import overview as report_overview
from lvspec_eval.reporting import report
from lvspec_eval.measure import demo_run

ROOT = Path(__file__).resolve().parent.parent
DEMO_RUNS = ROOT / "results" / "demo" / "runs"


class PageParser(HTMLParser):
    """Tables by id (rows of cells, a cell's lines), headings and <pre> texts, in page order."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[list[str]]]] = {}
        self.order: list[str] = []  # "h1:...", "h2:...", "table:<id>", "details:<summary>"
        self.pre_texts: list[str] = []
        self.tables_in_pre = 0
        self._stack: list[str] = []
        self._table: list | None = None
        self._cell: list[str] | None = None
        self._text = ""

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        self._stack.append(tag)
        if tag == "table":
            self.tables_in_pre += "pre" in self._stack[:-1]
            key = attrs.get("id") or f"table{len(self.tables)}"
            self._table = self.tables.setdefault(key, [])
            self.order.append(f"table:{key}")
        elif tag == "tr" and self._table is not None:
            self._table.append([])
        elif tag in ("td", "th") and self._table is not None:
            self._cell = [""]
        elif tag == "br" and self._cell is not None:
            self._cell.append("")
        if tag in ("h1", "h2", "summary", "pre"):
            self._text = ""
        if tag == "br":
            self._stack.pop()

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self._table[-1].append([line.strip() for line in self._cell])
            self._cell = None
        elif tag == "table":
            self._table = None
        elif tag in ("h1", "h2", "summary"):
            self.order.append(f"{tag}:{self._text.strip()}")
        elif tag == "pre":
            self.pre_texts.append(self._text)
        if self._stack and self._stack[-1] == tag:
            self._stack.pop()

    def handle_data(self, data):
        self._text += data
        if self._cell is not None:
            self._cell[-1] += data


def parse(page: str) -> PageParser:
    parser = PageParser()
    parser.feed(page)
    return parser


def page_problems(page: str) -> list[str]:
    """What a reader would trip over; [] for a good page."""
    p = parse(page)
    out = []
    if p.tables_in_pre or any("|---" in t or t.count("|") > 4 for t in p.pre_texts):
        out.append("a table shown as preformatted text")
    if "table:recommended" not in p.order or not p.tables["recommended"][1:]:
        out.append("no summary table")
    elif p.order.index("table:recommended") > min(i for i, o in enumerate(p.order) if o.startswith("table:")):
        out.append("the summary is not the first table")
    board = p.tables.get("leaderboard")
    if not board:
        return out + ["no leaderboard"]
    if len(board[0]) > report_overview.COLUMN_BUDGET:
        out.append(f"leaderboard has {len(board[0])} columns > {report_overview.COLUMN_BUDGET}")
    for row in board:
        for k, cell in enumerate(row):
            limit = report_overview.METHOD_CHARS if k == 0 else report_overview.CELL_CHARS
            out += [f"leaderboard cell line {line!r} longer than {limit}" for line in cell if len(line) > limit]
    return out


@pytest.fixture(scope="module")
def demo_page(tmp_path_factory) -> str:
    if not DEMO_RUNS.is_dir():
        pytest.skip("no committed demo runs")
    out = tmp_path_factory.mktemp("demo_report")
    report.build_report(sorted(DEMO_RUNS.iterdir()), out, n_boot=200, plots=False, length_tasks=demo_run.LENGTH_TASKS)
    return (out / "leaderboard.html").read_text(encoding="utf-8")


def test_demo_report_reads_at_a_glance(demo_page):
    assert page_problems(demo_page) == []
    p = parse(demo_page)
    assert p.order[1].startswith("h2:Summary")
    board = p.tables["leaderboard"]
    assert board[0][0] == ["method"] and [r[0] for r in board[1:]][:2] == [["vanilla"], ["sd_tree"]]
    assert {"table:full-table", "table:length-table"} <= set(p.order)  # the full tables stay, collapsed
    assert demo_page.index("<details") < demo_page.index('id="full-table"')


def test_the_checker_catches_what_it_should(demo_page):
    assert page_problems(demo_page.replace('id="recommended"', 'id="x"')) == ["no summary table"]
    in_pre = demo_page.replace("</body>", "<pre>| a | b |\n|---|---|\n| 1 | 2 |</pre></body>")
    assert page_problems(in_pre) == ["a table shown as preformatted text"]
    wide_head = "<th>method</th>" + "".join(f"<th>t{i}</th>" for i in range(report_overview.COLUMN_BUDGET))
    wide = demo_page.replace("<th>method</th>", wide_head, 1)
    assert any("columns >" in line for line in page_problems(wide))


def _row(method, task="cap", e2e=1.0, **extra):
    row = {"task": task, "method": method, "e2e_speedup": e2e, "decode_speedup": e2e, "retention": 1.0,
           "retention_ci": [0.995, 1.0], "non_inferior": True, "failed": 0, "lossless": method != "fly",
           "exact_match_rate": 1.0 if method != "fly" else 0.9, "tau": 2.0, "margin": 0.01}
    return {**row, **extra}


def test_recommend_picks_the_fastest_qualifying_method():
    rows = [_row("vanilla"), _row("sd_tree", e2e=1.3), _row("fly", e2e=1.8),
            _row("lvspec", e2e=2.5, non_inferior=False), _row("sparrow", e2e=3.0, failed=1)]
    (pick,) = report_overview.recommend(rows, "vanilla")
    assert pick["row"]["method"] == "fly"
    (pick,) = report_overview.recommend(rows, "vanilla", lossless_tasks=["cap"])
    assert pick["row"]["method"] == "sd_tree"  # fly changes outputs
    slow = [_row("vanilla"), _row("sd_tree", e2e=0.8)]
    assert report_overview.recommend(slow, "vanilla")[0]["row"]["method"] == "vanilla"
    assert any("1 failed" in line for line in report_overview.problems(rows, "vanilla"))


def test_phases_read_new_and_old_stats_records():
    old = {"preprocess_s": 0.1, "prefill_s": 0.2, "draft_prefill_s": 0.3, "prune_s": 0.05, "decode_s": 0.4,
           "e2e_s": 1.05}
    assert report_overview.phase_seconds(old)["draft preparation"] == pytest.approx(0.3)
    assert report_overview.phase_seconds(old)["other"] == pytest.approx(0.0)
    new = {**old, "draft_prepare_s": 0.45, "draft_vision_s": 0.1, "e2e_s": 1.3}
    phases = report_overview.phase_seconds(new)
    assert phases["draft preparation"] == pytest.approx(0.4) and phases["pruning"] == pytest.approx(0.05)
    assert phases["other"] == pytest.approx(0.15) and phases["e2e"] == pytest.approx(1.3)


def test_many_tasks_become_task_groups():
    rows = [_row(m, task=t, visual_tokens=v, mean_new_tokens=n) for t, v, n in
            (("a", 64, 40), ("b", 4096, 40), ("c", 64, 1), ("d", 64, 40), ("e", 2048, 40))
            for m in ("vanilla", "sd_tree")]
    assert report_overview.columns(rows, "vanilla") == {"short videos": ["a", "d"], "long videos": ["b", "e"],
                                                        "multiple choice": ["c"]}
    headers, cells = report_overview.leaderboard(rows, "vanilla")
    assert headers == ["method", "short videos", "long videos", "multiple choice", "tau", "e2e overall",
                       "decode overall"]
    assert cells[1][1] == "1.00x\nret 1.000"
    # the baseline against itself is exactly 1, also where its pooled requests are too few for an interval
    for r in rows:
        r["e2e_paired_s_per_token"] = [[1.0, 1.0]]
    assert report_overview.leaderboard(rows, "vanilla")[1][0][1] == "1.00x\nret 1.000"


def test_a_speedup_whose_interval_holds_one_is_not_claimed():
    unclear = _row("sparrow", e2e=1.3, e2e_speedup_ci=[0.9, 1.6], e2e_verdict="no clear difference")
    clear = _row("sd_tree", e2e=1.1, e2e_speedup_ci=[1.05, 1.2], e2e_verdict="faster")
    (pick,) = report_overview.recommend([_row("vanilla"), unclear], "vanilla")
    assert pick["row"]["method"] == "vanilla" and pick["reason"] == "no non-inferior method is clearly faster"
    (pick,) = report_overview.recommend([_row("vanilla"), unclear, clear], "vanilla")
    assert pick["row"]["method"] == "sd_tree"
    assert report_overview.speed_lines(1.3, [0.9, 1.6]) == ["≈1 (1.30x)", "[0.900, 1.600]"]
    assert report_overview.speed_lines(0.8, [0.7, 0.998]) == ["0.80x", "[0.700, 0.998]"]  # clearly slower
    assert report_overview.speed_lines(1.0, [1.0, 1.0]) == ["1.00x"]  # the baseline against itself


def test_a_task_group_pools_its_requests():
    a = _row("sd_tree", task="a", e2e=2.0, e2e_speedup_ci=[2.0, 2.0], e2e_verdict="faster",
             e2e_paired_s_per_token=[[2.0, 1.0]] * 5)
    b = _row("sd_tree", task="b", e2e=0.5, e2e_speedup_ci=[0.5, 0.5], e2e_paired_s_per_token=[[1.0, 2.0]])
    speed, ci, verdict = report_overview.pooled_speedup([a, b])
    # 5 requests at 2x, 1 at 0.5x: median 2, the interval over 6 is the min-max range: it holds 1
    assert speed == 2.0 and ci == [0.5, 2.0] and verdict == "no clear difference"
    assert report_overview.pooled_speedup([a]) == (2.0, [2.0, 2.0], "faster")  # one task: its own row's figures
    four = _row("sd_tree", task="c", e2e_paired_s_per_token=[[2.0, 1.0]] * 2)
    assert report_overview.pooled_speedup([four, four])[2] == "too few requests"


def test_too_few_requests_never_reads_as_a_speedup():
    assert report_overview.speed_lines(1.1, [float("nan")] * 2, "too few requests") == ["(1.10x)", "too few requests"]
    assert report_overview.speed_text(1.1, None, "too few requests") == "(1.10x) too few requests"


def test_the_summary_never_recommends_a_speedup_over_too_few_requests():
    few = _row("sd_tree", e2e=1.8, e2e_speedup_ci=[float("nan")] * 2, e2e_verdict="too few requests")
    (pick,) = report_overview.recommend([_row("vanilla"), few], "vanilla")
    assert pick["row"]["method"] == "vanilla"
    assert report_overview.recommend_cells([{"task": "cap", "row": few, "reason": "x"}])[0][2] == \
        "(1.80x) too few requests"
