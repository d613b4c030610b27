"""Where an exact method's output leaves vanilla's: a near-tie (numerics) or a bug.

An exact (lossless) method commits the target's greedy token at every slot, so it must reproduce
vanilla's tokens. In fp32 on one device it does. In bf16 or fp16, and wherever vanilla and tree
verification run different kernels (a GPU's one-token and many-token attention), the target's
logits at a slot differ between the two runs by rounding; where its top two logits are closer
than that, the runs can commit different tokens, and from there on they continue differently. A divergence is therefore judged at the FIRST slot where the two runs commit
different tokens: each run's stats record gives, per committed token, the target's margin there
("margins": top-1 minus top-2 logit at the slot where the token was committed; a paired-timing
record carries vanilla's as "vanilla_margins").

The rule: a near-tie (numerics) when the two runs' margins at that slot sum to at most twice the
dtype's tolerance; otherwise "elsewhere": a bug to report. Why the sum: if rounding moves each
logit by at most delta between the runs, and run A commits X where run B commits Y, then
m_A <= X_A - Y_A and m_B <= Y_B - X_B, so m_A + m_B <= (X_A - X_B) + (Y_B - Y_A) <= 2 delta. Both
margins must be small, not just one; a run whose margin alone exceeds 2 delta there cannot have
lost its token to rounding. (This is stricter than "either margin below the tolerance", which it
implies: on the tests' tiny Qwen2.5-VL in bf16 with a verification that ignored the tree mask, at
the model's own logit scale, "either" called 5 of 6 first divergences near-ties, the sum 1.) Where
one run stopped at that slot (EOS or a stop string: the EOS is not among the committed tokens, so
it has no margin), its margin counts as 0 (the lenient side); where neither margin is known
(records from before margins existed) the divergence is "unclassified".

Tolerance (one place: TOLERANCE_ULPS, LOGIT_SCALE, TOLERANCE_FLOOR, EPSILON): the most rounding
can move a logit between two kernels' results,

    tolerance(dtype, L) = max(TOLERANCE_ULPS * eps(dtype) * L, TOLERANCE_FLOOR) = max(4 * eps * L, 1e-3)

eps is the dtype's machine epsilon (2^-23 float32, 2^-10 float16, 2^-7 bfloat16); L is the size
of the logits (a logit's rounding step grows with it): the records' "top_logits" at that slot
(the target's top-1 logit, the larger of the two runs') when they carry them, else the scale the
caller measured (`logit_scale`), else LOGIT_SCALE = 16, a typical top logit of a trained language
model; 4 units in the last place allow for the few roundings by which two kernels' results
differ; the floor 1e-3 covers reduction-order differences of fp32 kernels, which rounding at the
logit's own scale (7.6e-6) does not. At L = 16: float32 0.001, float16 0.0625, bfloat16 0.5. At a
tiny random model's scale (top logits near 6) bf16 gives 0.19: a default of 16 would be lenient
there, so tests pass the model's measured scale.

Pairing: a method's record is compared with the vanilla tokens decoded beside it in the same
process ("vanilla_tokens", model_arg paired_timing) when it has them, else with the vanilla run's
record of the same task and doc_id ("basis": "paired", "runs" or "mixed"). Failed samples (an
"error" on either side) are not compared.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

from lvspec_eval.reporting.runs import is_lossless

TOLERANCE_ULPS = 4
LOGIT_SCALE = 16.0
TOLERANCE_FLOOR = 1e-3
EPSILON = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
TOP_LOGITS = "top_logits"  # optional per-token record field: the target's top-1 logit at that slot
RULE = (f"tolerance = max({TOLERANCE_ULPS} * eps(dtype) * L, {TOLERANCE_FLOOR:g}) logits (eps: 2^-23 float32, "
        "2^-10 float16, 2^-7 bfloat16; L: the records' top-1 logit at the slot, else the given logit scale, "
        f"else {LOGIT_SCALE:g}); a divergence is a near-tie (numerics) when the two runs' margins (top-1 minus "
        "top-2 logit) at the first differing slot sum to at most 2 x tolerance, else 'elsewhere' (a bug)")
NEAR_TIE, ELSEWHERE, UNCLASSIFIED = "near_tie", "elsewhere", "unclassified"
MAX_EXAMPLES = 5  # first divergences listed per row


def tolerance(dtype: str, logit_scale: float = LOGIT_SCALE) -> float:
    """The most rounding moves a logit of size logit_scale, for a dtype name ("bfloat16",
    "torch.bfloat16", ...)."""
    name = str(dtype).removeprefix("torch.")
    if name not in EPSILON:
        raise ValueError(f"dtype {dtype!r} has no near-tie tolerance; known: {', '.join(EPSILON)}")
    return max(TOLERANCE_ULPS * EPSILON[name] * abs(logit_scale), TOLERANCE_FLOOR)


TOLERANCES = {name: tolerance(name) for name in EPSILON}


@dataclass(frozen=True)
class Divergence:
    """The first slot where a method's committed tokens leave vanilla's, and how it is judged."""

    task: str
    doc_id: str
    index: int  # the first differing slot (0 = the first generated token)
    margin: float | None  # the method run's margin there (None: it stopped there, or no margins)
    vanilla_margin: float | None
    dtype: str | None
    logit_scale: float
    tolerance: float | None
    kind: str  # NEAR_TIE, ELSEWHERE or UNCLASSIFIED


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (a length difference counts at the shorter
    one's end); None when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def classify(margins: Iterable[float | None], tol: float | None) -> str:
    """NEAR_TIE when the two runs' margins sum to at most 2 tol (an unknown one, where a run
    stopped, counts 0), ELSEWHERE otherwise, UNCLASSIFIED when neither is known (or the dtype, and
    so tol, is not)."""
    margins = list(margins)
    if all(m is None for m in margins) or tol is None:
        return UNCLASSIFIED
    return NEAR_TIE if sum(m or 0.0 for m in margins) <= 2 * tol else ELSEWHERE


def _at(values: list | None, index: int) -> float | None:
    return float(values[index]) if values is not None and index < len(values) and values[index] is not None else None


def _tolerance_of(dtypes: tuple[str | None, ...], logit_scale: float) -> float | None:
    """The larger tolerance of the two runs' dtypes; None when a dtype is unknown."""
    if any(d is None for d in dtypes):
        return None
    return max(tolerance(d, logit_scale) for d in dtypes)


