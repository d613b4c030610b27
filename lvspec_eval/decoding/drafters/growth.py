"""Tree growth shared by every drafter: expand candidates level by level, then pick the draft.

A drafter supplies one callback, `feed(cands, frontier, depth) -> logits [len(frontier), vocab]`,
which runs its model on the frontier candidates (each attending to the committed prefix and its
own ancestors) and returns the logits after each. Everything about the tree's shape (dynamic,
static, chain) lives in TreeConfig; everything about the model lives in the callback, so a small
LM (ModelDrafter) and the Sparrow head grow exactly the same trees.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..tree import TreeConfig
from ..types import Draft


@dataclass
class Candidate:
    token: int
    parent: int  # index into the candidate list; -1 = root
    score: float  # cumulative draft log-prob
    depth: int
    rank: int  # rank of the token among its parent's draft top-k


FeedFn = Callable[[list[Candidate], list[int], int], torch.Tensor]


def grow(tree: TreeConfig, root_logits: torch.Tensor, feed: FeedFn) -> Draft:
    """Expand the tree level by level; each level is one batched `feed` call.

    root_logits: [vocab] the drafter's logits after the root (the last committed token).
    """
    cands: list[Candidate] = []
    frontier, frontier_logits = [-1], root_logits[None]
    for depth in range(1, tree.depth + 1):
        new = expand(tree, cands, frontier, frontier_logits, depth)
        if depth == tree.depth or not new:
            break
        frontier = tree.to_feed(cands, new)
        if not frontier:
            break
        frontier_logits = feed(cands, frontier, depth)
    return to_draft(cands, tree.select(cands))


def expand(tree: TreeConfig, cands: list[Candidate], frontier: list[int], logits: torch.Tensor,
           depth: int) -> list[int]:
    """Append the children of each frontier candidate (rows of `logits`); return their indices."""
    logp = torch.log_softmax(logits.float(), dim=-1)
    new = []
    for row, parent in enumerate(frontier):
        base = 0.0 if parent < 0 else cands[parent].score
        ranks = tree.child_ranks(cands, parent, depth)
        if not ranks:
            continue
        top = torch.topk(logp[row], max(ranks) + 1)
        for r in ranks:
            cands.append(Candidate(int(top.indices[r]), parent, base + float(top.values[r]), depth, r))
            new.append(len(cands) - 1)
    return new


def ancestor_visibility(cands: list[Candidate], frontier: list[int], slots: dict[int, int],
                        start: int) -> torch.Tensor:
    """[m, start + m] bool: which temporary cache slots each frontier candidate may attend to.

    slots maps already-fed candidates to their temporary slot; the frontier is appended at
    `start`, `start + 1`, ... (and recorded in `slots`). Each row sees itself and its ancestors.
    """
    m = len(frontier)
    visible = torch.zeros(m, start + m, dtype=torch.bool)
    for row, c in enumerate(frontier):
        visible[row, start + row] = True
        a = cands[c].parent
        while a >= 0:
            visible[row, slots[a]] = True
            a = cands[a].parent
        slots[c] = start + row
    return visible


def to_draft(cands: list[Candidate], keep: list[int]) -> Draft:
    """Selected candidates (parents first) as a Draft with re-indexed parents."""
    index = {c: i for i, c in enumerate(keep)}
    tokens = torch.tensor([cands[c].token for c in keep], dtype=torch.long)
    parents = torch.tensor([index[cands[c].parent] if cands[c].parent >= 0 else -1 for c in keep],
                           dtype=torch.long)
    scores = torch.tensor([cands[c].score for c in keep])
    return Draft(tokens=tokens, parents=parents, scores=scores)
