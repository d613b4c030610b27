"""What every model family shares: the decode state, tree-masked forwards and cache operations.

A family backend (qwen2_5_vl.py, qwen3_vl.py, qwen3_5.py, llava_onevision.py) supplies only what
differs: how a prompt and its video become model inputs, which positions a token at a given sequence
index gets, and where the language model's layers are. Everything the decoding loop calls is defined here:

    state = backend.prefill(inputs)                # prompt -> cache; first token pending
    logits, hidden = backend.forward(state, ...)   # append temporary entries with a tree mask
    backend.keep(state, temp_indices)              # keep some temporary entries, drop the rest
    scores = backend.score(state, draft)           # pending + draft tree in one forward
    backend.commit(state, verdict)                 # keep the accepted path, queue the rest

Layers without keys and values (Gated DeltaNet: a recurrent state) join the same contract through
linear_state.py: a forward's tokens follow the tree in those layers too, and keep() rolls their state
to the kept path. No method or family code sees the difference.

Cache slots and positions are separate on purpose: a pruned draft (SpecVLM) holds fewer cache
entries than the target but gives its tokens the same positions (`next_pos` counts sequence
indices of the full, unpruned sequence).
"""
from __future__ import annotations

import contextlib
import weakref
from dataclasses import dataclass, field
from typing import Iterator

import torch
from transformers import DynamicCache

from . import attention, linear_kernels, linear_state, tree_layout
from .types import Draft, Scores, Verdict

FINAL = -1  # hidden-layer key for the final normalised hidden state (what the LM head reads)


@dataclass
class PreparedInputs:
    """A tokenised prompt with its visual inputs, ready for prefill."""

    input_ids: torch.Tensor  # [1, seq_len]
    visual_mask: torch.Tensor  # [seq_len] bool: which positions hold visual tokens
    model_kwargs: dict  # family-specific visual inputs (pixel values, grids, ...)
    positions: torch.Tensor | None = None  # family-specific full-sequence position ids
    extra: dict = field(default_factory=dict)

    @property
    def num_visual_tokens(self) -> int:
        return int(self.visual_mask.sum())

    @property
    def visual_span(self) -> tuple[int, int]:
        """[first, last + 1) of the visual tokens (0, 0 when there are none)."""
        idx = self.visual_mask.nonzero().flatten()
        return (int(idx[0]), int(idx[-1]) + 1) if idx.numel() else (0, 0)


@dataclass
class DecodeState:
    """One model's view of a sequence being decoded."""

    cache: DynamicCache
    cache_len: int  # committed cache entries; entries beyond are temporary
    next_pos: int  # sequence index (in the unpruned sequence) of the first pending token
    pending: list[int]  # committed tokens whose KV entries are not computed yet
    # (the `pending` list, the same tokens on the device) when commit could take them from the scores
    # (one root token, the target's own: no upload next step); valid while `pending` is that list
    pending_ids: tuple[list[int], torch.Tensor] | None = None
    temp_len: int = 0
    prompt_hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [prompt_len, hidden]
    visual_hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [num_visual, hidden]
    extra: dict = field(default_factory=dict)  # family-specific (e.g. Qwen's rope delta)

    def pending_on_device(self) -> torch.Tensor | None:
        """[len(pending)] the pending tokens on the device, where they were left there; else None."""
        ids = self.pending_ids
        return ids[1] if ids is not None and ids[0] is self.pending else None


def additive_mask(num_committed: int, visible: torch.Tensor, dtype, device) -> torch.Tensor:
    """[1, 1, m, num_committed + t] float mask: 0 where visible, the dtype's min elsewhere.

    Committed entries are visible to all; `visible` [m, t] covers the entries after them.
    """
    m, t = visible.shape
    mask = torch.zeros((1, 1, m, num_committed + t), dtype=dtype, device=device)
    # 4 aten ops in all (a slice view, not an index per dimension), one allocation
    mask.narrow(3, num_committed, t).masked_fill_(visible.to(device).logical_not(), torch.finfo(dtype).min)
    return mask


