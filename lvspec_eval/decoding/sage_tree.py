"""SAGE's entropy-driven draft tree (`tree=sage`; SAGE, arXiv 2602.00523, section 5.1).

Each step's tree follows how sure the draft was at the previous step:
- confidence alpha = 1 - H / log k, H the entropy of the draft's top-k probabilities at the root
  renormalised to sum to 1 (k = 10). Taken at the current step, used for the next step's tree (the
  first step of a request uses 0.5).
- depth D = D_min + alpha (D_max - D_min), width W = W_min + (1 - alpha)(W_max - W_min), both rounded:
  a sure draft grows a deep narrow tree, an unsure one a shallow wide tree. D in [3, 8], W in [2, 10].
- a node expanded at depth l - 1 gets round(W (1 / l)(0.5 + P)) children (at least 1), its draft's
  best tokens, P its path probability (the product of the draft's probabilities along the path; the
  root's is 1). A node at depth l is expanded while its path probability exceeds 0.1 l / D (the
  paper's "kept while": we read it as "grown further", so every expanded node keeps at least one
  child and the root always has some); at most `max_nodes` (64) nodes, the likeliest kept when a
  level would pass it.
- D_max itself follows the mean accepted length over the last `window` (10) steps: below 2 it drops
  by 1, above 3 it rises by 1, within [D_min, the configured cap]. (The step size is not published.)

Worked example (alpha 0.5, D_max 8: D = 6 (5.5 rounded half up), W = 6): the root gets round(6 x 1.5)
= 9 children; a child with probability 0.5 (path 0.5 > 0.1 / 6) gets round(6 / 2 x 1.0) = 3
children; one with probability 0.01 is a leaf.

The same `feed` callback as growth.Grower (any drafter: a small model, the target itself, Sparrow's
head, an MTP layer); per level one host transfer (the counts depend on the probabilities) and one
upload (the fed nodes' tokens and parent rows): about 2 x depth host synchronisations a step.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import torch

from .tree import extend_visibility
from .types import Draft


@dataclass(frozen=True)
class SageShape:
    """One step's tree parameters: depth D and width W (what next_shape hands back to grow)."""

    depth: int
    width: int


def confidence(logits: torch.Tensor, k: int) -> float:
    """alpha = 1 - H / log k over the renormalised top-k probabilities of [vocab] logits (1: sure)."""
    k = min(k, logits.numel())
    if k < 2:
        return 1.0
    p = torch.softmax(logits.float().topk(k).values, dim=-1)
    entropy = -(p * p.clamp_min(1e-30).log()).sum()
    return float(1.0 - entropy / math.log(k))


def _round(x: float) -> int:
    return math.floor(x + 0.5)  # half up (Python's round goes to even)