def _scale_at(index: int, records: tuple[Mapping, ...], given: float | None) -> float:
    """The logit size at a slot: the larger top-1 logit the records carry there, else `given`,
    else LOGIT_SCALE."""
    tops = [abs(t) for t in (_at(r.get(TOP_LOGITS), index) for r in records) if t is not None]
    return max(tops) if tops else (given if given is not None else LOGIT_SCALE)


def vanilla_side(method_rec: Mapping, vanilla_rec: Mapping | None) -> tuple[dict | None, str]:
    """(the vanilla output the method record is compared with, as a record: tokens, margins,
    top_logits, dtype; basis). A paired-timing record carries it as vanilla_<key>."""
    if method_rec.get("vanilla_tokens") is not None:
        return {"tokens": method_rec["vanilla_tokens"], "margins": method_rec.get("vanilla_margins"),
                TOP_LOGITS: method_rec.get(f"vanilla_{TOP_LOGITS}"), "dtype": method_rec.get("dtype")}, "paired"
    if vanilla_rec is None or vanilla_rec.get("error") or vanilla_rec.get("tokens") is None:
        return None, "runs"
    return dict(vanilla_rec), "runs"


def compare(method_rec: Mapping, vanilla_rec: Mapping | None,
            logit_scale: float | None = None) -> tuple[str | None, Divergence | None]:
    """(basis, divergence) for one sample; basis None when it cannot be compared (an error, or no
    tokens on a side); divergence None when the tokens are identical. logit_scale: the size of the
    target's top logits, where the records carry no top_logits (default LOGIT_SCALE)."""
    vanilla, basis = vanilla_side(method_rec, vanilla_rec)
    if method_rec.get("error") or method_rec.get("tokens") is None or vanilla is None:
        return None, None
    index = first_difference(list(method_rec["tokens"]), list(vanilla["tokens"]))
    if index is None:
        return basis, None
    mine, theirs = _at(method_rec.get("margins"), index), _at(vanilla.get("margins"), index)
    scale = _scale_at(index, (method_rec, vanilla), logit_scale)
    tol = _tolerance_of((method_rec.get("dtype"), vanilla.get("dtype")), scale)
    return basis, Divergence(*pair_key(method_rec), index, mine, theirs, method_rec.get("dtype"), scale, tol,
                             classify((mine, theirs), tol))


def count(pairs: Iterable[tuple[Mapping, Mapping | None]], logit_scale: float | None = None) -> dict:
    """Counts over (method record, vanilla record or None) pairs: compared, diverged, near_tie,
    elsewhere, unclassified, the dtypes seen and their tolerance at logit_scale (each divergence
    lists its own), the pairing basis, and the first divergences (bugs first, then by doc)."""
    compared, bases, dtypes, found = 0, set(), set(), []
    for method_rec, vanilla_rec in pairs:
        basis, div = compare(method_rec, vanilla_rec, logit_scale)
        if basis is None:
            continue
        compared += 1
        bases.add(basis)
        if method_rec.get("dtype"):
            dtypes.add(str(method_rec["dtype"]))
        if div is not None:
            found.append(div)
    kinds = {k: sum(d.kind == k for d in found) for k in (NEAR_TIE, ELSEWHERE, UNCLASSIFIED)}
    found.sort(key=lambda d: (d.kind != ELSEWHERE, d.task, d.doc_id))
    scale = LOGIT_SCALE if logit_scale is None else logit_scale
    tols = [tolerance(d, scale) for d in dtypes if d.removeprefix("torch.") in EPSILON]
    return {"compared": compared, "diverged": len(found), **kinds, "dtype": ",".join(sorted(dtypes)) or None,
            "logit_scale": scale, "tolerance": max(tols) if tols else None,
            "basis": None if not bases else bases.pop() if len(bases) == 1 else "mixed",
            "first_divergences": [asdict(d) for d in found[:MAX_EXAMPLES]]}


