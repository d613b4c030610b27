"""Drafters that run a language model: a separate small model (Std-SD) or the target itself
(Self-SD), on the full video or on the video tokens kept by SpecVLM's pruning.

The drafter owns its own decode state. Before each proposal it feeds the tokens committed since
its last proposal (refeed), then grows a tree level by level as temporary cache entries, which
it drops afterwards: its cache only ever holds committed tokens.
"""
from __future__ import annotations

import time

import torch

from ...backends.base import Backend, DecodeState, PreparedInputs
from ..pruning import PruneConfig, prune_scores, scorer_layers, select_visual_tokens
from ..tree import TreeConfig
from ..types import Draft, Preparation
from . import growth


class NoDrafter:
    """Vanilla decoding: propose nothing, so each step commits the target's one token."""

    name = "none"
    hidden_layers: tuple[int, ...] = ()  # target layers whose hidden states it reads of the prefill and every step
    prefill_layers: tuple[int, ...] = ()  # target layers whose hidden states it reads of the prefill only
    needs_visual_attention = False
    preparation = None  # nothing to prepare

    def start(self, target: Backend, inputs: PreparedInputs, target_state: DecodeState, clock) -> dict:
        return {}

    def propose(self, generated: list[int]) -> Draft:
        return Draft.empty()

    def observe(self, verdict, scores, step=None) -> None:
        pass

    def estimates(self) -> dict | None:
        return None

    def finish(self) -> None:
        pass

    def may_draft(self, budget: int | None) -> bool:
        return False


