"""Where an exact method's output leaves vanilla's: a near-tie (numerics) or a bug.

An exact (lossless) method commits the target's greedy token at every slot, so it must reproduce
vanilla's tokens. In fp32 on one device it does. In bf16 or fp16, and wherever vanilla and tree
verification run different kernels (a GPU's one-token and many-token attention, a two-part
prefill), the target's logits at a slot differ between the two runs by rounding; where its top
two logits are closer than that, the runs can commit different tokens, and from there on they
continue differently. A divergence is therefore judged at the FIRST slot where the two runs commit
different tokens: each run's stats record gives, per committed token, the target's margin there
("margins": top-1 minus top-2 logit at the slot where the token was committed; a paired-timing
record carries vanilla's as "vanilla_margins"). If either run's margin at that slot is below the
dtype's tolerance, the divergence is a near-tie (numerics); if neither is, it is "elsewhere": a
bug to report. Where one run stopped at that slot (EOS or a stop string: the EOS is not among the
committed tokens, so it has no margin), the other run's margin decides alone; where neither margin
is known (records written before margins existed) the divergence is "unclassified".

Why "either" suffices, and why a large margin proves a bug: if rounding moves a logit by at most
delta, a token swap at a slot needs the gap between the two tokens to be below about 2 delta in
both runs, so both margins are small. A run whose margin exceeds the tolerance there cannot have
lost its token to rounding.

Tolerance (one place: TOLERANCE_ULPS, LOGIT_SCALE, TOLERANCE_FLOOR, EPSILON):

    tolerance(dtype) = max(TOLERANCE_ULPS * eps(dtype) * LOGIT_SCALE, TOLERANCE_FLOOR)
                     = max(4 * eps * 16, 1e-3)

eps is the dtype's machine epsilon (2^-23 float32, 2^-10 float16, 2^-7 bfloat16); LOGIT_SCALE = 16
is a typical magnitude of a trained language model's top logits (the rounding step of a logit
scales with its size: for bfloat16 at 16 it is 0.125); 4 units in the last place allow for the
few roundings by which two kernels' results differ; the floor 1e-3 covers reduction-order
differences of fp32 kernels, which rounding at the logit's own scale (7.6e-6) does not. This gives
float32 0.001, float16 0.0625, bfloat16 0.5 (in logits). Tiny random-weight models have small
logits, so at their scale the tolerance is lenient; on trained models most slots have margins of
several logits, so a bug shows up as "elsewhere".

Pairing: a method's record is compared with the vanilla tokens decoded beside it in the same
process ("vanilla_tokens", model_arg paired_timing) when it has them, else with the vanilla run's
record of the same task and doc_id ("basis": "paired", "runs" or "mixed"). Failed samples (an
"error" on either side) are not compared.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass

TOLERANCE_ULPS = 4
LOGIT_SCALE = 16.0
TOLERANCE_FLOOR = 1e-3
EPSILON = {"float64": 2.0**-52, "float32": 2.0**-23, "float16": 2.0**-10, "bfloat16": 2.0**-7}
RULE = (f"tolerance(dtype) = max({TOLERANCE_ULPS} * eps(dtype) * {LOGIT_SCALE:g}, {TOLERANCE_FLOOR:g}) logits "
        "(eps: 2^-23 float32, 2^-10 float16, 2^-7 bfloat16); a divergence is a near-tie when either run's "
        "margin (top-1 minus top-2 logit) at the first differing slot is below it, else 'elsewhere' (a bug)")
NEAR_TIE, ELSEWHERE, UNCLASSIFIED = "near_tie", "elsewhere", "unclassified"
MAX_EXAMPLES = 5  # first divergences listed per row


def tolerance(dtype: str) -> float:
    """The near-tie tolerance in logits for a dtype name ("bfloat16", "torch.bfloat16", ...)."""
    name = str(dtype).removeprefix("torch.")
    if name not in EPSILON:
        raise ValueError(f"dtype {dtype!r} has no near-tie tolerance; known: {', '.join(EPSILON)}")
    return max(TOLERANCE_ULPS * EPSILON[name] * LOGIT_SCALE, TOLERANCE_FLOOR)


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
    """NEAR_TIE when a known margin is below tol, ELSEWHERE when every known one is not, and
    UNCLASSIFIED when none is known (or the dtype, and so tol, is not)."""
    known = [m for m in margins if m is not None]
    if not known or tol is None:
        return UNCLASSIFIED
    return NEAR_TIE if min(known) < tol else ELSEWHERE


def _at(values: list | None, index: int) -> float | None:
    return float(values[index]) if values is not None and index < len(values) and values[index] is not None else None


def _tolerance_of(*dtypes: str | None) -> float | None:
    """The larger tolerance of the two runs' dtypes; None when a dtype is unknown."""
    if any(d is None for d in dtypes):
        return None
    return max(tolerance(d) for d in dtypes)


