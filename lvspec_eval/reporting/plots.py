"""Plots of the leaderboard report, as a list of hooks other code can extend.

A hook takes a `PlotInput` (the leaderboard rows and the per-sample decode statistics, paired
with vanilla's) and returns `Plot`s it has written under `PlotInput.out_dir`; a hook with nothing
to draw returns []. Add one with `PLOT_HOOKS.append(fn)`; the report embeds every plot in the
HTML page and lists it in summary.json. Figures use matplotlib's object API (`Figure`), which
renders with Agg and never touches pyplot's global state or needs a display.
"""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure

RecordPair = tuple[dict, dict]  # (method's decode-stats record, vanilla's) for one sample


@dataclass(frozen=True)
class PlotInput:
    rows: list[dict]  # summary.json rows
    pairs: dict[tuple[str, str], list[RecordPair]]  # (task, method) -> timed samples, paired
    baseline: str
    out_dir: Path
    length_tasks: tuple[str, ...] = ()  # tasks that vary only video length (report.py's docstring)


@dataclass(frozen=True)
class Plot:
    name: str
    path: Path | None  # the PNG, under out_dir; None for a hook that adds only markdown
    caption: str
    markdown: str = ""  # an extra section for leaderboard.md (e.g. a list of tokens)
    extra: dict = field(default_factory=dict)  # figures for summary.json
    table: tuple[list[str], list[list[str]]] | None = None  # (headers, cells) of a table-only hook


PlotHook = Callable[[PlotInput], list[Plot]]

# One colour and one marker per method, in every plot of every report: a method looks the same
# whichever methods a run includes. Every hook draws a method through method_style.
METHOD_STYLES: dict[str, dict[str, str]] = {
    "vanilla": {"color": "#555555", "marker": "o"},
    "sd_tree": {"color": "#1f77b4", "marker": "s"},
    "specvlm": {"color": "#ff7f0e", "marker": "^"},
    "sparrow": {"color": "#2ca02c", "marker": "D"},
    "fly": {"color": "#d62728", "marker": "v"},
    "lvspec": {"color": "#9467bd", "marker": "*"},
    "mtp": {"color": "#e6ab02", "marker": "8"},
    "sage": {"color": "#a6761d", "marker": "d"},
    "std": {"color": "#1b9e77", "marker": "H"},
}
# Methods without an entry (custom:<drafter>+<verifier>, a new method): a colour and a marker
# picked from the name's checksum, so they too stay the same from plot to plot and run to run.
EXTRA_COLORS = ("#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#393b79", "#637939", "#843c39")
EXTRA_MARKERS = ("P", "X", "h", "<", ">", "p")


def method_style(method: str) -> dict[str, str]:
    """{"color", "marker"} of `method` (METHOD_STYLES, else fixed by the name)."""
    if method in METHOD_STYLES:
        return dict(METHOD_STYLES[method])
    key = zlib.crc32(method.encode("utf-8"))
    return {"color": EXTRA_COLORS[key % len(EXTRA_COLORS)], "marker": EXTRA_MARKERS[key % len(EXTRA_MARKERS)]}