def run_prompt(text_model, embeds: torch.Tensor, positions: torch.Tensor, cache: DynamicCache,
               collect_from: int | None = None, extra: dict | None = None) -> tuple[object, attention.TextQueries | None]:
    """Run a prompt's embeddings [1, L, hidden] into `cache` in one forward; with `collect_from`
    (the end of the video), keep meanwhile the query rows from there on (attention.TextQueries),
    the kernel's output untouched. Returns (the output, the queries or None); `pruning_scores`
    turns them into SpecVLM's pruning scores. The engine's prefill and the demo draft's pruned
    distillation (training/demo.py `pruned_keep`) select video tokens from the same scores this way.
    extra: further text-model arguments for these rows (Qwen3-VL's DeepStack features)."""
    collect = (attention.collect_text_queries(text_model.config, collect_from)
               if collect_from is not None else contextlib.nullcontext())
    with collect as queries:
        out = text_model(inputs_embeds=embeds, position_ids=positions, cache=cache, use_cache=True, **(extra or {}))
    return out, queries


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Keep the first `length` entries of every KV layer (DynamicCache.crop wants a negative count);
    linear-attention layers hold no entries to crop (their temporary tokens: linear_state.keep)."""
    for layer in cache.layers:
        if getattr(layer, "keys", None) is not None and layer.keys.shape[-2] > length:
            layer.keys = layer.keys[:, :, :length]
            layer.values = layer.values[:, :, :length]


def stop_token_ids(model, tokenizer) -> set[int]:
    """The token(s) that end an answer: the tokenizer's eos token, as lmms-eval's classes pass
    `eos_token_id=tokenizer.eos_token_id` to generate() (for Qwen2.5-VL <|im_end|>, 151645, and not the
    generation config's <|endoftext|>, 151643); the generation config's only without one."""
    if tokenizer.eos_token_id is not None:
        return {int(tokenizer.eos_token_id)}
    eos = model.generation_config.eos_token_id if model.generation_config else None
    if eos is None:
        raise ValueError("neither the tokenizer nor the generation config names an eos token")
    return set(eos if isinstance(eos, (list, tuple)) else [eos])


class Backend:
    """Base class; subclasses implement `prepare`, `_visual_embeds`, `position_ids`, `text_model`."""

    kernels: linear_kernels.KernelReport | None = None  # CPU kernels load_backend installed (None: nn.Linear)

    def __init__(self, model, tokenizer, device: torch.device | str = "cpu"):
        self.model = model
        self.tokenizer = tokenizer
        self.device = torch.device(device)
        self.eos_token_ids = stop_token_ids(model, tokenizer)

    @property
    def family(self) -> str:
        """The checkpoint's model_type (models/parity.py keys lmms-eval's classes on it)."""
        return self.model.config.model_type

    # ---- family hooks -------------------------------------------------------------------------
    def prepare(self, prompt: str, videos: list) -> PreparedInputs:
        raise NotImplementedError

    def text_model(self) -> torch.nn.Module:
        """The decoder stack: has `.layers` and `.norm`."""
        raise NotImplementedError

    def input_embeds(self, inputs: PreparedInputs) -> torch.Tensor:
        """[1, seq_len, hidden] embeddings with visual features scattered in."""
        raise NotImplementedError

    def position_ids(self, state_extra: dict, seq_index: torch.Tensor) -> torch.Tensor:
        """Position ids in the layout the model's forward takes, for text tokens at `seq_index`."""
        raise NotImplementedError

    def prefill_positions(self, inputs: PreparedInputs) -> torch.Tensor:
        """Position ids for the whole prompt; last dim indexes the sequence."""
        raise NotImplementedError

    def init_extra(self, inputs: PreparedInputs) -> dict:
        return {}

    def text_inputs(self, inputs: PreparedInputs, rows: torch.Tensor) -> dict:
        """Extra text-model arguments for a prompt forward over `rows` (long indices into the full
        prompt, in order): none for most families; Qwen3-VL's DeepStack features of those rows."""
        return {}

    # ---- a vision tower shared with another model ----------------------------------------------
    # keep_vision_trunk: keep the vision tower's output before its projection in
    # inputs.extra["vision_trunk"] as (this backend, tensor), for a draft whose tower is this one's
    # (set by ModelDrafter when `shares_vision_trunk` says so; the drafter drops it once prepared).
    keep_vision_trunk = False

    def shares_vision_trunk(self, other: Backend) -> bool:
        """Whether this model's vision tower, up to its own projection to the language model, is
        `other`'s (the same weights): it then embeds a video from other's trunk output instead of
        running its tower again. Checked once per pair; a family that cannot tell says False."""
        cache = self.__dict__.setdefault("_shared_trunk", weakref.WeakKeyDictionary())
        if other not in cache:
            cache[other] = self._same_vision_trunk(other)
        return cache[other]

    def _same_vision_trunk(self, other: Backend) -> bool:
        return False

    @property
    def num_layers(self) -> int:
        return len(self.text_model().layers)

    # ---- hidden states ------------------------------------------------------------------------
    @contextlib.contextmanager
    def capture_hidden(self, layers) -> Iterator[dict[int, torch.Tensor]]:
        """Record the hidden state after the given layers (1-based; FINAL = after the final norm).

        Layer k's state is read where the model consumes it, as the input of layer k + 1 (of the
        final norm for the last layer), not as layer k's output: a model may change it in between
        (Qwen3-VL adds DeepStack features to the visual rows after its first layers), and the
        hidden states LVSpec and Sparrow read must be the ones the model computes with.
        """
        captured: dict[int, torch.Tensor] = {}
        handles = []
        text = self.text_model()
        bad = sorted(l for l in set(layers) if l != FINAL and not 1 <= l <= len(text.layers))
        if bad:
            raise ValueError(f"hidden layer(s) {bad} out of range: the model has decoder layers 1..{len(text.layers)} "
                             f"(or {FINAL} for the final norm)")
        for layer in set(layers):
            if layer == FINAL:
                def hook(_mod, _inp, out, layer=layer):
                    captured[layer] = (out[0] if isinstance(out, tuple) else out)[0]

                handles.append(text.norm.register_forward_hook(hook))
                continue
            consumer = text.layers[layer] if layer < len(text.layers) else text.norm

            def pre_hook(_mod, args, kwargs, layer=layer):
                captured[layer] = (args[0] if args else kwargs["hidden_states"])[0]

            handles.append(consumer.register_forward_pre_hook(pre_hook, with_kwargs=True))
        try:
            yield captured
        finally:
            for h in handles:
                h.remove()

    # ---- prefill ------------------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, inputs: PreparedInputs, hidden_layers=(), keep_visual: torch.Tensor | None = None,
                visual_attention: bool = False) -> tuple[DecodeState, torch.Tensor]:
        """Run the prompt; return the state and the logits [vocab] of the first generated token.

        keep_visual: indices (into the visual tokens) to keep; the others are dropped from the
        cache while every kept token keeps its original position (SpecVLM's pruned draft).
        visual_attention: keep what SpecVLM's pruning scores (the attention the text after the video
        pays each visual token) need of this one prefill: the text's query rows per layer
        (attention.TextQueries); `visual_attention(state)` computes the scores from them when asked.
        hidden_layers: record the prompt's hidden states at these layers (state.prompt_hidden, and
        the visual tokens' rows in state.visual_hidden).
        """
        # The prompt's embeddings (vision tower included) are computed once per request: a target
        # drafting for itself (Self-SD) prefills from the same ones.
        embeds = inputs.extra.get("embeds")
        if embeds is None:
            embeds = inputs.extra["embeds"] = self.input_embeds(inputs)
        positions = self.prefill_positions(inputs)
        seq_len = embeds.shape[1]
        vmask = inputs.visual_mask.to(embeds.device)
        rows = torch.arange(seq_len, device=embeds.device)  # prompt rows this prefill runs, in order
        if keep_visual is not None:
            keep_mask = ~vmask
            keep_mask[vmask.nonzero().flatten()[keep_visual.to(embeds.device)]] = True
            embeds, positions, rows = embeds[:, keep_mask], positions[..., keep_mask], rows[keep_mask]
        cache = DynamicCache(config=self.model.config.get_text_config())
        end = inputs.visual_span[1]
        collect_from = end if visual_attention and 0 < end < seq_len and keep_visual is None else None
        state = DecodeState(cache=cache, cache_len=embeds.shape[1], next_pos=seq_len, pending=[],
                            extra=self.init_extra(inputs))
        with self.capture_hidden(hidden_layers) as hidden:
            out, queries = run_prompt(self.text_model(), embeds, positions, cache, collect_from,
                                      self.text_inputs(inputs, rows))
        if queries is not None:  # the scores themselves: `visual_attention`, when a pruned draft is prepared
            state.extra["text_queries"], state.extra["visual_span"] = queries, inputs.visual_span
            # of the visual span, the video tokens' scores (Qwen3-VL puts timestamps and markers between frames)
            lo, hi = inputs.visual_span
            state.extra["video_in_span"] = inputs.visual_mask[lo:hi]
        for layer in hidden_layers:
            state.prompt_hidden[layer] = hidden[layer]
            if keep_visual is None:  # with a device_map, each layer's rows sit on that layer's device
                rows = state.prompt_hidden[layer]
                state.visual_hidden[layer] = rows[vmask.to(rows.device)]
        return state, self.lm_head(out.last_hidden_state[:, -1])[0]

    def visual_attention(self, state: DecodeState) -> torch.Tensor:
        """[num_visual] SpecVLM's pruning scores of a prefill run with visual_attention=True: the
        attention the text after the video pays each visual token, averaged over layers, heads and
        text queries; computed on first call from the kept queries and the cache's prompt keys."""
        scores = state.extra.get("visual_attention")
        if scores is None:
            queries = state.extra.pop("text_queries")
            scores = attention.pruning_scores(queries, state.cache, *state.extra["visual_span"])
            state.extra["visual_attention"] = scores = scores[state.extra["video_in_span"].to(scores.device)]
        return scores

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        # under a device_map the LM head may sit on another device: logits come back to ours
        return self.model.lm_head(hidden).float().to(self.device)

    # ---- tree-masked forwards and cache operations ---------------------------------------------
    @torch.no_grad()
    def forward(self, state: DecodeState, tokens: torch.Tensor, pos_offsets: torch.Tensor,
                visible: torch.Tensor | None, hidden_layers=()) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """Append `tokens` as temporary cache entries and return their logits [m, vocab].

        pos_offsets: [m] sequence offsets from state.next_pos. visible: [m, temp_len + m] bool,
        which temporary entries (earlier ones, then these) each token sees; committed entries are
        always visible. None: a plain causal step over no earlier temporary entries (the caller
        knows; no look at a device tensor needed), which lets the attention kernel take its
        unmasked path for one token, and a linear-attention layer its own one-token kernel, which
        advances its state in place: a one-token plain step must be kept (as vanilla's steps and
        a drafter's catch-up are). Float additive masks with explicit positions keep tree scoring
        exact.
        """
        m = tokens.numel()
        if visible is None and state.temp_len:
            raise ValueError("forward(visible=None) is a causal step over no temporary entries; "
                             f"{state.temp_len} are present: pass their visibility")
        if visible is None and m > 1:
            visible = torch.ones(m, m, dtype=torch.bool, device=self.device).tril()
        mask = None if visible is None else additive_mask(state.cache_len, visible, self.model.dtype, self.device)
        positions = self.position_ids(state.extra, state.next_pos + pos_offsets.to(self.device))
        # linear-attention layers: the tree (visible), or a plain step run by the model's own kernel
        ancestors = visible if visible is not None else linear_state.PLAIN
        # several tokens: linear layers may take the kernel measured fastest for that many rows
        # (linear_kernels.py, CPU only); one token: exactly transformers' own path
        kernels = linear_kernels.multi_token() if m > 1 else contextlib.nullcontext()
        # no layers asked: no hooks to set up (a one-token step's host work is mostly this wrapper)
        capture = self.capture_hidden(hidden_layers) if hidden_layers else contextlib.nullcontext({})
        with capture as hidden, linear_state.temporary(ancestors), kernels:
            out = self.text_model()(input_ids=tokens.view(1, -1).to(self.device), position_ids=positions,
                                    attention_mask=mask, cache=state.cache, use_cache=True)
            logits = self.lm_head(out.last_hidden_state[0])
        state.temp_len += m
        return logits, dict(hidden)

    def keep(self, state: DecodeState, temp: int | list[int] | torch.Tensor) -> None:
        """Commit temporary entries into contiguous slots and drop the others.

        temp: how many of the first temporary entries to keep (no gather needed), or the indices
        of those to keep, in order (a list, or a long tensor already on the device). The gather
        index is built once per cache device, so layers spread over several GPUs (device_map)
        each gather on their own device. A linear-attention layer (Qwen3.5's Gated DeltaNet) holds
        one state, not entries: what is kept must be one path from the committed tokens (as commit
        and the drafters keep: pending tokens and a prefix of the accepted path), whose state
        linear_state.keep re-derives.
        """
        start = state.cache_len
        index = None
        if isinstance(temp, int):
            num = temp
        else:
            index = temp if isinstance(temp, torch.Tensor) else torch.tensor(temp, dtype=torch.long, device=self.device)
            num = index.numel()
            per_device: dict[torch.device, torch.Tensor] = {}
            for layer in state.cache.layers:
                if getattr(layer, "keys", None) is None:
                    continue
                dev = layer.keys.device
                if dev not in per_device:
                    per_device[dev] = index.to(dev) + start
                dst = slice(start, start + num)
                layer.keys[:, :, dst] = layer.keys.index_select(2, per_device[dev])
                layer.values[:, :, dst] = layer.values.index_select(2, per_device[dev])
        for layer in state.cache.layers:
            if linear_state.is_linear_layer(layer):
                linear_state.keep(layer, index, num)  # the kept entries are one path: its state
        crop_cache(state.cache, start + num)
        state.cache_len = start + num
        state.next_pos += num
        state.temp_len = 0

    def adopt_inputs(self, inputs: PreparedInputs, source: Backend) -> PreparedInputs:
        """Another backend's prepared inputs for this model, without preparing the request again
        (a draft of the same family: same tokenizer and visual-token layout, checked at load).
        Falls back to `prepare` when the two preprocess differently."""
        if getattr(self, "preprocess", None) != getattr(source, "preprocess", None) or \
                type(self) is not type(source):
            return self.prepare(*inputs.extra["request"])

        def move(value):
            if not isinstance(value, torch.Tensor):
                return value
            return value.to(self.device, self.model.dtype) if value.is_floating_point() else value.to(self.device)

        return PreparedInputs(input_ids=inputs.input_ids.to(self.device), visual_mask=inputs.visual_mask,
                              model_kwargs={k: move(v) for k, v in inputs.model_kwargs.items()},
                              positions=None if inputs.positions is None else inputs.positions.to(self.device),
                              extra={k: v for k, v in inputs.extra.items() if not k.startswith("embeds")})

    def score(self, state: DecodeState, draft: Draft, hidden_layers=()) -> Scores:
        """One forward over the pending tokens and the draft tree (root = last pending token).

        Built on the device: the draft's tokens stay there, mask and positions come from its
        parents there; only the pending tokens (a host list) are copied up.
        """
        if not state.pending:
            raise ValueError("score() needs at least one pending token (the root)")
        p = len(state.pending)
        pending = state.pending_on_device()
        if pending is None:
            pending = torch.tensor(state.pending, dtype=torch.long, device=self.device)
        if draft.num_nodes == 0 and p == 1 and state.temp_len == 0:
            offsets, visible = torch.zeros(1, dtype=torch.long, device=self.device), None  # a plain step
        else:
            offsets, visible = tree_layout.pending_and_tree_layout(p, draft.parents.to(self.device), draft.depth)
        tokens = torch.cat([pending, draft.tokens.to(self.device)])
        logits, hidden = self.forward(state, tokens, offsets, visible, hidden_layers)
        return Scores(logits=logits[p - 1:], hidden=hidden, num_pending=p)

    def commit(self, state: DecodeState, verdict: Verdict, scores: Scores | None = None) -> None:
        """After score(): keep pending + the cached part of the accepted path; queue the rest.
        scores: the step's (optional): where only the target's own last token is queued, the next
        step takes it from them on the device instead of copying it up."""
        p = len(state.pending)
        cached = verdict.path[: verdict.num_cached]
        if cached == list(range(len(cached))):  # a chain's prefix (or nothing): no gather needed
            self.keep(state, p + len(cached))
        elif scores is not None:  # the path's index uploaded once for the step (Scores.node_ids)
            nodes = scores.node_ids(cached).to(self.device)
            self.keep(state, torch.cat([torch.arange(p, device=self.device), nodes + p]))
        else:
            self.keep(state, list(range(p)) + [p + i for i in cached])
        state.pending = list(verdict.tokens[verdict.num_cached:])
        state.pending_ids = None
        if scores is not None and len(state.pending) == 1:
            root = scores.committed_root(verdict)
            state.pending_ids = None if root is None else (state.pending, root.to(self.device))
