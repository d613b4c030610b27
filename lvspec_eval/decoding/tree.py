"""Draft trees: depths, masks, positions and paths, all derived from `parents`.

The mask and positions of a verification forward (`ancestor_mask`, `pending_and_tree_layout`) are
the backend's, defined in backends/tree_layout.py and re-exported here.

A tree is a list of nodes hanging off the root (the last committed token); node i's parent is
parents[i] (-1 = the root) and parents come before children. A chain is parents [-1, 0, 1, ...].
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ..backends.tree_layout import ancestor_mask, pending_and_tree_layout  # noqa: F401 (re-exported)


def chain_parents(n: int) -> torch.Tensor:
    return torch.arange(-1, n - 1, dtype=torch.long)


def validate(parents: torch.Tensor | list[int]) -> None:
    """ValueError unless every parent precedes its child (a host-side check, for hand-made trees)."""
    for i, p in enumerate(parents.tolist() if isinstance(parents, torch.Tensor) else parents):
        if p >= i:
            raise ValueError(f"parents must precede children; node {i} has parent {p}")


def depths(parents: torch.Tensor, max_depth: int | None = None) -> torch.Tensor:
    """[n] depth of each node; children of the root have depth 1 (on parents' device)."""
    return ancestor_mask(parents, max_depth).sum(-1)


def extend_visibility(vis: torch.Tensor, parent_row: torch.Tensor) -> torch.Tensor:
    """Append m fed nodes to the [f, f] visibility of fed nodes: each sees its parent's row
    (parent_row -1: the root, nothing fed) and itself (every drafter's tree growth)."""
    f, m = vis.shape[0], parent_row.numel()
    padded = torch.cat([torch.zeros(1, f, dtype=torch.bool, device=vis.device), vis])  # row 0: the root
    new = torch.cat([padded[parent_row + 1], torch.eye(m, dtype=torch.bool, device=vis.device)], dim=1)
    return torch.cat([torch.cat([vis, torch.zeros(f, m, dtype=torch.bool, device=vis.device)], dim=1), new])


def _as_list(values) -> list | None:
    return values.tolist() if isinstance(values, torch.Tensor) else values


def path_to(node: int, parents) -> list[int]:
    """Node indices from the root's child down to `node` (empty for the root, node = -1)."""
    path = []
    par = _as_list(parents)
    while node >= 0:
        path.append(node)
        node = par[node]
    return path[::-1]


def best_child(parents, scores, node: int) -> int | None:
    """The draft's favourite child of `node` (-1: the root): its highest-scored one, the first when
    scores are unknown; None when `node` is a leaf (or the draft is empty). Host lists (tensors
    are accepted too)."""
    par, score = _as_list(parents), _as_list(scores)
    kids = [i for i, p in enumerate(par) if p == node]
    if not kids:
        return None
    return kids[0] if score is None else max(kids, key=lambda c: (score[c], -c))


def children(parents) -> list[list[int]]:
    """children[0] lists the root's children; children[i + 1] lists node i's."""
    par = _as_list(parents)
    out: list[list[int]] = [[] for _ in range(len(par) + 1)]
    for i, p in enumerate(par):
        out[p + 1].append(i)
    return out


# ------------------------------------------------------------------------------------------------
# Tree shapes (what a drafter grows)

# SpecVLM's static tree: 4/8/8/3/2 nodes on levels 1-5 (26 with the root). Each entry is the path
# of draft top-k ranks from the root; the exact list SpecVLM ships is not published, this one
# follows its level sizes with the ranks most often accepted (low ranks, deep along rank 0).
SPECVLM_26 = (
    (0,), (1,), (2,), (3,),
    (0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (2, 0), (3, 0),
    (0, 0, 0), (0, 0, 1), (0, 0, 2), (0, 1, 0), (0, 2, 0), (1, 0, 0), (1, 1, 0), (2, 0, 0),
    (0, 0, 0, 0), (0, 0, 0, 1), (0, 1, 0, 0),
    (0, 0, 0, 0, 0), (0, 0, 0, 0, 1),
)
STATIC_PRESETS = {"specvlm26": SPECVLM_26}
TREE_KINDS = ("adaptive", "dynamic", "static", "chain", "sage")  # sage: decoding/sage_tree.py


@dataclass(frozen=True)
class Level:
    """How one level of a draft tree grows from the level above it (the root for level 1).

    expand: which nodes of the level above get children: a tuple of their indices within that
    level, or an int w: its w best nodes by value. rows/ranks: the new nodes, each the child of
    rank ranks[i] (in the draft's top-k) of expanded node rows[i].
    """

    expand: tuple[int, ...] | int
    rows: tuple[int, ...]
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class Shape:
    """One step's tree: its levels, and how many nodes to keep (None: all of them)."""

    levels: tuple[Level, ...]
    total: int | None = None

    @property
    def depth(self) -> int:
        return len(self.levels)

    @property
    def num_nodes(self) -> int:
        return sum(len(level.rows) for level in self.levels)


@functools.lru_cache(maxsize=512)  # the adaptive policy asks for one every step (shapes are frozen)
def dynamic_shape(depth: int, width: int, children: int, total: int | None) -> Shape:
    """EAGLE-2: the root's `children` best children, then at each level the `width` best nodes of
    the level above, each with its `children` best children; keep the `total` best (None: all)."""
    levels, above = [Level((0,), (0,) * children, tuple(range(children)))], children
    for _ in range(depth - 1):
        w = min(width, above)
        levels.append(Level(w, tuple(r for r in range(w) for _ in range(children)), tuple(range(children)) * w))
        above = w * children
    num = sum(len(level.rows) for level in levels)
    return Shape(tuple(levels), None if total is None or total >= num else total)


def static_shape(choices) -> Shape:
    """A fixed list of rank paths (closed under prefixes), level by level in sorted order."""
    by_depth = [sorted(c for c in choices if len(c) == d) for d in range(1, max(map(len, choices)) + 1)]
    levels, above = [], [()]
    for nodes in by_depth:
        expand = sorted({above.index(c[:-1]) for c in nodes})
        rows = tuple(expand.index(above.index(c[:-1])) for c in nodes)
        levels.append(Level(tuple(expand), rows, tuple(c[-1] for c in nodes)))
        above = nodes
    return Shape(tuple(levels))


class TreeConfig:
    """Shape of the draft tree: adaptive, EAGLE-2 dynamic, a static list of rank paths, or a chain.

    adaptive: a cost-aware policy (decoding/policy/) picks depth, width and the nodes to verify
    at every step, within depth <= `depth`, width <= `topk` and nodes <= `total`.
    dynamic: at each depth expand the `topk` best frontier nodes by cumulative draft log-prob,
    each with its `topk` best children; after `depth` levels keep the `total` best nodes
    (ancestors of kept nodes are always kept). static: the nodes are fixed rank paths
    (`choices`). chain: one branch of `depth` greedy draft tokens. sage: SAGE's entropy-driven
    tree (decoding/sage_tree.py), depth <= `depth`, width <= `topk`, nodes <= `total`.
    gated: a step drafts only where drafting is expected to pay (policy/gate.py decides; the adaptive
    kind always decides so itself); else a fixed kind or SAGE drafts on every step.
    """

    def __init__(self, kind: str = "dynamic", depth: int = 5, topk: int = 10, total: int = 60,
                 choices: tuple[tuple[int, ...], ...] | str = "specvlm26", gated: bool = False):
        if kind not in TREE_KINDS:
            raise ValueError(f"tree={kind!r} is not a tree kind; expected one of {', '.join(TREE_KINDS)}")
        if isinstance(choices, str):
            if choices not in STATIC_PRESETS:
                raise ValueError(f"unknown static tree {choices!r}; presets: {', '.join(STATIC_PRESETS)}")
            choices = STATIC_PRESETS[choices]
        for name, value in (("tree_depth", depth), ("tree_topk", topk), ("tree_total", total)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        self.kind, self.topk, self.total = kind, topk, total
        self.choices = frozenset(tuple(c) for c in choices)
        self.depth = max(len(c) for c in self.choices) if kind == "static" else depth
        self.adaptive = kind == "adaptive"
        self.gated = gated or self.adaptive

    def __repr__(self) -> str:
        if self.kind == "static":
            return f"TreeConfig(static, {len(self.choices)} nodes)"
        gate = ", gated" if self.gated and not self.adaptive else ""
        return f"TreeConfig({self.kind}, depth={self.depth}, topk={self.topk}, total={self.total}{gate})"

    def shape(self) -> Shape:
        """The fixed shape of the non-adaptive kinds (the adaptive policy and SAGE build their own)."""
        if self.kind == "static":
            return static_shape(self.choices)
        if self.kind == "chain":
            return dynamic_shape(self.depth, 1, 1, None)
        return dynamic_shape(self.depth, self.topk, self.topk, self.total)
