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
from ..pruning import PruneConfig, select_visual_tokens
from ..tree import TreeConfig
from ..types import Draft
from . import growth


class NoDrafter:
    """Vanilla decoding: propose nothing, so each step commits the target's one token."""

    name = "none"
    hidden_layers: tuple[int, ...] = ()
    needs_visual_attention = False

    def start(self, target: Backend, inputs: PreparedInputs, target_state: DecodeState, clock) -> dict:
        return {}

    def propose(self, generated: list[int]) -> Draft:
        return Draft.empty()

    def observe(self, verdict, scores) -> None:
        pass


class ModelDrafter:
    """Draft with a causal LM backend (`backend=None` means the target itself: Self-SD)."""

    hidden_layers: tuple[int, ...] = ()

    def __init__(self, tree: TreeConfig, backend: Backend | None = None, prune: PruneConfig | None = None):
        self.tree, self.backend, self.prune = tree, backend, prune
        self.needs_visual_attention = prune is not None
        self.name = ("self" if backend is None else "model") + ("+pruned" if prune else "")
        self.state: DecodeState | None = None
        self.num_fed = 0  # generated tokens already in the draft cache
        self._root_logits: torch.Tensor | None = None  # draft logits after the last fed token

    def start(self, target: Backend, inputs: PreparedInputs, target_state: DecodeState, clock) -> dict:
        """Prefill the draft (after pruning, if configured); returns timings and token counts."""
        t0 = clock()
        keep = None
        if self.prune is not None and inputs.num_visual_tokens:
            keep = select_visual_tokens(target_state.extra["visual_attention"], self.prune)
        t1 = clock()
        backend = self.backend or target
        draft_inputs = inputs if backend is target else backend.prepare(*inputs.extra["request"])
        if backend is not target and draft_inputs.num_visual_tokens != inputs.num_visual_tokens:
            raise ValueError("draft and target disagree on the number of visual tokens "
                             f"({draft_inputs.num_visual_tokens} vs {inputs.num_visual_tokens}): they must "
                             "share the visual-token layout")
        self.state, _ = backend.prefill(draft_inputs, keep_visual=keep)
        self.active = backend
        self.num_fed = 0
        kept = inputs.num_visual_tokens if keep is None else int(keep.numel())
        return {"prune_s": t1 - t0, "draft_prefill_s": clock() - t1, "kept_visual_tokens": kept}

    def observe(self, verdict, scores) -> None:
        pass

    def propose(self, generated: list[int]) -> Draft:
        root_logits = self._refeed(generated)
        try:
            return self._grow(root_logits)
        finally:
            self.active.keep(self.state, [])  # drop the tree's temporary entries

    def _refeed(self, generated: list[int]) -> torch.Tensor:
        """Feed committed tokens not yet in the draft cache; return logits after the last one."""
        new = generated[self.num_fed:]
        if not new:  # proposed again with nothing committed since: same root as last time
            return self._root_logits
        st = self.state
        st.pending = []
        offsets = torch.arange(len(new))
        visible = torch.tril(torch.ones(len(new), len(new), dtype=torch.bool))
        logits, _ = self.active.forward(st, torch.tensor(new), offsets, visible)
        self.active.keep(st, list(range(len(new))))
        self.num_fed = len(generated)
        self._root_logits = logits[-1]
        return self._root_logits

    def _grow(self, root_logits: torch.Tensor) -> Draft:
        """Expand the tree level by level (growth.grow); each level is one batched draft forward."""
        slots: dict[int, int] = {}  # candidate index -> temporary cache index

        def feed(cands, frontier: list[int], depth: int) -> torch.Tensor:
            st = self.state
            visible = growth.ancestor_visibility(cands, frontier, slots, st.temp_len)
            tokens = torch.tensor([cands[c].token for c in frontier])
            # The root sits at offset -1 (it is the last committed token); a node at depth d at d - 1.
            logits, _ = self.active.forward(st, tokens, torch.full((len(frontier),), depth - 1), visible)
            return logits

        return growth.grow(self.tree, root_logits, feed)


def wall_clock() -> float:
    return time.perf_counter()
