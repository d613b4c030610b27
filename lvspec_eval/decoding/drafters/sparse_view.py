"""Sparse-to-Dense (StD, arXiv 2505.19155): the target drafts for itself over a sparse view of its own
KV cache, no draft model; the target's ordinary (dense) verification keeps it exact.

The view (backends/sparse_view.py) holds, per attention layer and KV head, every text entry and the
K video entries the text attended to most at prefill; the entries the target commits while decoding
are appended as they come (its dense keys and values: the view never computes its own). Each step
the target runs the pending tokens (committed, not yet in its cache: the last bonus token) and then
the draft tree over the view as temporary entries, and drops them. StD drafts a chain of 9
(`tree=chain`, `tree_depth=9`, the method's defaults); any tree kind works.

K: StD fixes K + m_t = 1024 entries per layer (m_t: the prompt's text entries). `std_budget` sets
that total; by default K is a share `std_keep` (0.1) of the video tokens, since the demo's videos hold
far fewer than 1024 tokens (1.0: all of them); `std_keep` > 1 is a count.
"""
from __future__ import annotations

import math

import torch

from ...backends import sparse_view
from ...backends.base import Backend, DecodeState, PreparedInputs
from ..tree import TreeConfig
from ..types import Draft, Preparation
from . import growth


class SparseViewDrafter:
    """The target drafting over a sparse view of its own cache (see the module docstring)."""

    name = "sparse_view"
    hidden_layers: tuple[int, ...] = ()
    prefill_layers: tuple[int, ...] = ()
    needs_visual_attention = True  # the prefill keeps the text's query rows (attention.TextQueries)

    def __init__(self, tree: TreeConfig, keep: float = 0.1, budget: int | None = None, eager: bool = True):
        if keep <= 0:
            raise ValueError(f"std_keep={keep} must be > 0 (a share of the video tokens up to 1, a count above 1)")
        if budget is not None and budget < 1:
            raise ValueError(f"std_budget={budget} must be >= 1 (entries per layer, K + text)")
        self.tree, self.keep_share, self.budget, self.eager = tree, keep, budget, eager
        self.planner: growth.TreePlanner | None = None
        self.state: DecodeState | None = None  # the view's decode state, once prepared
        self.preparation: Preparation | None = None
        self.synced = 0  # target cache entries already in the view

    def start(self, target: Backend, inputs: PreparedInputs, target_state: DecodeState, clock) -> dict:
        if self.planner is None or self.planner.grower.device != target.device:
            self.planner = growth.TreePlanner(self.tree, target.device, target.eos_token_ids)
        self.planner.start_sample(inputs.extra.get("max_new_tokens"), int(inputs.input_ids.shape[1]), self.eager,
                                  inputs.extra.get("prefill_s"))
        self.target, self.target_state, self.clock = target, target_state, clock
        self.video = self._video_rows(inputs)
        self.state, self.preparation = None, None
        return self.prepare(0).as_dict() if self.eager else {}

    def num_kept(self, num_video: int, num_text: int) -> int:
        """K: video entries kept per layer and KV head."""
        if self.budget is not None:
            return max(1, min(num_video, self.budget - num_text))
        k = self.keep_share if self.keep_share > 1 else math.floor(num_video * self.keep_share + 1e-9)
        return max(1, min(num_video, int(k)))

    def prepare(self, num_generated: int) -> Preparation:
        """Score the video entries per layer and KV head, and gather the view."""
        target, st = self.target, self.target_state
        t0 = self.clock()
        queries = st.extra.pop("text_queries", None)  # None: no text after a video (the view is the whole cache)
        prompt_len = self.video.numel()
        keep, k = {}, 0
        if queries is not None and self.video.any():
            k = self.num_kept(int(self.video.sum()), prompt_len - int(self.video.sum()))
            for layer, query in queries.queries.items():
                key = st.cache.layers[layer].keys[:, :, :prompt_len]
                scores = sparse_view.head_scores(query, key, queries.scaling[layer], queries.query_start)
                keep[layer] = sparse_view.kept_entries(scores, self.video, k)
        t1 = self.clock()
        view = sparse_view.build(st.cache, target.model.config.get_text_config(), keep, prompt_len)
        length = prompt_len - int(self.video.sum()) + k if keep else prompt_len
        self.state = DecodeState(cache=view, cache_len=length, next_pos=st.next_pos, pending=[], extra=st.extra)
        self.synced = prompt_len
        self.preparation = Preparation(num_generated, prune_s=t1 - t0, draft_prefill_s=self.clock() - t1,
                                       kept_visual_tokens=k if keep else int(self.video.sum()))
        self.planner.prepared(self.preparation.total_s)
        return self.preparation

    @staticmethod
    def _video_rows(inputs: PreparedInputs) -> torch.Tensor:
        """[prompt_len] bool: the prompt's video-token rows (everything else counts as text)."""
        return inputs.visual_mask.clone()

    def propose(self, generated: list[int]) -> Draft:
        shape, plan = self.planner.next_shape(len(generated))
        if shape is None:
            return Draft.empty(self.target.device, plan)
        if self.state is None:
            self.prepare(len(generated))
        self._sync()
        try:
            return self._grow(shape, plan)
        finally:
            self.target.keep(self.state, 0)  # drop the pending tokens' and the tree's temporary entries

    def _sync(self) -> None:
        """Append what the target committed since the last step (its dense entries) to the view."""
        st = self.target_state
        sparse_view.extend(self.state.cache, st.cache, self.synced, st.cache_len)
        self.state.cache_len += st.cache_len - self.synced
        self.synced, self.state.next_pos = st.cache_len, st.next_pos

    def _grow(self, shape, plan) -> Draft:
        """Run the pending tokens (their last one is the root), then grow the tree over the view."""
        target, device = self.target, self.target.device
        pending = torch.tensor(self.target_state.pending, dtype=torch.long, device=device)
        p = pending.numel()
        causal = torch.ones(p, p, dtype=torch.bool, device=device).tril()  # explicit: never a plain step
        logits, _ = target.forward(self.state, pending, torch.arange(p, device=device), causal)

        def feed(tokens: torch.Tensor, visible: torch.Tensor, parent_rows: torch.Tensor, depth: int) -> torch.Tensor:
            m = tokens.numel()
            visible = torch.cat([torch.ones(m, p, dtype=torch.bool, device=visible.device), visible], dim=1)
            offsets = torch.full((m,), p - 1 + depth, device=tokens.device)
            return target.forward(self.state, tokens, offsets, visible)[0]

        return self.planner.grow(shape, plan, logits[-1], feed)

    def observe(self, verdict, scores, step=None) -> None:
        if step is not None:
            self.planner.observe(verdict, scores, step)

    def estimates(self) -> dict | None:
        return None if self.planner is None else self.planner.estimates()

    def may_draft(self, budget: int | None) -> bool:
        """Whether the next request may need the draft (growth.may_draft): an eager drafter prepares it at
        every request's start, whatever its steps do."""
        return self.eager or growth.may_draft(self.planner, self.tree, budget)

    def finish(self) -> None:
        """The request is over: let go of the target's state and the view (as ModelDrafter.finish)."""
        self.target_state, self.state, self.video = None, None, None


def build_drafter(options, draft_backend, target_backend) -> SparseViewDrafter:
    """methods.DRAFTERS factory: the target drafts for itself (draft_backend is not used)."""
    return SparseViewDrafter(options.tree_config(), options.std_keep, options.std_budget, eager=options.eager_draft())