class SageTree:
    """Per-run state of SAGE's tree policy: the last confidence, D_max and recent accepted lengths."""

    def __init__(self, max_depth: int = 8, max_width: int = 10, max_nodes: int = 64, min_depth: int = 3,
                 min_width: int = 2, k: int = 10, window: int = 10, threshold: float = 0.1):
        for name, value in (("tree_depth", max_depth), ("tree_topk", max_width), ("tree_total", max_nodes)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1 for tree=sage, got {value}")
        self.min_depth, self.max_depth = min(min_depth, max_depth), max_depth
        self.min_width, self.max_width = min(min_width, max_width), max_width
        self.max_nodes, self.k, self.threshold = max_nodes, k, threshold
        self.d_max = max_depth  # adapted from the accepted lengths, within [min_depth, max_depth]
        self.alpha = 0.5
        self.accepted: deque[int] = deque(maxlen=window)

    def start_sample(self) -> None:
        self.alpha = 0.5  # a new request: no confidence measured yet (D_max carries over the run)

    def next_shape(self) -> tuple[SageShape, dict]:
        a = self.alpha
        depth = _round(self.min_depth + a * (self.d_max - self.min_depth))
        width = _round(self.min_width + (1 - a) * (self.max_width - self.min_width))
        return SageShape(depth, width), {"depth": depth, "width": width, "alpha": round(a, 4), "d_max": self.d_max}

    def observe(self, num_accepted: int) -> None:
        """A drafting step accepted `num_accepted` tokens: move D_max by the window's mean."""
        self.accepted.append(num_accepted)
        if len(self.accepted) < self.accepted.maxlen:
            return
        mean = sum(self.accepted) / len(self.accepted)
        if mean < 2:
            self.d_max = max(self.min_depth, self.d_max - 1)
        elif mean > 3:
            self.d_max = min(self.max_depth, self.d_max + 1)

    def grow(self, shape: SageShape, plan: dict | None, root_logits: torch.Tensor, feed) -> Draft:
        """Grow the step's tree (see the module docstring); `feed` as growth.FeedFn."""
        self.alpha = confidence(root_logits, self.k)  # for the next step's tree
        device = root_logits.device
        logp = torch.log_softmax(root_logits.float(), dim=-1)[None]  # [frontier, vocab]
        frontier = [(-1, 1.0)]  # (node index, path probability); the root first
        tokens: list[int] = []
        parents: list[int] = []
        lps: list[float] = []
        path_p: list[float] = []
        fed_row: dict[int, int] = {}  # node index -> row among the fed nodes
        vis = torch.zeros(0, 0, dtype=torch.bool, device=device)
        for depth in range(1, shape.depth + 1):
            new = self._children(frontier, logp, depth, shape.width, self.max_nodes - len(tokens))
            if not new:
                break
            first = len(tokens)
            for column, values in zip((parents, tokens, lps, path_p), zip(*new)):
                column.extend(values)
            limit = self.threshold * depth / shape.depth
            grown = [i for i in range(first, len(tokens)) if path_p[i] > limit]
            if depth == shape.depth or not grown or len(tokens) >= self.max_nodes:
                break
            # the level's parent rows and tokens, in one upload
            parent_row, fed = torch.tensor([[fed_row.get(parents[i], -1) for i in grown], [tokens[i] for i in grown]],
                                           device=device)
            vis = extend_visibility(vis, parent_row)
            for j, i in enumerate(grown):
                fed_row[i] = vis.shape[0] - len(grown) + j
            logits = feed(fed, vis[-len(grown):], parent_row, depth)
            logp = torch.log_softmax(logits.float(), dim=-1)
            frontier = [(i, path_p[i]) for i in grown]
        return _draft(tokens, parents, lps, device, plan)

    def _children(self, frontier, logp: torch.Tensor, depth: int, width: int, room: int) -> list[tuple]:
        """(parent, token, log-prob, path probability) of the level's new nodes, at most `room` (the
        likeliest), in frontier order. logp: [len(frontier), vocab]; one host transfer."""
        counts = [max(1, _round(width / depth * (0.5 + p))) for _, p in frontier]
        top = logp.topk(min(max(counts), logp.shape[-1]), dim=-1)
        # one transfer: log-probs and token ids (exact in float64)
        values, indices = torch.stack([top.values.double(), top.indices.double()]).tolist()
        indices = [[int(t) for t in row] for row in indices]
        new = [(node, indices[r][c], values[r][c], p * math.exp(values[r][c]))
               for r, ((node, p), n) in enumerate(zip(frontier, counts)) for c in range(min(n, len(values[r])))]
        if len(new) > room:
            keep = sorted(sorted(range(len(new)), key=lambda i: -new[i][3])[:room])
            new = [new[i] for i in keep]
        return new


def _draft(tokens: list[int], parents: list[int], lps: list[float], device, plan: dict | None) -> Draft:
    """The grown nodes as a Draft (scores: cumulative log-prob; probs: the draft's at the parent)."""
    scores, depth = [], [0] * len(tokens)
    for i, (p, lp) in enumerate(zip(parents, lps)):
        scores.append(lp + (scores[p] if p >= 0 else 0.0))
        depth[i] = 1 + (depth[p] if p >= 0 else 0)
    if plan is not None:
        plan["nodes"] = len(tokens)
    # one upload (float64 holds the ids exactly; the floats round to float32 as torch.tensor's would)
    columns = torch.tensor([tokens, parents, scores, lps], dtype=torch.float64, device=device)
    tokens_, parents_ = columns[:2].long()
    scores_, lps_ = columns[2:].float()
    return Draft(tokens=tokens_, parents=parents_, scores=scores_, probs=lps_.exp(), depth=max(depth, default=0),
                 plan=plan)
