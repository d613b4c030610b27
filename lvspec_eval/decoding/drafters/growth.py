"""Tree growth shared by every drafter: expand a tree level by level on the device, then keep
the best nodes. No host round trip: one batched top-k per level, index tensors built once per
shape, masks built on the device.

A drafter supplies one callback, `feed(tokens, visible, parent_rows, depth) -> logits [m, vocab]`,
which runs its model on m new tree nodes at `depth` (tokens [m] on the device; visible [m, f + m]
bool: which of the f nodes fed before them, and of themselves, each may attend to: its ancestors
and itself; parent_rows [m]: which earlier fed node is each one's parent, -1 the root) and
returns the logits after each. Everything about the tree's shape lives in `tree.Shape`;
everything about the model lives in the callback, so a small LM (ModelDrafter) and the Sparrow
head grow exactly the same trees.

Worked example (a chain of depth 3, `dynamic_shape(3, 1, 1, None)`): level 1 takes the root's
top-1 token t1; level 2 feeds t1 (visible [[True]]) and takes the top-1 t2 of its logits; level
3 feeds t2 (visible [[True, True]]: it sees t1 and itself) and takes t3. Draft: tokens
[t1, t2, t3], parents [-1, 0, 1].
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..policy import AdaptivePolicy, DraftGate
from ..sage_tree import SageTree
from ..tree import Level, Shape, TreeConfig
from ..types import Draft

FeedFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, int], torch.Tensor]
# value(logp [m]) -> [m]: what a node adds to its path's value (default: its draft log-prob)
ValueFn = Callable[[torch.Tensor], torch.Tensor]
# total(values [num_nodes]) -> how many nodes to keep (the adaptive policy decides on the host)
TotalFn = Callable[[torch.Tensor], int]


@dataclass
class Nodes:
    """The grown candidates, level after level (parents before children), on the device."""

    tokens: torch.Tensor  # [n] long
    parents: torch.Tensor  # [n] long, -1 = the root
    logp: torch.Tensor  # [n] float: draft log-prob of the token at its parent
    score: torch.Tensor  # [n] float: cumulative draft log-prob (the path's)
    value: torch.Tensor  # [n] float: cumulative selection value (ValueFn summed along the path)
    depth: torch.Tensor | None = None  # [n] long (None: the grower's layout knows it)


class _Layout:
    """What a shape's growth needs that does not depend on the step's values, built once per shape on
    the device: per level whether it is a grid ((w, k): w expanded nodes with children of ranks
    0..k-1 each, read off the top-k as a reshape, no gather), its index tensors otherwise, how many
    nodes each level feeds and where its fed rows start, every node's depth, and the fed nodes'
    starting visibility (each sees itself)."""

    def __init__(self, shape: Shape, device: torch.device):
        self.grids = [_grid(level) for level in shape.levels]
        self.index = [None if grid else _index(level, device) for level, grid in zip(shape.levels, self.grids)]
        sizes = [len(level.rows) for level in shape.levels]
        # nodes fed after level d (the next level's expanded nodes) and the fed row they start at
        self.feeds = [_expand_size(below) for below in shape.levels[1:]]
        self.fed_at = [sum(self.feeds[:d]) for d in range(len(self.feeds))]
        # the next level's expanded nodes when they are all of this level's (a chain): no choice to make
        self.all_expanded = [torch.arange(n, device=device) if m == n else None
                             for n, m in zip(sizes, self.feeds)]
        self.fixed = [None if isinstance(below.expand, int) else torch.tensor(below.expand, dtype=torch.long, device=device)
                      for below in shape.levels[1:]]
        fed = sum(self.feeds)
        self.eye = torch.eye(fed, dtype=torch.bool, device=device) if fed else None
        self.root_rows = {m: torch.full((m,), -1, dtype=torch.long, device=device) for m in set(self.feeds[:1])}
        depth = torch.cat([torch.full((n,), d, dtype=torch.long, device=device) for d, n in enumerate(sizes, 1)])
        self.tie = 1e-9 * depth.double()  # _select's tie-break: the shallower of two equal values first
        self.roots = torch.full((sizes[0],), -1, dtype=torch.long, device=device)


class Grower:
    """Grows trees for one drafter; keeps each shape's layout (index tensors, depths) on the device."""

    def __init__(self, device: torch.device):
        self.device = device
        self._layouts: dict[int, tuple[Shape, _Layout]] = {}  # by id: hashing a wide shape costs more than growing it

    def grow(self, shape: Shape, root_logits: torch.Tensor, feed: FeedFn, value: ValueFn | None = None,
             total: TotalFn | None = None, plan: dict | None = None) -> Draft:
        """Expand the tree level by level (one batched `feed` per level after the first).

        root_logits: [vocab] the drafter's logits after the root (the last committed token).
        A grid level reads its nodes off the top-k as a reshape; the fed nodes' visibility is one
        [fed, fed] buffer per step, each fed row its parent's row and itself.
        """
        lay = self.layout(shape)
        logp = torch.log_softmax(root_logits.float(), dim=-1)[None]  # [expanded, vocab]
        vis = None if lay.eye is None else lay.eye.clone()
        cols: list[tuple[torch.Tensor, ...]] = []  # per level: tokens, parents, logp, score, value
        idx = score = val = None  # the expanded nodes' indices, path scores and values (None: the root)
        num = 0
        for d, level in enumerate(shape.levels):
            grid = lay.grids[d]
            if grid is not None:
                w, k = grid
                top = logp.topk(k, dim=-1)  # [w, k]: row r's children of ranks 0..k-1, in node order
                lp, tokens = top.values.reshape(-1), top.indices.reshape(-1)
            else:
                rows, ranks = lay.index[d]
                top = logp.topk(int(max(level.ranks)) + 1, dim=-1)
                lp, tokens = top.values[rows, ranks], top.indices[rows, ranks]
            gain = lp if value is None else value(lp)
            if idx is None:  # the root's children
                parents, lvl_score, lvl_val = lay.roots, lp, gain
            elif grid is not None:
                parents = idx.repeat_interleave(k) if w > 1 else idx.expand(k)
                lvl_score = (score[:, None] + lp.view(w, k)).reshape(-1)
                lvl_val = (val[:, None] + gain.view(w, k)).reshape(-1)
            else:
                parents, lvl_score, lvl_val = idx[rows], score[rows] + lp, val[rows] + gain
            cols.append((tokens, parents, lp, lvl_score, lvl_val))
            if d + 1 == shape.depth:
                break
            pick = self._expand(lay, d, shape.levels[d + 1], lvl_val)  # level-local indices to feed
            m, f = lay.feeds[d], lay.fed_at[d]
            if idx is None:
                parent_row = lay.root_rows[m]
            else:  # the expanded node rows[i] was fed at row (previous level's first fed row) + rows[i]
                expanded = pick.div(k, rounding_mode="floor") if grid is not None else rows[pick]
                parent_row = expanded + lay.fed_at[d - 1]
                vis[f:f + m, :f] = vis[parent_row, :f]  # a fed node sees what its parent sees, and itself
            logits = feed(tokens[pick], vis[f:f + m, :f + m], parent_row, d + 1)
            logp = torch.log_softmax(logits.float(), dim=-1)
            idx, score, val = pick + num, lvl_score[pick], lvl_val[pick]
            num += tokens.numel()
        nodes = Nodes(*(torch.cat(col) if len(col) > 1 else col[0] for col in zip(*cols)), depth=None)
        keep_n = shape.total if total is None else total(nodes.value)
        return _select(nodes, keep_n, shape.depth, plan, lay.tie)

    def layout(self, shape: Shape) -> _Layout:
        """The shape's layout, built on first use (`prepare` builds a fixed shape's at start)."""
        known = self._layouts.get(id(shape))
        if known is None or known[0] is not shape:
            known = self._layouts[id(shape)] = (shape, _Layout(shape, self.device))
        return known[1]

    def prepare(self, shape: Shape) -> None:
        """Build a fixed shape's layout now (at start), not inside a decode step."""
        self.layout(shape)

    @staticmethod
    def _expand(lay: _Layout, d: int, below: Level, value: torch.Tensor) -> torch.Tensor:
        """Indices (in level d) of the nodes the next level grows from."""
        fixed = lay.fixed[d] if lay.fixed[d] is not None else lay.all_expanded[d]
        if fixed is not None:
            return fixed
        return value.topk(below.expand).indices.sort().values