class ModelDrafter:
    """Draft with a causal LM backend (`backend=None` means the target itself: Self-SD).

    Preparing the draft (pruning, its vision tower, its prefill) happens in `start` when `eager`,
    else on the first step whose plan wants a draft (`draft_prepare=lazy`): a request that ends
    before that step costs no draft-side work at all. A late draft then catches up on the tokens
    committed so far in one causal forward (`_refeed`), so its proposals are the ones it would have
    made had it been prepared at the start.
    """

    hidden_layers: tuple[int, ...] = ()  # no step's hidden states: the draft model has its own

    def __init__(self, tree: TreeConfig, backend: Backend | None = None, prune: PruneConfig | None = None,
                 eager: bool = True, target: Backend | None = None):
        self.tree, self.backend, self.prune, self.eager = tree, backend, prune, eager
        if backend is not None and target is not None and backend.shares_vision_trunk(target):
            target.keep_vision_trunk = True  # the draft embeds the video from the target's tower output
        self.needs_visual_attention = prune is not None and prune.scorer == "attention"
        if prune is not None and prune.scorer != "attention" and target is None:
            raise ValueError(f"prune_scorer={prune.scorer} reads the target's hidden states: pass the target backend")
        # UV-Prune's scores read layers l1 and l2 of the target's prefill, never a step's
        self.prefill_layers = scorer_layers(prune, target.num_layers) if target is not None else ()
        self.name = ("self" if backend is None else "model") + ("+pruned" if prune else "")
        self.state: DecodeState | None = None  # the draft's decode state, once prepared
        self.preparation: Preparation | None = None  # what preparing cost, once prepared
        self.planner: growth.TreePlanner | None = None  # made at start(), on the drafting model's device
        self.num_fed = 0  # generated tokens already in the draft cache
        self._root_logits: torch.Tensor | None = None  # draft logits after the last fed token
        self._request: tuple | None = None  # (target, inputs, target state, clock, embeds) until prepared
        self._unfed = growth.UnfedTokens()  # the committed tokens not yet fed, on the device where known
        self._draft: Draft | None = None  # the last proposal (observe reads its tokens on the device)

    def start(self, target: Backend, inputs: PreparedInputs, target_state: DecodeState, clock) -> dict:
        """Take the request; prepare the draft now when eager. Returns the preparation's figures
        (empty when it is left for later).

        The draft reuses the target's prepared inputs (no second frame preprocessing, chat template
        or position computation), when the target drafts for itself the target's input embeddings
        (no second run of the vision tower), and when the draft's vision tower is the target's up to
        its merger (`Backend.shares_vision_trunk`) the target's tower output (only the merger runs)."""
        self.active = self.backend or target
        if self.planner is None or self.planner.grower.device != self.active.device:
            self.planner = growth.TreePlanner(self.tree, self.active.device, target.eos_token_ids)  # for the whole run
        self.planner.start_sample(inputs.extra.get("max_new_tokens"), int(inputs.input_ids.shape[1]), self.eager,
                                  inputs.extra.get("prefill_s"))
        embeds = inputs.extra.get("embeds") if self.backend is None else None  # Self-SD: the target's
        self.state, self.preparation, self.num_fed, self._draft = None, None, 0, None
        self._unfed.clear()
        self._unfed.add(list(target_state.pending), target_state.pending_on_device())  # the first root
        self._request = (target, inputs, target_state, clock, embeds)
        if self.eager:
            return self.prepare(0).as_dict()
        return {}

    def prepare(self, num_generated: int) -> Preparation:
        """Prune (if configured), embed (the draft's vision tower) and prefill the draft."""
        target, inputs, target_state, clock, embeds = self._request
        t0 = clock()
        keep = None
        if self.prune is not None and inputs.num_visual_tokens:
            keep = select_visual_tokens(prune_scores(self.prune, target, inputs, target_state), self.prune)
        t1 = clock()
        backend = self.active
        if backend is target:
            draft_inputs = inputs
            draft_inputs.extra["embeds"] = embeds if embeds is not None else backend.input_embeds(inputs)
        else:
            draft_inputs = backend.adopt_inputs(inputs, target)
            if draft_inputs.num_visual_tokens != inputs.num_visual_tokens:
                raise ValueError("draft and target disagree on the number of visual tokens "
                                 f"({draft_inputs.num_visual_tokens} vs {inputs.num_visual_tokens}): they must "
                                 "share the visual-token layout")
            draft_inputs.extra["embeds"] = backend.input_embeds(draft_inputs)
        t2 = clock()
        self.state, _ = backend.prefill(draft_inputs, keep_visual=keep)
        for extra in (draft_inputs.extra, inputs.extra):
            extra.pop("embeds", None)
            extra.pop("vision_trunk", None)
        self._request = None  # the request's tensors are not needed any more
        kept = inputs.num_visual_tokens if keep is None else int(keep.numel())
        self.preparation = Preparation(num_generated, t1 - t0, t2 - t1, clock() - t2, kept)
        self.planner.prepared(self.preparation.total_s)
        return self.preparation

    def observe(self, verdict, scores, step=None) -> None:
        if self._draft is not None:
            self._unfed.add(verdict.tokens, scores.committed_ids(self._draft, verdict))
        if step is not None:
            self.planner.observe(verdict, scores, step)

    def estimates(self) -> dict | None:
        return None if self.planner is None else self.planner.estimates()

    def may_draft(self, budget: int | None) -> bool:
        """Whether the next request may need the draft (growth.may_draft): an eager drafter prepares it at
        every request's start, whatever its steps do."""
        return self.eager or growth.may_draft(self.planner, self.tree, budget)

    def finish(self) -> None:
        """The request is over: let go of its tensors (the target's inputs and cache, the draft's
        cache) now, outside its timed window, as vanilla's go when the loop returns; held until the next
        request's `start`, they were freed inside that request's window."""
        self._request, self.state, self._root_logits, self._draft = None, None, None, None
        self._unfed.clear()

    def propose(self, generated: list[int]) -> Draft:
        shape, plan = self.planner.next_shape(len(generated))
        if shape is None:  # the policy expects no draft to pay this step: the target decodes alone
            self._draft = Draft.empty(self.active.device, plan)
            return self._draft
        if self.state is None:  # the first draft of this request: prepare it now (lazy)
            self.prepare(len(generated))
        root_logits = self._refeed(generated)
        try:
            self._draft = self._grow(shape, plan, root_logits)
            return self._draft
        finally:
            self.active.keep(self.state, 0)  # drop the tree's temporary entries

    def _refeed(self, generated: list[int]) -> torch.Tensor:
        """Feed committed tokens not yet in the draft cache; return logits after the last one."""
        new = generated[self.num_fed:]
        if not new:  # proposed again with nothing committed since: same root as last time
            return self._root_logits
        st, device = self.state, self.active.device
        st.pending = []
        offsets = torch.arange(len(new), device=device)
        ids = self._unfed.take(new)
        ids = torch.tensor(new, device=device) if ids is None else ids.to(device)
        logits, _ = self.active.forward(st, ids, offsets, None)  # causal
        self.active.keep(st, len(new))
        self.num_fed = len(generated)
        self._root_logits = logits[-1]
        return self._root_logits

    def _grow(self, shape, plan, root_logits: torch.Tensor) -> Draft:
        """Grow the step's tree (growth.Grower); each level after the first is one batched draft
        forward whose nodes see the committed prefix and their own ancestors."""
        st = self.state

        def feed(tokens: torch.Tensor, visible: torch.Tensor, parent_rows: torch.Tensor, depth: int) -> torch.Tensor:
            # The root sits at offset -1 (it is the last committed token); a node at depth d at d - 1.
            offsets = torch.full((tokens.numel(),), depth - 1, device=tokens.device)
            logits, _ = self.active.forward(st, tokens, offsets, visible)
            return logits

        return self.planner.grow(shape, plan, root_logits, feed)


def wall_clock() -> float:
    return time.perf_counter()
