"""The policy's plan search: free functions on plain numbers (no state).

A plan (depth D, width w) is worth its expected rate
    rate(D, w) = (1 + min(useful, k a_w sum_{d=0..D-1} b_w^d)) / (draft(D - 1, w (D - 1)) + verify(1 + w D)),
with the fits' coefficients for draft() and verify(), (a_w, b_w) and k from the acceptance model, and
`useful` the tokens the answer still needs beyond the step's own (bonus) one. After growing the
tree, the n nodes with the highest calibrated path values v are kept, n maximising
    (1 + sum of the n best v) / (draft so far + verify(1 + n)).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence


def best_plan(draft: Sequence[float] | None, verify: Sequence[float] | None,
              accept: dict[int, float | tuple[float, float]],
              k: float, useful: float, deepest: dict[int, int], max_nodes: int) -> tuple[float, int, int]:
    """(rate, depth, width) of the plan with the highest expected rate (ties: the deeper, then the
    wider), over every width of `accept` (width -> (a_w, b_w), or one c_w for both) and depth up to
    `deepest[width]` (only plans
    near what was measured). draft: [r, per level, per node], verify: verify[t] the seconds to verify
    t tokens, t = 0..max_nodes + 1 (None: not measured yet, then (0, deepest of the widest, the widest)). Runs every step, so the loop is
    plain float arithmetic."""
    if draft is None or verify is None:  # no cost measured yet: nothing to compare
        widest = max(accept)
        return 0.0, deepest[widest], widest
    r, per_level, per_node = draft
    best = (-math.inf, 0, 0)
    for width, c in accept.items():
        a, b = c if isinstance(c, tuple) else (c, c)
        accepted, level = 0.0, a  # a (1 + b + ... + b^(depth - 1)), as model_accepted(c, depth)
        for depth in range(1, deepest[width] + 1):
            accepted += level
            level *= b
            expected = 1.0 + min(useful, k * accepted)
            cost = r + verify[1 + min(width * depth, max_nodes)] \
                + (per_level + per_node * width) * (depth - 1)
            candidate = (expected / cost if cost > 0 else 0.0, depth, width)
            best = max(best, candidate)
    return best


def neighbour(widths: Sequence[int], width: int, wider: bool) -> int:
    """The next wider width of `widths` (or the next narrower one where `width` is the widest, or
    where `wider` is False and a narrower one exists)."""
    i = widths.index(width)
    if wider and i + 1 < len(widths):
        return widths[i + 1]
    return widths[i - 1] if i else widths[1]


def choose_total(values: Sequence[float], spent: float, verify: Callable[[int], float]) -> int:
    """How many of the grown nodes to verify: n maximising (1 + sum of the n best path values) /
    (`spent` + verify(n)), with `values` the nodes' path values (chances of acceptance), best first,
    and verify(n) the seconds to verify n nodes (n = 0: a plain step)."""
    best_n, best, gain = 0, -1.0, 1.0
    for n in range(len(values) + 1):
        gain += values[n - 1] if n else 0.0
        rate = gain / (spent + verify(n))
        if rate > best:
            best_n, best = n, rate
    return best_n