def _save(fig: Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def pareto_front(points: list[tuple[float, float]]) -> list[int]:
    """Indices of the points no other point beats on both axes (both larger is better), ordered
    by the first coordinate."""
    front = []
    for i, (x, y) in enumerate(points):
        beaten = any((x2 >= x and y2 >= y) and (x2 > x or y2 > y) for j, (x2, y2) in enumerate(points) if j != i)
        if not beaten:
            front.append(i)
    return sorted(front, key=lambda i: points[i])


def pareto_staircase(front: list[tuple[float, float]], left: float, bottom: float) -> list[tuple[float, float]]:
    """The edge of the region the front dominates (both larger is better), from the left edge of
    the axes to its bottom: `front` ordered by the first coordinate, as pareto_front orders it.
    A front of one point is a corner, not a line of zero length."""
    out = [(left, front[0][1])]
    for k, (x, y) in enumerate(front):
        below = front[k + 1][1] if k + 1 < len(front) else bottom
        out += [(x, y), (x, below)]
    return out


LABEL_GAP = 0.075  # axes fraction between two stacked point labels (8 pt text in a ~300 px panel)


def spread(values: list[float], gap: float = LABEL_GAP, low: float = 0.03, high: float = 0.97) -> list[float]:
    """Label heights (axes fraction) as close to `values` (ascending) as they can be while at least
    `gap` apart, kept inside [low, high] when they fit."""
    out: list[float] = []
    for v in values:
        out.append(max(v, low, out[-1] + gap) if out else max(v, low))
    if out and out[-1] > high:
        out[-1] = high
        for k in range(len(out) - 2, -1, -1):
            out[k] = min(out[k], out[k + 1] - gap)
    return out


def _fraction(value: float, lim: tuple[float, float]) -> float:
    return (value - lim[0]) / (lim[1] - lim[0])


def _label_points(ax, names: list[str], points: list[tuple[float, float]]) -> None:
    """Name every point in its method's colour. Labels go beside their points (left of points in
    the right part of the panel), stacked apart where points crowd, joined by a leader line."""
    xlim, ylim = ax.get_xlim(), ax.get_ylim()
    placed = [(_fraction(x, xlim), _fraction(y, ylim), name, (x, y)) for name, (x, y) in zip(names, points)]
    for left_side in (False, True):
        side = sorted((p for p in placed if (p[0] > 0.6) == left_side), key=lambda p: p[1])
        for (fx, _, name, xy), fy in zip(side, spread([p[1] for p in side])):
            ax.annotate(name, xy, xytext=(fx - 0.05 if left_side else fx + 0.05, fy), textcoords="axes fraction",
                        ha="right" if left_side else "left", va="center", fontsize=8,
                        color=method_style(name)["color"], bbox={"boxstyle": "square,pad=0.1", "fc": "white",
                                                                  "ec": "none", "alpha": 0.85},
                        arrowprops={"arrowstyle": "-", "color": "grey", "lw": 0.6, "shrinkA": 1, "shrinkB": 4})


def _draw_front(ax, points: list[tuple[float, float]]) -> None:
    """The Pareto front as the staircase edge of the region it dominates, its points ringed."""
    xlim, ylim = ax.get_xlim(), ax.get_ylim()
    front = [points[i] for i in pareto_front(points)]
    if not front:
        return
    ax.plot(*zip(*pareto_staircase(front, xlim[0], ylim[0])), "--", color="grey", lw=1, zorder=1,
            label="Pareto front")
    ax.scatter(*zip(*front), s=220, facecolors="none", edgecolors="grey", lw=1, zorder=1)
    ax.set_xlim(xlim)
    ax.set_ylim(ylim)
    ax.legend(fontsize=8, loc="lower left")


def _speedup_retention_axes(ax, rows: list[dict], task: str) -> None:
    rows = [r for r in rows if r["retention"] is not None and r["decode_speedup"] is not None]
    points = [(r["retention"], r["decode_speedup"]) for r in rows]
    for r, (x, y) in zip(rows, points):
        lo, hi = r["retention_ci"] if r["retention_ci"][0] is not None else (x, x)
        style = method_style(r["method"])
        ax.errorbar(x, y, xerr=[[max(x - lo, 0.0)], [max(hi - x, 0.0)]], fmt=style["marker"], color=style["color"],
                    markersize=7, capsize=3, zorder=3)
    ax.margins(x=0.12, y=0.12)
    ax.autoscale_view()
    _draw_front(ax, points)
    _label_points(ax, [r["method"] for r in rows], points)
    ax.set_title(task)
    ax.set_xlabel("quality retention")
    ax.set_ylabel("decode speedup (x)")


def speedup_vs_retention(data: PlotInput) -> list[Plot]:
    """One panel per task: is a method's speed bought with quality? Length tasks (a few samples
    each) are left out unless there is nothing else."""
    tasks = sorted({r["task"] for r in data.rows})
    tasks = [t for t in tasks if t not in data.length_tasks] or tasks
    if not tasks:
        return []
    fig = Figure(figsize=(4.5 * len(tasks), 4))
    for k, task in enumerate(tasks):
        ax = fig.add_subplot(1, len(tasks), k + 1)
        _speedup_retention_axes(ax, [r for r in data.rows if r["task"] == task], task)
    path = _save(fig, data.out_dir / "speedup_vs_retention.png")
    return [
        Plot(
            "speedup_vs_retention",
            path,
            "Decode speedup against quality retention (bars: BCa interval); dashed: the Pareto front (ringed "
            "points), the edge of the region it dominates.",
        )
    ]


def _by_method(data: PlotInput) -> dict[str, list[RecordPair]]:
    """Timed pairs of every non-baseline method, all tasks pooled, in the leaderboard's order."""
    order = [m for m in dict.fromkeys(r["method"] for r in data.rows) if m != data.baseline]
    out: dict[str, list[RecordPair]] = {m: [] for m in order}
    for (_, method), pairs in data.pairs.items():
        if method in out:
            out[method].extend(pairs)
    return out


def _accepted_by_method(data: PlotInput) -> dict[str, list[int]]:
    out = {
        m: [int(a) for rec, _ in pairs for a in rec.get("accepted_lengths") or []]
        for m, pairs in _by_method(data).items()
    }
    return {m: v for m, v in out.items() if v}


def tau_distribution(data: PlotInput) -> list[Plot]:
    """Accepted draft tokens per step (bonus excluded), all tasks pooled; the mean is tau."""
    accepted = _accepted_by_method(data)
    if not accepted:
        return []
    fig = Figure(figsize=(1.6 * len(accepted) + 3, 4))
    ax = fig.add_subplot(1, 1, 1)
    boxes = ax.boxplot(list(accepted.values()), patch_artist=True, medianprops={"color": "black"})
    for k, (method, values) in enumerate(accepted.items()):
        style = method_style(method)
        boxes["boxes"][k].set(facecolor=style["color"], alpha=0.35, edgecolor=style["color"])
        ax.plot(k + 1, float(np.mean(values)), style["marker"], color=style["color"], markersize=9,
                markeredgecolor="black", zorder=3)
    ax.set_xticks(range(1, len(accepted) + 1), list(accepted), rotation=20)
    ax.set_ylabel("draft tokens accepted per step")
    ax.set_title("Accepted length per step (marker: mean = tau; line: median)")
    path = _save(fig, data.out_dir / "tau_distribution.png")
    return [Plot("tau_distribution", path, "Distribution of accepted draft tokens per step (bonus token excluded).")]


MIN_NEW_TOKENS = 8  # shorter vanilla answers (one-letter MC) measure drafting overhead, not length
MAX_DISTINCT_COUNTS = 8  # up to this many distinct visual-token counts: one point each


def on_length_curve(vanilla: dict, min_new_tokens: int = MIN_NEW_TOKENS) -> bool:
    """Whether a sample counts on the speed-vs-length curve: its visual-token count is known and
    vanilla's answer has at least `min_new_tokens` tokens (a record without the field counts)."""
    return vanilla.get("visual_tokens") is not None and (
        vanilla.get("num_new_tokens") is None or vanilla["num_new_tokens"] >= min_new_tokens)


def binned_speedup(
    pairs: list[RecordPair],
    num_bins: int = 5,
    max_distinct: int = MAX_DISTINCT_COUNTS,
    min_new_tokens: int = MIN_NEW_TOKENS,
) -> list[tuple[float, float, int]]:
    """(visual tokens, decode speedup, samples) per bin of vanilla's visual-token count, by count.

    Samples whose vanilla output has fewer than `min_new_tokens` generated tokens
    ("num_new_tokens") are left out: a one-token multiple-choice answer times the drafter's
    start-up, not how speed scales with length (a record without the field is kept). With at most
    `max_distinct` distinct counts (the demo's tasks, each at one length) every count is its own
    point at that count; with more (real benchmarks) the bins are `num_bins` quantiles, so each
    holds about as many samples, placed at their median count. Speedup is a ratio of summed times
    per generated token (summed seconds over summed tokens), as the report's.
    """
    pairs = [(m, v) for m, v in pairs if on_length_curve(v, min_new_tokens)]
    if not pairs:
        return []
    visual = np.array([float(v["visual_tokens"]) for _, v in pairs])
    distinct = np.unique(visual)
    if len(distinct) <= max_distinct:
        which = np.searchsorted(distinct, visual)
    else:
        edges = np.unique(np.quantile(visual, np.linspace(0, 1, num_bins + 1)))
        which = np.clip(np.searchsorted(edges, visual, side="right") - 1, 0, max(len(edges) - 2, 0))
    out = []
    for b in np.unique(which):
        sel = [p for p, w in zip(pairs, which) if w == b]
        method_s = sum(float(m["decode_s"]) for m, _ in sel)
        if method_s > 0:
            vanilla_s = sum(float(v["decode_s"]) for _, v in sel)
            out.append((float(np.median(visual[which == b])), vanilla_s / method_s * _length_factor(sel), len(sel)))
    return out


def _length_factor(pairs: list[RecordPair]) -> float:
    """method tokens / vanilla tokens, summed: turns a ratio of summed seconds into one of seconds per
    generated token (the report's definition of speed); 1 where a record lacks the count."""
    if not all(m.get("num_new_tokens") and v.get("num_new_tokens") for m, v in pairs):
        return 1.0
    return sum(float(m["num_new_tokens"]) for m, _ in pairs) / sum(float(v["num_new_tokens"]) for _, v in pairs)


def baseline_quality_by_visual_tokens(data: PlotInput) -> dict[float, tuple[str, float]]:
    """visual tokens -> (metric, the baseline's quality) for each task whose samples all have one
    visual-token count and answers long enough for the curve (the demo's caption tasks): a speedup
    at a length where the baseline itself fails (a demo target that cannot caption long videos)
    says little, so the plot states the baseline's quality beside each length."""
    out = {}
    for row in data.rows:
        if row["method"] != data.baseline or row.get("quality") is None:
            continue
        counts = {float(v["visual_tokens"]) for (task, _), pairs in data.pairs.items() if task == row["task"]
                  for _, v in pairs if on_length_curve(v)}
        if len(counts) == 1:
            out[counts.pop()] = (row["metric"], float(row["quality"]))
    return out


def speedup_vs_visual_tokens(data: PlotInput) -> list[Plot]:
    """Does a method's advantage grow with video length (the point of SpecVLM and Sparrow)?
    One curve per method, all tasks pooled (the demo: synthvid_caption at 64 visual tokens plus
    its length stage at 256 to 4,096), x on a log scale; see binned_speedup for the points."""
    curves = {m: binned_speedup(p) for m, p in _by_method(data).items()}
    curves = {m: c for m, c in curves.items() if c}
    if not curves:
        return []
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot(1, 1, 1)
    for method, curve in curves.items():
        ax.plot([c[0] for c in curve], [c[1] for c in curve], "-", label=method, **method_style(method))
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log")
    xs = sorted({c[0] for curve in curves.values() for c in curve})
    if len(xs) <= MAX_DISTINCT_COUNTS:  # label the measured counts themselves
        quality = baseline_quality_by_visual_tokens(data)
        ax.set_xticks(xs, [f"{x:,.0f}" + (f"\n{quality[x][1]:.2f}" if x in quality else "") for x in xs])
        ax.minorticks_off()
        metrics = sorted({metric for metric, _ in quality.values()})
        ax.set_xlabel("visual tokens (log scale)" + (
            f"; below: {data.baseline}'s {'/'.join(metrics)}" if quality else ""))
    else:
        ax.set_xlabel("visual tokens (bin median, log scale)")
    ax.set_ylabel("decode speedup over vanilla (x)")
    ax.legend(fontsize=8)
    path = _save(fig, data.out_dir / "speedup_vs_visual_tokens.png")
    caption = (
        "Decode speedup over vanilla against the number of visual tokens (log scale), all tasks pooled: one point "
        f"per distinct count (quantile bins when there are more than {MAX_DISTINCT_COUNTS}), each a ratio of summed "
        f"decode times per generated token; samples whose vanilla answer has fewer than {MIN_NEW_TOKENS} tokens are left out. Under "
        "each length that one task holds alone: the baseline's quality there."
    )
    return [Plot("speedup_vs_visual_tokens", path, caption)]


TOKEN_FIELDS = {  # token_records key -> the runner's parallel list
    "token": "tokens", "text": "token_texts", "kind": "kinds", "relevance": "relevance",
    "replaced": "replaced", "replaced_text": "replaced_texts",
}


def token_records(rec: dict) -> list[dict]:
    """Per committed token {"token", "text", "kind", "relevance", "replaced", "replaced_text"}: the
    record's "token_records", else zipped from the parallel lists the runner writes (missing
    lists give None)."""
    if rec.get("token_records") is not None:
        return rec["token_records"]
    n = len(rec.get("kinds") or [])
    columns = [(list(rec.get(name) or []) + [None] * n)[:n] for name in TOKEN_FIELDS.values()]
    return [dict(zip(TOKEN_FIELDS, values)) for values in zip(*columns)]


RELEVANCE_LABELS = {"exact": "exact", "loose": "loose", "target": "rejected"}  # record kind -> plot label
# The method's colour says which method; the look says which kind of token.
RELEVANCE_LOOKS = {
    "exact": {"histtype": "stepfilled", "alpha": 0.45},
    "loose": {"histtype": "step", "hatch": "//", "lw": 1.2},
    "rejected": {"histtype": "step", "lw": 2.0},
}


def _relevance_by_kind(data: PlotInput) -> tuple[dict[tuple[str, str], list[float]], Counter]:
    """(method, label) -> relevance values of exactly and loosely accepted tokens and of
    rejected draft tokens (a "target" record with a relevance: the target's token carries the
    relevance of the draft token it replaced); and the texts of loosely accepted tokens (all
    methods) with their counts."""
    relevance: dict[tuple[str, str], list[float]] = {}
    loose_texts: Counter = Counter()
    for method, pairs in _by_method(data).items():
        for rec, _ in pairs:
            for t in token_records(rec):
                if t.get("kind") == "loose":
                    loose_texts[t.get("text") or str(t.get("token"))] += 1
                if t.get("kind") in RELEVANCE_LABELS and t.get("relevance") is not None:
                    key = (method, RELEVANCE_LABELS[t["kind"]])
                    relevance.setdefault(key, []).append(float(t["relevance"]))
    return relevance, loose_texts


def relevance_histogram(data: PlotInput) -> list[Plot]:
    """Visual relevance of exactly accepted, loosely accepted and rejected draft tokens: loose
    acceptance should land on low-relevance fillers, not on visual anchors."""
    relevance, _ = _relevance_by_kind(data)
    if not relevance:
        return []
    fig = Figure(figsize=(6, 4))
    ax = fig.add_subplot(1, 1, 1)
    every = np.concatenate([np.asarray(v) for v in relevance.values()])
    bins = np.linspace(min(every.min(), 0.0), max(every.max(), 1.0), 31)  # shared, so kinds compare
    for (method, label), values in relevance.items():
        ax.hist(values, bins=bins, color=method_style(method)["color"], label=f"{method} {label} ({len(values)})",
                **RELEVANCE_LOOKS[label])
    ax.set_xlabel("visual relevance")
    ax.set_ylabel("draft tokens")
    ax.legend(fontsize=8)
    path = _save(fig, data.out_dir / "relevance.png")
    return [Plot("relevance", path, "Visual relevance of draft tokens, by method (colour): accepted exactly "
                 "(filled), accepted loosely (hatched), or rejected (thick outline: the target's token replaced "
                 "them).")]


def loose_tokens(data: PlotInput, top_k: int = 20) -> list[Plot]:
    """The tokens loose verification (FLy, LVSpec) accepts most often: fillers are expected,
    colours or object names are a warning sign. A table only, no figure."""
    _, loose_texts = _relevance_by_kind(data)
    top = loose_texts.most_common(top_k)
    if not top:
        return []
    lines = [f"| {i + 1} | `{text.strip() or repr(text)}` | {n} |" for i, (text, n) in enumerate(top)]
    markdown = "\n".join(
        [f"### {len(top)} most frequent loosely accepted tokens", "", "| # | token | count |", "|---|---|---|", *lines]
    )
    table = (["#", "token", "count"], [[str(i + 1), text.strip() or repr(text), str(n)] for i, (text, n) in enumerate(top)])
    return [Plot("loose_tokens", None, f"The {len(top)} most frequent loosely accepted tokens.", markdown,
                 {"top_loose_tokens": top}, table)]


def overruled_tokens(data: PlotInput, top_k: int = 10) -> list[Plot]:
    """Per method, the draft tokens the target overruled most often and what it said instead
    ("draft -> target"): where drafts break (a wrong colour, or just other wording that loose
    verification could have kept). A table only, no figure."""
    top = {}
    for method, pairs in _by_method(data).items():
        swaps = Counter((_shown(t.get("replaced_text"), t.get("replaced")), _shown(t.get("text"), t.get("token")))
                        for rec, _ in pairs for t in token_records(rec)
                        if t.get("kind") == "target" and t.get("replaced") is not None)
        if swaps:
            top[method] = swaps.most_common(top_k)
    if not top:
        return []
    lines = [f"| {method} | `{draft}` -> `{target}` | {n} |" for method, rows in top.items()
             for (draft, target), n in rows]
    markdown = "\n".join([f"### Draft tokens the target overruled most often (top {top_k} per method)", "",
                          "| method | draft -> target | count |", "|---|---|---|", *lines])
    table = (["method", "draft -> target", "count"],
             [[method, f"{draft} -> {target}", str(n)] for method, rows in top.items() for (draft, target), n in rows])
    return [Plot("overruled_tokens", None, f"Draft tokens the target overruled most often (top {top_k} per method).",
                 markdown, {"top_overruled_tokens": {m: [[d, t, n] for (d, t), n in rows] for m, rows in top.items()}},
                 table)]


def _shown(text: str | None, token) -> str:
    return (text.strip() or repr(text)) if text is not None else str(token)


PLOT_HOOKS: list[PlotHook] = [
    speedup_vs_retention,
    tau_distribution,
    speedup_vs_visual_tokens,
    relevance_histogram,
    loose_tokens,
    overruled_tokens,
]


def draw_all(data: PlotInput, hooks: list[PlotHook] | None = None) -> list[Plot]:
    data.out_dir.mkdir(parents=True, exist_ok=True)
    return [plot for hook in (PLOT_HOOKS if hooks is None else hooks) for plot in hook(data)]