def _expand_size(level: Level) -> int:
    return level.expand if isinstance(level.expand, int) else len(level.expand)


def _index(level: Level, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """rows and ranks of a level that is not a grid, as long tensors on the device."""
    return (torch.tensor(level.rows, dtype=torch.long, device=device),
            torch.tensor(level.ranks, dtype=torch.long, device=device))


def _grid(level: Level) -> tuple[int, int] | None:
    """(w, k) when the level is w expanded nodes with children of ranks 0..k-1 each (the root's
    children too: w = 1, expand (0,)), else None."""
    w = level.expand if isinstance(level.expand, int) else (1 if level.expand == (0,) else 0)
    if not w or len(level.rows) % w:
        return None
    k = len(level.rows) // w
    regular = level.rows == tuple(r for r in range(w) for _ in range(k)) and level.ranks == tuple(range(k)) * w
    return (w, k) if regular else None


def _select(nodes: Nodes, keep_n: int | None, depth: int, plan: dict | None,
            tie: torch.Tensor | None = None) -> Draft:
    """Keep the best `keep_n` nodes by value (all when None), parents first, re-indexed.

    Values fall along a path (each node adds a log-probability <= 0), so the best nodes include
    their ancestors; a tiny depth penalty (`tie`: 1e-9 * depth, else from nodes.depth) breaks the
    ties that could orphan a node.
    """
    n = nodes.tokens.numel()
    if keep_n is None or keep_n >= n:  # every node: the tree as grown
        return Draft(tokens=nodes.tokens, parents=nodes.parents, scores=nodes.score, probs=nodes.logp.exp(),
                     depth=depth, plan=plan)
    key = nodes.value.double() - (1e-9 * nodes.depth.double() if tie is None else tie)
    keep = key.topk(keep_n).indices.sort().values
    new_index = torch.full((n + 1,), -1, dtype=torch.long, device=keep.device)
    new_index[keep + 1] = torch.arange(keep.numel(), device=keep.device)  # slot 0: the root stays -1
    return Draft(tokens=nodes.tokens[keep], parents=new_index[nodes.parents[keep] + 1],
                 scores=nodes.score[keep], probs=nodes.logp[keep].exp(), depth=depth, plan=plan)


def may_draft(planner: TreePlanner | None, config: TreeConfig, budget: int | None) -> bool:
    """Whether a step of the next request, of `budget` new tokens, may draft (TreePlanner.may_draft;
    before the run's first request, from the budget alone)."""
    if planner is None:
        return budget is None or budget > (2 if config.gated else 1)
    return planner.may_draft(budget)


class TreePlanner:
    """What every drafter does around its model: pick the step's shape (fixed, or the adaptive
    policy's or SAGE's), grow it, and feed the policy what the step measured. Holds one Grower.
    With `config.gated` a tree of the drafter's own shape (SAGE's, a fixed one) drafts only where the
    draft gate (policy/gate.py) says drafting pays; the adaptive policy decides that itself."""

    def __init__(self, config: TreeConfig, device: torch.device, eos_token_ids=()):
        self.config, self.grower = config, Grower(device)
        self.policy = (AdaptivePolicy(config.depth, config.topk, config.total, device, frozenset(eos_token_ids))
                       if config.adaptive else None)
        # SAGE's entropy-driven tree grows node by node from the draft's probabilities (sage_tree.py)
        self.sage = SageTree(config.depth, config.topk, config.total) if config.kind == "sage" else None
        self.gate = DraftGate(frozenset(eos_token_ids)) if config.gated and not config.adaptive else None
        self._fixed = None if config.adaptive or self.sage else config.shape()
        if self._fixed is not None:
            self.grower.prepare(self._fixed)
        # drafting off (the A/A check's, measure/timing_checks.NeverDrafts): every step is decided as
        # usual (the policy's plan, the gate's verdict, their bookkeeping), then drafts nothing
        self.never_draft = False

    def start_sample(self, budget: int | None = None, prompt_tokens: int = 0, prepared: bool = True,
                     prefill_s: float | None = None) -> None:
        """A new request of at most `budget` new tokens, `prompt_tokens` prompt tokens and a target
        prefill of `prefill_s` seconds; `prepared`: whether its draft is already prepared (else the
        policy weighs preparing it before drafting)."""
        if self.policy is not None:
            self.policy.start_sample(budget, prompt_tokens, prepared, prefill_s)
        if self.sage is not None:
            self.sage.start_sample()
        if self.gate is not None:
            self.gate.start_sample(budget, prompt_tokens, prepared, prefill_s)

    def may_draft(self, budget: int | None) -> bool:
        """Whether any step of the next request, of `budget` new tokens, may draft (asked before its
        prefill): where the policy or the gate decides, not when the answer is expected to end with
        each step's own token (answer.AnswerLength.steps_may_draft); a tree that drafts on every step
        drafts whenever a step is left."""
        decider = self.policy or self.gate
        if decider is not None:
            return decider.answer.steps_may_draft(budget)
        return budget is None or budget > 1

    def prepared(self, seconds: float) -> None:
        """The draft was prepared, in `seconds` (the policy learns what preparing costs)."""
        if self.policy is not None:
            self.policy.observe_preparation(seconds)
        if self.gate is not None:
            self.gate.observe_preparation(seconds)

    def next_shape(self, num_generated: int = 0) -> tuple[Shape | None, dict | None]:
        """The step's shape (None: propose nothing this step) and what the policy chose, if any; with
        `never_draft`, None and the choice marked `drafting_off` (a plain step's plan, depth 0)."""
        shape, plan = self._decide(num_generated)
        if shape is None or not self.never_draft:
            return shape, plan
        # recorded and observed as a plain step (not the probe or draft it would have been)
        return None, {**(plan or {}), "depth": 0, "width": 0, "nodes_fed": 0, "reason": "drafting off",
                      "drafting_off": True}

    def _decide(self, num_generated: int) -> tuple[Shape | None, dict | None]:
        if self.gate is not None:
            drafts, why = self.gate.decide(num_generated)
            if not drafts:
                return None, why
            shape, plan = self.sage.next_shape() if self.sage is not None else (self._fixed, {"depth": self._fixed.depth})
            return shape, {**plan, **why}
        if self.sage is not None:
            return self.sage.next_shape()
        if self.policy is None:
            return self._fixed, None
        shape, plan = self.policy.plan(num_generated)
        if shape is not None:
            plan["nodes_fed"] = sum(lv.expand if isinstance(lv.expand, int) else len(lv.expand)
                                    for lv in shape.levels[1:])
        return shape, plan

    def grow(self, shape: Shape, plan: dict | None, root_logits: torch.Tensor, feed: FeedFn) -> Draft:
        if self.sage is not None:
            return self.sage.grow(shape, plan, root_logits, feed)
        if self.policy is None:
            return self.grower.grow(shape, root_logits, feed, plan=plan)

        def total(values: torch.Tensor) -> int:
            plan["nodes"] = self.policy.choose_total(values, shape.depth - 1, plan["nodes_fed"])
            return plan["nodes"]

        return self.grower.grow(shape, root_logits, feed, value=self.policy.node_value, total=total, plan=plan)

    def observe(self, verdict, scores, step) -> None:
        if self.sage is not None and step.num_draft_nodes:
            self.sage.observe(verdict.num_accepted)
        if self.gate is not None:
            self.gate.observe(step.num_draft_nodes, verdict.tokens, step.draft_s, step.verify_s, scores.num_pending)
        if self.policy is not None:
            view = scores.host_view(None) if step.num_draft_nodes else None
            self.policy.observe(step, view, verdict, scores.num_pending)

    def estimates(self) -> dict | None:
        if self.gate is not None:
            return self.gate.estimates()
        return None if self.policy is None else self.policy.estimates()


class UnfedTokens:
    """The tokens committed since a drafter last fed its model, kept on the device as the steps
    commit them (Scores.committed_ids), so that its catch-up needs no upload of host token ids."""

    def __init__(self):
        self.clear()

    def clear(self) -> None:
        self.tokens: list[int] = []
        self.ids: list[torch.Tensor] | None = []  # None: some step's tokens are not on the device

    def add(self, tokens: list[int], ids: torch.Tensor | None) -> None:
        self.tokens += tokens
        self.ids = None if ids is None or self.ids is None else self.ids + [ids]

    def take(self, new: list[int]) -> torch.Tensor | None:
        """[len(new)] the device ids of `new` when they are what was committed since the last take; then clears."""
        ids = torch.cat(self.ids) if self.ids and self.tokens == new else None
        self.clear()
        return ids
