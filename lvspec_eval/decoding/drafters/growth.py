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
from ..tree import Level, Shape, TreeConfig, extend_visibility
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
    depth: torch.Tensor  # [n] long


class Grower:
    """Grows trees for one drafter; keeps the index tensors of each shape on the device."""

    def __init__(self, device: torch.device):
        self.device = device
        self._index: dict[tuple, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]] = {}

    def grow(self, shape: Shape, root_logits: torch.Tensor, feed: FeedFn, value: ValueFn | None = None,
             total: TotalFn | None = None, plan: dict | None = None) -> Draft:
        """Expand the tree level by level (one batched `feed` per level after the first).

        root_logits: [vocab] the drafter's logits after the root (the last committed token).
        """
        logp = torch.log_softmax(root_logits.float(), dim=-1)[None]  # [expanded, vocab]
        zero = torch.zeros(1, device=self.device)
        expanded = (torch.full((1,), -1, dtype=torch.long, device=self.device), zero, zero)  # global idx, score, value
        levels: list[Nodes] = []
        vis = torch.zeros(0, 0, dtype=torch.bool, device=self.device)  # fed nodes' visibility
        num, above = 0, None  # above: the fed row of each node expanded into this level (None: the root)
        for depth, level in enumerate(shape.levels, start=1):
            rows, ranks, _ = self._tensors(level)
            top = logp.topk(int(max(level.ranks)) + 1, dim=-1)
            lp = top.values[rows, ranks]
            gain = lp if value is None else value(lp)
            new = Nodes(tokens=top.indices[rows, ranks], parents=expanded[0][rows], logp=lp,
                        score=expanded[1][rows] + lp, value=expanded[2][rows] + gain,
                        depth=torch.full_like(rows, depth))
            levels.append(new)
            if depth == shape.depth:
                break
            pick = self._expand(shape.levels[depth], new.value)  # level-local indices to feed
            # a node's parent is the expanded node rows[i], fed (if not the root) at row above[rows[i]]
            picked_rows = rows[pick]
            parent_row = torch.full_like(picked_rows, -1) if above is None else above[picked_rows]
            vis = extend_visibility(vis, parent_row)
            above = torch.arange(vis.shape[0] - pick.numel(), vis.shape[0], device=self.device)
            logits = feed(new.tokens[pick], vis[-pick.numel():], parent_row, depth)
            logp = torch.log_softmax(logits.float(), dim=-1)
            expanded = (num + pick, new.score[pick], new.value[pick])
            num += rows.numel()
        nodes = Nodes(*(torch.cat([getattr(lv, f) for lv in levels]) for f in Nodes.__dataclass_fields__))
        keep_n = shape.total if total is None else total(nodes.value)
        return _select(nodes, keep_n, shape.depth, plan)

    def _tensors(self, level: Level) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """rows, ranks and fixed expand indices of a level, on the device. A dynamic level's come
        from arange (no host list); a static level's are built once per run (prepare())."""
        key = (level.rows, level.ranks, level.expand if isinstance(level.expand, tuple) else None)
        if key not in self._index:
            grid = _grid(level)
            if grid is not None:  # rows 0..w-1 each with ranks 0..k-1
                w, k = grid
                ar = torch.arange(max(w, k), device=self.device)
                fixed = ar[:1] if level.expand == (0,) else None
                self._index[key] = (ar[:w].repeat_interleave(k), ar[:k].repeat(w), fixed)
            else:
                def as_tensor(values):
                    return torch.tensor(values, dtype=torch.long, device=self.device)
                self._index[key] = (as_tensor(level.rows), as_tensor(level.ranks), as_tensor(level.expand))
        return self._index[key]

    def prepare(self, shape: Shape) -> None:
        """Build a fixed shape's index tensors now (at start), not inside a decode step."""
        for level in shape.levels:
            self._tensors(level)

    def _expand(self, below: Level, value: torch.Tensor) -> torch.Tensor:
        """Indices (in this level) of the nodes the next level grows from."""
        fixed = self._tensors(below)[2]
        if fixed is not None:
            return fixed
        return value.topk(below.expand).indices.sort().values


def _grid(level: Level) -> tuple[int, int] | None:
    """(w, k) when the level is w expanded nodes with children of ranks 0..k-1 each (the root's
    children too: w = 1, expand (0,)), else None."""
    w = level.expand if isinstance(level.expand, int) else (1 if level.expand == (0,) else 0)
    if not w or len(level.rows) % w:
        return None
    k = len(level.rows) // w
    regular = level.rows == tuple(r for r in range(w) for _ in range(k)) and level.ranks == tuple(range(k)) * w
    return (w, k) if regular else None


def _select(nodes: Nodes, keep_n: int | None, depth: int, plan: dict | None) -> Draft:
    """Keep the best `keep_n` nodes by value (all when None), parents first, re-indexed.

    Values fall along a path (each node adds a log-probability <= 0), so the best nodes include
    their ancestors; a tiny depth penalty breaks the ties that could orphan a node.
    """
    n = nodes.tokens.numel()
    if keep_n is not None and keep_n < n:
        key = nodes.value.double() - 1e-9 * nodes.depth
        keep = key.topk(keep_n).indices.sort().values
    else:
        keep = torch.arange(n, device=nodes.tokens.device)
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
