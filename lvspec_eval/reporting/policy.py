"""What the adaptive draft policy chose, per method: the report's "Draft policy" section.

Reads the per-step lists the stats records carry (plan_depth, plan_width, num_draft_nodes; see
decoding/stats.py) and the policy's end-of-sample estimates (policy). Methods with a fixed tree
shape have no plan lists and get no row.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

MAX_SHOWN_DEPTH = 12


def policy_fields(records: Iterable[dict]) -> dict | None:
    """Step counts per chosen depth (0 = no draft), mean width and nodes of drafting steps, and the
    last estimates of the run; None when no record carries a plan."""
    depths: Counter = Counter()
    widths, nodes = [], []
    estimates = None
    for rec in records:
        plan = rec.get("plan_depth")
        if not plan:
            continue
        depths.update(plan)
        drafted = [i for i, d in enumerate(plan) if d]
        widths += [rec["plan_width"][i] for i in drafted]
        nodes += [rec["num_draft_nodes"][i] for i in drafted]
        estimates = rec.get("policy") or estimates
    if not depths:
        return None
    steps = sum(depths.values())
    return {"steps": steps, "no_draft_share": depths.get(0, 0) / steps,
            "depth_counts": {int(d): n for d, n in sorted(depths.items())},
            "mean_width": sum(widths) / len(widths) if widths else 0.0,
            "mean_nodes": sum(nodes) / len(nodes) if nodes else 0.0, "estimates": estimates}


def _histogram(counts: dict) -> str:
    """Depth: share of steps; keys may be ints or (after a JSON round trip) strings."""
    total = sum(counts.values())
    shown = [f"{d}: {100 * n / total:.0f}%" for d, n in sorted((int(d), n) for d, n in counts.items())
             if d <= MAX_SHOWN_DEPTH]
    return ", ".join(shown)


TITLE = "Draft policy (tree=adaptive)"
NOTE = ("Chosen draft depth per step (0: no draft, the target decoded alone), mean width and nodes verified on "
        "drafting steps, and the policy's last estimates: acceptance per width and the fitted costs (seconds: "
        "verify = a + b x tokens; draft = r + c x levels + e x nodes).")
HEADERS = ["task", "method", "steps", "no draft", "depth: share of steps", "width", "nodes", "accept by width",
           "verify fit", "draft fit"]


def table_cells(rows: list[dict]) -> list[list[str]]:
    """One line per (task, method) with a policy: how deep, how wide, how often it did not draft."""
    out = []
    for r in rows:
        p = r.get("policy")
        if not p:
            continue
        est = p.get("estimates") or {}
        accept = ", ".join(f"{w}: {v:.2f}" for w, v in (est.get("accept_by_width") or {}).items())
        out.append([r["task"], r["method"], str(p["steps"]), f"{p['no_draft_share']:.0%}",
                    _histogram(p["depth_counts"]), f"{p['mean_width']:.1f}", f"{p['mean_nodes']:.1f}", accept,
                    str(est.get("verify_cost_fit")), str(est.get("draft_cost_fit"))])
    return out


def markdown_section(rows: list[dict]) -> str:
    """The section as markdown ('' when no row has a policy)."""
    cells = table_cells(rows)
    if not cells:
        return ""
    lines = [f"## {TITLE}", "", NOTE, "", "| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    return "\n".join(lines + ["| " + " | ".join(c) + " |" for c in cells]) + "\n"
