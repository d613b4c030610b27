"""Drafting with a small head that reads the target's final hidden states (EAGLE-style): the
machinery Sparrow (sparrow.py) and the checkpoint's own MTP layers (mtp.py) share.

A head turns (a token's embedding, the target's final normed hidden state h of the sequence row
before it) into a layer input, runs its decoder layer(s) over its own KV cache and returns its
estimate of the target's h at that token, which the target's LM head turns into logits for the
next token and which is fed back as h for the next draft position.

The head's cache holds one entry per "slot": first the prompt rows the head sees (the subclass
chooses them: `_prompt_rows`), then the generated tokens in order, so generated token i sits in
slot `prompt_slots + i`. The slot number is the head's 1-D position; `_position_ids` turns slots
into the position ids the head's forward takes (Sparrow: the slots themselves, which count text
tokens; MTP: the target's own positions of the sequence row whose h the slot reads).

Bookkeeping: feeding committed token t needs the target's true h_{t-1}. The target computes the
hidden state of a committed token when it verifies it (as a pending token or an accepted draft
node), so the committed tokens with known hidden states are always a prefix of the sequence: all
but the pending tail (with exact verification, only the bonus token). Every committed token whose
predecessor's hidden state is known is fed into the cache for good; the rest of the tail, if any,
is fed temporarily with the head's own outputs as h (like tree nodes) and fed for good after the
next verification has produced their true hidden states.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from ...backends.base import (
    FINAL,
    Backend,
    DecodeState,
    PreparedInputs,
    additive_mask,
    crop_cache,
)
from ..tree import TreeConfig
from ..types import Draft, Preparation
from . import growth


class HiddenStateDrafter:
    """Drafts trees (or chains) with a head on the target's final hidden states.

    A subclass says which prompt rows the head's cache gets (`_prompt_rows`), which position ids a
    slot has (`_position_ids`) and how the cache is made (`_new_cache`); the head supplies
    `project(embeds, prev_hidden)` (its input projection) and `forward(x, position_ids, mask, cache)`.
    """

    name = "hidden_state"
    hidden_layers: tuple[int, ...] = (FINAL,)
    prefill_layers: tuple[int, ...] = ()  # the prompt's FINAL states come with hidden_layers
    needs_visual_attention = False
    hsr = True  # feed the target's hidden states (Sparrow can switch this off: sparrow_hsr=off)

    def __init__(self, head, target: Backend, tree: TreeConfig, eager: bool = True):
        self.head, self.target, self.tree, self.eager = head, target, tree, eager
        self.preparation: Preparation | None = None  # what preparing the head cost, once prepared
        self._request: tuple | None = None  # (inputs, target state, clock) until prepared
        self.embed = target.model.get_input_embeddings()
        self.cache: DynamicCache | None = None
        self.cache_len = self.temp_len = 0  # committed / temporary entries in the head's cache
        self.prompt_slots = 0  # the head's cache entries for the prompt (generated token i: slot prompt_slots + i)
        self.num_fed = 0  # generated tokens in the cache for good
        self.known: list[torch.Tensor] = []  # target FINAL h of generated tokens (a prefix of them)
        self.last_prompt_h: torch.Tensor | None = None
        self.last: tuple[torch.Tensor, torch.Tensor] | None = None  # (logits, out) after the last fed token
        self.num_generated = 0
        self.follows = True  # whether this request may draft (then the target's h are recorded step by step)
        self.planner: growth.TreePlanner | None = None  # the draft shape policy, made on first use
        self._unfed = growth.UnfedTokens()  # the committed tokens not yet fed, on the device where known
        self._draft: Draft | None = None  # the last proposal (observe reads its tokens on the device)

    # ---- subclass hooks -----------------------------------------------------------------------
    def _prompt_rows(self, inputs: PreparedInputs, hidden: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        """The prompt's entries in the head's cache, in order: (tokens [m], their input embeddings
        [m, hidden] or None for the tokens' own, the h each is fed with [m, hidden]).
        hidden: the target's FINAL hidden states of the prompt [prompt_len, hidden]."""
        raise NotImplementedError

    def _position_ids(self, slots: torch.Tensor) -> torch.Tensor:
        """Position ids, as the head's forward takes them, for the cache slots `slots` [m]."""
        return slots[None]

    def _new_cache(self) -> DynamicCache:
        return DynamicCache(config=self.head.config)

    def _kept_visual_tokens(self, inputs: PreparedInputs) -> int:
        """Visual tokens in the head's cache (Sparrow: none)."""
        return 0

    # ---- protocol -----------------------------------------------------------------------------
    @torch.no_grad()
    def start(self, target: Backend, inputs: PreparedInputs, target_state: DecodeState, clock) -> dict:
        """Take the request; prepare the head now when eager (else on its first draft: `prepare`).
        The head's bookkeeping of the target's hidden states (`observe`) runs either way."""
        if self.planner is None:
            self.planner = growth.TreePlanner(self.tree, self.target.device, self.target.eos_token_ids)
        self.planner.start_sample(inputs.extra.get("max_new_tokens"), int(inputs.input_ids.shape[1]), self.eager,
                                  inputs.extra.get("prefill_s"))
        self.cache, self.preparation, self.known, self.num_generated, self._draft = None, None, [], 0, None
        self._unfed.clear()
        self._unfed.add(list(target_state.pending), target_state.pending_on_device())  # the first root
        self._request = (inputs, target_state, clock)
        self.follows = inputs.extra.get("may_draft", True)  # no: the request never drafts, nothing to follow
        return self.prepare(0).as_dict() if self.eager else {}

    def may_draft(self, budget: int | None) -> bool:
        """Whether the next request may need the draft (growth.may_draft): an eager drafter prepares it at
        every request's start, whatever its steps do."""
        return self.eager or growth.may_draft(self.planner, self.tree, budget)

    def finish(self) -> None:
        """The request is over: let go of its tensors outside its timed window (ModelDrafter.finish says
        why): the target's inputs and state (held until prepared), the head's cache over the prompt's rows
        and the answer's, and the target's hidden states of the answer. The counts stay (for tests and
        stats); the next `start` resets them."""
        self._request, self.cache, self.known, self.last_prompt_h = None, None, [], None

    @torch.no_grad()
    def prepare(self, num_generated: int) -> Preparation:
        """Feed the prompt rows the head sees (`_prompt_rows`), each with the target's h at the
        previous sequence position."""
        inputs, target_state, clock = self._request
        t0 = clock()
        hidden = target_state.prompt_hidden[FINAL]  # [prompt_len, hidden]
        tokens, embeds, prev = self._prompt_rows(inputs, hidden)
        self.cache = self._new_cache()
        self.cache_len = self.temp_len = self.num_fed = 0
        self.prompt_slots, self.last_prompt_h = tokens.numel(), hidden[-1]
        self._feed_committed(tokens, prev, embeds)
        self._request = None
        self.preparation = Preparation(num_generated, draft_prefill_s=clock() - t0,
                                       kept_visual_tokens=self._kept_visual_tokens(inputs))
        self.planner.prepared(self.preparation.total_s)
        return self.preparation

    @torch.no_grad()
    def propose(self, generated: list[int]) -> Draft:
        self.num_generated = len(generated)
        shape, plan = self.planner.next_shape(len(generated))
        if shape is None:  # the draft policy expects no draft to pay this step
            self._draft = Draft.empty(self.target.device, plan)
            return self._draft
        if self.cache is None:  # the first draft of this request: prepare the head now (lazy)
            self.prepare(len(generated))
        try:
            logits, out, tail = self._catch_up(generated)
            self._draft = self._grow(shape, plan, logits, out, tail, len(generated) - 1)
            return self._draft
        finally:
            crop_cache(self.cache, self.cache_len)  # drop the tail's and the tree's temporary entries
            self.temp_len = 0

    @torch.no_grad()
    def observe(self, verdict, scores, step=None) -> None:
        """Record the target's true h for the pending tokens and the accepted cached nodes (in a
        request that may draft: in one that cannot, the loop asks the target for no hidden states)."""
        if self._draft is not None:
            self._unfed.add(verdict.tokens, scores.committed_ids(self._draft, verdict))
        if not self.follows:
            if step is not None:
                self.planner.observe(verdict, scores, step)
            return
        p = scores.num_pending
        if len(self.known) + p != self.num_generated:
            raise RuntimeError(f"{self.name} bookkeeping: {len(self.known)} known hidden states + {p} pending "
                               f"tokens != {self.num_generated} generated tokens")
        hidden = scores.hidden[FINAL]  # [num_pending + num_nodes, hidden]
        self.known.extend(hidden[:p].unbind(0))
        self.known.extend(hidden[p + node] for node in verdict.path[: verdict.num_cached])
        if step is not None:
            self.planner.observe(verdict, scores, step)

    def estimates(self) -> dict | None:
        return None if self.planner is None else self.planner.estimates()

    # ---- head forwards ------------------------------------------------------------------------
    def _run(self, tokens: torch.Tensor, prev: torch.Tensor, positions: torch.Tensor,
             visible: torch.Tensor, embeds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Append m temporary entries; return (logits [m, vocab], head outputs [m, hidden]).

        positions [m]: the entries' slots; visible [m, temp_len + m]: which temporary entries each
        token sees (committed: all); embeds [m, hidden]: input embeddings (default: the tokens').
        """
        device, dtype = self.target.device, self.target.model.dtype
        if not self.hsr:
            prev = torch.zeros_like(prev)
        embeds = self.embed(tokens.to(device)) if embeds is None else embeds.to(device, dtype)
        x = self.head.project(embeds, prev.to(device, dtype))
        mask = additive_mask(self.cache_len, visible, dtype, device)
        out = self.head(x[None], self._position_ids(positions.to(device)), mask, self.cache)[0]
        self.temp_len += tokens.numel()
        return self.target.lm_head(out), out

    def _feed_committed(self, tokens: torch.Tensor, prev: torch.Tensor, embeds: torch.Tensor | None = None) -> None:
        """Feed committed tokens (with their true previous h) into the cache for good."""
        m = tokens.numel()
        positions = torch.arange(self.cache_len, self.cache_len + m)
        logits, out = self._run(tokens, prev, positions, torch.ones(m, m, dtype=torch.bool).tril(), embeds)
        self.cache_len += m
        self.temp_len = 0
        self.last = (logits[-1], out[-1])

    def _prev_hidden(self, index: int) -> torch.Tensor:
        """The target's h of generated token `index` (-1: the last prompt token)."""
        return self.last_prompt_h if index < 0 else self.known[index]

    def _catch_up(self, generated: list[int]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """Feed what can be fed for good, then the rest of the tail temporarily.

        Returns (logits [vocab], head output [hidden]) after the root, and the number of temporary
        tail entries (visible to every tree node).
        """
        stop = min(len(generated), len(self.known) + 1)  # token i needs the h of token i - 1
        if stop > self.num_fed:
            prev = torch.stack([self._prev_hidden(i - 1) for i in range(self.num_fed, stop)])
            new = generated[self.num_fed:stop]
            ids = self._unfed.take(new)  # the committed tokens on the device (else copied up)
            self._feed_committed(torch.tensor(new) if ids is None else ids, prev)
            self.num_fed = stop
        logits, out = self.last
        for i in range(stop, len(generated)):  # pending tokens after the first unknown h
            tail = i - stop
            visible = torch.ones(1, tail + 1, dtype=torch.bool)
            logits, out = self._run(torch.tensor([generated[i]]), out[None], torch.tensor([self.prompt_slots + i]),
                                    visible)
            logits, out = logits[0], out[0]
        return logits, out, len(generated) - stop

    def _grow(self, shape, plan, root_logits: torch.Tensor, root_out: torch.Tensor, tail: int,
              root_index: int) -> Draft:
        """Grow the tree; a node's h is its parent's head output (the root's included)."""
        outs = [root_out[None]]  # row 0: the root's head output; then each fed node's, in feed order
        root_pos = self.prompt_slots + root_index

        def feed(tokens: torch.Tensor, visible: torch.Tensor, parent_rows: torch.Tensor, depth: int) -> torch.Tensor:
            m = tokens.numel()
            visible = torch.cat([torch.ones(m, tail, dtype=torch.bool, device=visible.device), visible], dim=1)
            prev = torch.cat(outs)[parent_rows + 1]
            positions = torch.full((m,), root_pos + depth, device=tokens.device)
            logits, out = self._run(tokens, prev, positions, visible)
            outs.append(out)
            return logits

        return self.planner.grow(shape, plan, root_logits, feed)
