"""Draft trees: depths, masks, positions and paths, all derived from `parents`.

A tree is a list of nodes hanging off the root (the last committed token); node i's parent is
parents[i] (-1 = the root) and parents come before children. A chain is parents [-1, 0, 1, ...].
"""
from __future__ import annotations

import torch


def chain_parents(n: int) -> torch.Tensor:
    return torch.arange(-1, n - 1, dtype=torch.long)


def depths(parents: torch.Tensor) -> torch.Tensor:
    """[n] depth of each node; children of the root have depth 1."""
    d = torch.zeros(parents.numel(), dtype=torch.long)
    for i, p in enumerate(parents.tolist()):
        if p >= i:
            raise ValueError(f"parents must precede children; node {i} has parent {p}")
        d[i] = 1 if p < 0 else d[p] + 1
    return d


def ancestor_mask(parents: torch.Tensor) -> torch.Tensor:
    """[n, n] bool: row i is True at i and at each of its ancestors (what node i may attend to)."""
    n = parents.numel()
    mask = torch.eye(n, dtype=torch.bool)
    for i, p in enumerate(parents.tolist()):
        if p >= 0:
            mask[i] |= mask[p]
    return mask


def pending_and_tree_layout(num_pending: int, parents: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets [p + n] and visibility [p + n, p + n] for pending tokens followed by a tree.

    Pending tokens form a causal chain; the last one is the tree's root, so every node sees all
    pending tokens plus its own ancestors, at offset (p - 1) + depth.
    """
    p, n = num_pending, parents.numel()
    offsets = torch.cat([torch.arange(p), p - 1 + depths(parents)])
    visible = torch.zeros(p + n, p + n, dtype=torch.bool)
    visible[:p, :p] = torch.tril(torch.ones(p, p, dtype=torch.bool))
    visible[p:, :p] = True
    visible[p:, p:] = ancestor_mask(parents)
    return offsets, visible


def path_to(node: int, parents: torch.Tensor) -> list[int]:
    """Node indices from the root's child down to `node` (empty for the root, node = -1)."""
    path = []
    par = parents.tolist()
    while node >= 0:
        path.append(node)
        node = par[node]
    return path[::-1]


def best_child(parents: torch.Tensor, scores: torch.Tensor | None, node: int) -> int | None:
    """The draft's favourite child of `node` (-1: the root): its highest-scored one, the first when
    scores are unknown; None when `node` is a leaf (or the draft is empty)."""
    kids = (parents == node).nonzero().flatten()
    if kids.numel() == 0:
        return None
    return int(kids[0] if scores is None else kids[scores[kids].argmax()])


def children(parents: torch.Tensor) -> list[list[int]]:
    """children[0] lists the root's children; children[i + 1] lists node i's."""
    out: list[list[int]] = [[] for _ in range(parents.numel() + 1)]
    for i, p in enumerate(parents.tolist()):
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
TREE_KINDS = ("dynamic", "static", "chain")


def _rank_path(cands, c: int) -> tuple[int, ...]:
    path = []
    while c >= 0:
        path.append(cands[c].rank)
        c = cands[c].parent
    return tuple(path[::-1])


class TreeConfig:
    """Shape of the draft tree: EAGLE-2 dynamic, a static list of rank paths, or a chain.

    dynamic: at each depth expand the `topk` best frontier nodes by cumulative draft log-prob,
    each with its `topk` best children; after `depth` levels keep the `total` best nodes
    (ancestors of kept nodes are always kept). static: the nodes are fixed rank paths
    (`choices`). chain: one branch of `depth` greedy draft tokens.
    """

    def __init__(self, kind: str = "dynamic", depth: int = 5, topk: int = 10, total: int = 60,
                 choices: tuple[tuple[int, ...], ...] | str = "specvlm26"):
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

    def __repr__(self) -> str:
        if self.kind == "static":
            return f"TreeConfig(static, {len(self.choices)} nodes)"
        return f"TreeConfig({self.kind}, depth={self.depth}, topk={self.topk}, total={self.total})"

    def child_ranks(self, cands, parent: int, depth: int) -> list[int]:
        if self.kind == "chain":
            return [0]
        if self.kind == "dynamic":
            return list(range(self.topk))
        prefix = _rank_path(cands, parent)
        return sorted(c[-1] for c in self.choices if len(c) == depth and c[:-1] == prefix)

    def to_feed(self, cands, new: list[int]) -> list[int]:
        """Which of the newest candidates get children (and so must be fed to the draft)."""
        if self.kind == "dynamic":
            return sorted(sorted(new, key=lambda c: -cands[c].score)[: self.topk])
        if self.kind == "chain":
            return new
        longer = {c[:-1] for c in self.choices}
        return [c for c in new if _rank_path(cands, c) in longer]

    def select(self, cands) -> list[int]:
        """Candidate indices that form the draft, parents before children."""
        if self.kind != "dynamic" or len(cands) <= self.total:
            return list(range(len(cands)))
        best = set(sorted(range(len(cands)), key=lambda c: -cands[c].score)[: self.total])
        for c in list(best):  # scores fall along a path, but ties could orphan a node
            a = cands[c].parent
            while a >= 0 and a not in best:
                best.add(a)
                a = cands[a].parent
        return sorted(best)