def vanilla_side(method_rec: Mapping, vanilla_rec: Mapping | None) -> tuple[list | None, list | None, str | None, str]:
    """(tokens, margins, dtype, basis) of the vanilla output the method record is compared with."""
    if method_rec.get("vanilla_tokens") is not None:
        return method_rec["vanilla_tokens"], method_rec.get("vanilla_margins"), method_rec.get("dtype"), "paired"
    if vanilla_rec is None or vanilla_rec.get("error"):
        return None, None, None, "runs"
    return vanilla_rec.get("tokens"), vanilla_rec.get("margins"), vanilla_rec.get("dtype"), "runs"


def compare(method_rec: Mapping, vanilla_rec: Mapping | None) -> tuple[str | None, Divergence | None]:
    """(basis, divergence) for one sample; basis None when it cannot be compared (an error, or no
    tokens on a side); divergence None when the tokens are identical."""
    tokens, margins, dtype, basis = vanilla_side(method_rec, vanilla_rec)
    if method_rec.get("error") or method_rec.get("tokens") is None or tokens is None:
        return None, None
    index = first_difference(list(method_rec["tokens"]), list(tokens))
    if index is None:
        return basis, None
    mine, theirs = _at(method_rec.get("margins"), index), _at(margins, index)
    tol = _tolerance_of(method_rec.get("dtype"), dtype)
    kind = classify((mine, theirs), tol)
    return basis, Divergence(*pair_key(method_rec), index, mine, theirs, method_rec.get("dtype"), tol, kind)


def count(pairs: Iterable[tuple[Mapping, Mapping | None]]) -> dict:
    """Counts over (method record, vanilla record or None) pairs: compared, diverged, near_tie,
    elsewhere, unclassified, the dtypes and tolerance seen, the pairing basis, and the first
    divergences (bugs first, then by doc)."""
    compared, bases, dtypes, found = 0, set(), set(), []
    for method_rec, vanilla_rec in pairs:
        basis, div = compare(method_rec, vanilla_rec)
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
    tols = [tolerance(d) for d in dtypes if d.removeprefix("torch.") in EPSILON]
    return {"compared": compared, "diverged": len(found), **kinds, "dtype": ",".join(sorted(dtypes)) or None,
            "tolerance": max(tols) if tols else None,
            "basis": None if not bases else bases.pop() if len(bases) == 1 else "mixed",
            "first_divergences": [asdict(d) for d in found[:MAX_EXAMPLES]]}


def pair_key(rec: Mapping, position: int | None = None) -> tuple[str, str]:
    """(task, doc_id) of a stats record; bench records carry "sample" instead of doc_id, and a
    record with neither is paired by its position in the list."""
    doc = rec.get("doc_id", rec.get("sample", position))
    return str(rec.get("task")), str(doc)


def _is_exact(method: str) -> bool:
    from lvspec_eval.report import is_lossless  # report imports this module

    return is_lossless(method)


def divergence_summary(records_by_method: Mapping[str, Iterable[Mapping]], baseline: str = "vanilla",
                       exact: Callable[[str], bool] | None = None) -> dict:
    """For each exact method in records_by_method (method -> its stats records), how many samples
    diverge from the baseline's and how: {"rule", "tolerances", "methods": {method: count(...)},
    "elsewhere": total over methods}. Records pair by task and doc_id (see pair_key); a method
    record with "vanilla_tokens" is compared with those. exact: which methods to judge (default:
    report.is_lossless)."""
    exact = exact or _is_exact
    if baseline not in records_by_method:
        raise ValueError(f"no {baseline!r} records (the baseline); methods given: {', '.join(records_by_method)}")
    vanilla = {pair_key(r, i): r for i, r in enumerate(records_by_method[baseline])}
    methods = {}
    for method, records in records_by_method.items():
        if method == baseline or not exact(method):
            continue
        methods[method] = count((r, vanilla.get(pair_key(r, i))) for i, r in enumerate(records))
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


def markdown_section(rows: Iterable[Mapping]) -> str:
    """The report's divergence table ('' when no exact method was compared)."""
    cells = table_cells(rows)
    if not cells:
        return ""
    lines = ["## Divergence of exact methods from the baseline", "",
             "Samples whose committed tokens differ from the baseline's, judged at the first differing slot: "
             f"{RULE}. A bug count above 0 fails `lvspec-eval check`.", "",
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
            where = "" if first is None else (f"; first: doc {first['doc_id']} slot {first['index']}, margins "
                                              f"{_margin_cell(first['margin'])} / {_margin_cell(first['vanilla_margin'])}")
            out.append(f"FAIL {r['method']} on {r['task']}: {d[ELSEWHERE]} of {d['compared']} samples first diverge "
                       f"from the baseline where no margin is a near-tie (tolerance {_margin_cell(d.get('tolerance'))} "
                       f"for {d.get('dtype')}): a bug, not numerics{where}")
    return out