def pair_key(rec: Mapping, position: int | None = None) -> tuple[str, str]:
    """(task, doc_id) of a stats record; bench records carry "sample" instead of doc_id, and a
    record with neither is paired by its position in the list."""
    doc = rec.get("doc_id", rec.get("sample", position))
    return str(rec.get("task")), str(doc)


def _is_exact(method: str) -> bool:

    return is_lossless(method)


def divergence_summary(records_by_method: Mapping[str, Iterable[Mapping]], baseline: str = "vanilla",
                       exact: Callable[[str], bool] | None = None, logit_scale: float | None = None) -> dict:
    """For each exact method in records_by_method (method -> its stats records), how many samples
    diverge from the baseline's and how: {"rule", "tolerances", "methods": {method: count(...)},
    "elsewhere": total over methods}. Records pair by task and doc_id (see pair_key); a method
    record with "vanilla_tokens" is compared with those. exact: which methods to judge (default:
    report.is_lossless). logit_scale: the target's typical top-1 logit, where records carry no
    top_logits (default LOGIT_SCALE)."""
    exact = exact or _is_exact
    if baseline not in records_by_method:
        raise ValueError(f"no {baseline!r} records (the baseline); methods given: {', '.join(records_by_method)}")
    vanilla = {pair_key(r, i): r for i, r in enumerate(records_by_method[baseline])}
    methods = {}
    for method, records in records_by_method.items():
        if method == baseline or not exact(method):
            continue
        methods[method] = count(((r, vanilla.get(pair_key(r, i))) for i, r in enumerate(records)), logit_scale)
    return {"rule": RULE, "tolerances": TOLERANCES, "methods": methods,
            "elsewhere": sum(m[ELSEWHERE] for m in methods.values())}


# ---- the report's side: one row per (task, exact method) -------------------------------------------

def row_fields(method_stats: Mapping[str, Mapping], vanilla_stats: Mapping[str, Mapping]) -> dict:
    """count() over one task's records (doc_id -> record on each side)."""
    return count((rec, vanilla_stats.get(doc)) for doc, rec in sorted(method_stats.items(), key=lambda kv: str(kv[0])))


def _margin_cell(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _examples_cell(div: Mapping) -> str:
    return (f"{div['doc_id']}@{div['index']} ({_margin_cell(div['margin'])} / {_margin_cell(div['vanilla_margin'])}, "
            f"{div['kind'].replace('_', '-')})")


TABLE_HEADERS = ("task", "method", "dtype", "tolerance", "basis", "compared", "diverged", "near-tie (numerics)",
                 "elsewhere (bug)", "unclassified", "first divergences: doc@slot (margin method / vanilla)")


def table_cells(rows: Iterable[Mapping]) -> list[list[str]]:
    """One line per row that carries a "divergence" dict (the exact methods)."""
    out = []
    for r in rows:
        d = r.get("divergence")
        if not d:
            continue
        out.append([r["task"], r["method"], d.get("dtype") or "-", _margin_cell(d.get("tolerance")),
                    d.get("basis") or "-", str(d["compared"]), str(d["diverged"]), str(d[NEAR_TIE]),
                    str(d[ELSEWHERE]), str(d[UNCLASSIFIED]),
                    "; ".join(_examples_cell(x) for x in d["first_divergences"]) or "-"])
    return out


SECTION_TITLE = "Divergence of exact methods from the baseline"
SECTION_NOTE = ("Samples whose committed tokens differ from the baseline's, judged at the first differing slot: "
                f"{RULE}. A bug count above 0 means an exact method is not lossless: report it.")


def markdown_section(rows: Iterable[Mapping]) -> str:
    """The report's divergence table ('' when no exact method was compared)."""
    cells = table_cells(rows)
    if not cells:
        return ""
    lines = [f"## {SECTION_TITLE}", "", SECTION_NOTE, "",
             "| " + " | ".join(TABLE_HEADERS) + " |", "|" + "---|" * len(TABLE_HEADERS)]
    return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells]) + "\n"


def failures(summary: Mapping) -> list[str]:
    """Lines for `lvspec-eval check`: each row of a report's summary.json whose exact method
    diverged from the baseline somewhere other than a near-tie."""
    out = []
    for r in summary.get("rows") or []:
        d = r.get("divergence") or {}
        if d.get(ELSEWHERE):
            first = next((x for x in d.get("first_divergences") or [] if x["kind"] == ELSEWHERE), None)
            where = "" if first is None else (
                f"; first: doc {first['doc_id']} slot {first['index']}, margins {_margin_cell(first['margin'])} / "
                f"{_margin_cell(first['vanilla_margin'])}")
            out.append(f"FAIL {r['method']} on {r['task']}: {d[ELSEWHERE]} of {d['compared']} samples first diverge "
                       f"from the baseline where the target's margins are too wide for rounding (tolerance "
                       f"{_margin_cell(d.get('tolerance'))} for {d.get('dtype')}): a bug, not numerics{where}")
    return out
