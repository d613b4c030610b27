"""The decoding loop: the only one. Every method is a drafter and a verifier plugged in here.

    prefill target -> loop { drafter.propose (preparing the draft first, once, if not yet) ->
    target.score -> verifier.verify -> commit accepted tokens + bonus -> drafter.observe }
    until EOS, a stop string or the limit.

A drafter has `may_draft(max_new_tokens)` (asked before the prefill: may any step of this request
draft? No, and the prefill captures nothing only a draft needs), `start(target, inputs, target_state,
clock)` (the request begins; with
draft_prepare=eager it prepares its draft there), `propose`, `observe`, `estimates`, `finish()` (the
request is over: it lets go of the request's tensors), and `preparation` (a types.Preparation once its
draft is prepared in this request, else None).

Vanilla decoding is the same loop with a drafter that proposes nothing.
"""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from ..backends.base import Backend
from . import tree
from .host_sync import SyncCounter
from .stats import (
    ForwardClock,
    SampleStats,
    memory_devices,
    peak_memory_mb,
    reset_peak_memory,
)
from .types import TARGET, StepStats
from .verifiers.exact import ExactVerifier

# A step without draft nodes is verified as a plain step, whatever the method's verifier: with nothing
# drafted there is nothing to accept loosely, and the target's token is the verdict. So such a step
# costs what vanilla's does: no hidden states for the verifier (LVSpec's relevance), no loose rules.
PLAIN = ExactVerifier()


@dataclass
class Output:
    tokens: list[int]  # generated tokens, EOS and anything after it removed
    text: str
    stats: SampleStats
    kinds: list[str] = field(default_factory=list)  # per token: exact/loose/pst/target
    relevance: list[float | None] = field(default_factory=list)
    # per token: for the target's token that ended a step, the draft token it overruled (the
    # draft's favourite at that slot); None for accepted tokens and when the draft had nothing there
    replaced: list[int | None] = field(default_factory=list)
    # per token: the target's margin (top-1 minus top-2 logit) at the slot where the token was
    # committed: a divergence from vanilla where this is tiny is numerics (a near-tie), not a bug
    margins: list[float] = field(default_factory=list)


def make_clock(devices):
    """A wall clock that first waits for the work queued on every CUDA device the models use (a
    device_map spreads them over several), so timings are not under-read."""
    devices = [devices] if isinstance(devices, (torch.device, str)) else list(devices)
    cuda = [torch.device(d) for d in devices if torch.device(d).type == "cuda"]
    if cuda:
        def clock() -> float:
            for device in cuda:
                torch.cuda.synchronize(device)
            return time.perf_counter()
        return clock
    return time.perf_counter


@torch.no_grad()
def generate(backend: Backend, drafter, verifier, prompt: str, videos: list, max_new_tokens: int,
             until: tuple[str, ...] = ()) -> Output:
    stats = SampleStats(dtype=str(backend.model.dtype).removeprefix("torch."))
    draft_model = getattr(getattr(drafter, "backend", None), "model", None)
    devices = memory_devices(backend.model, draft_model)  # every device the models use (device_map)
    clock = make_clock(devices)
    reset_peak_memory(devices)  # this sample's peak, not the run's
    # 1. Preprocessing (frames to pixels, the prompt to ids), then the one target prefill (which also
    #    collects the attention the text pays the video when the drafter prunes by it).
    t0 = clock()
    inputs = backend.prepare(prompt, videos)
    inputs.extra["request"] = (prompt, videos)
    inputs.extra["max_new_tokens"] = max_new_tokens  # the request's budget (the adaptive policy keys on it)
    t1 = clock()
    # Where no step of this request may draft (its answer is expected to end with each step's own
    # token: a multiple-choice letter), the prefill and the steps are vanilla's: no text queries for
    # pruning scores, no hidden states for a loose verifier or a drafter (Sparrow's head follows the
    # target's states only in a request it may draft in: inputs.extra["may_draft"]).
    drafts = inputs.extra["may_draft"] = drafter.may_draft(max_new_tokens)
    layers = tuple(sorted(set(verifier.hidden_layers) | set(drafter.hidden_layers))) if drafts else ()
    # a drafter's prefill_layers: what it reads of the prefill alone (UV-Prune's l1, l2), not of every step
    prefill_layers = tuple(sorted(set(layers) | set(getattr(drafter, "prefill_layers", ())))) if drafts else ()
    state, logits = backend.prefill(inputs, hidden_layers=prefill_layers,
                                    visual_attention=drafts and drafter.needs_visual_attention)
    stats.preprocess_s, stats.prefill_s = t1 - t0, clock() - t1
    stats.visual_tokens = stats.kept_visual_tokens = inputs.num_visual_tokens
    stats.prompt_tokens = int(inputs.input_ids.shape[1])
    # 2. The drafter starts: with draft_prepare=eager it prepares the draft now (pruning, vision tower,
    #    prefill); lazily, on the first step its policy wants a draft (never, for a one-letter answer).
    #    The first token comes from the prefill: the root of the first step, on the device too.
    first, margin = _greedy_with_margin(logits)
    state.pending = [first]
    state.pending_ids = (state.pending, logits.argmax().view(1))
    inputs.extra["prefill_s"] = stats.prefill_s  # the policy weighs the draft's preparation against it
    drafter.start(backend, inputs, state, clock)
    inputs.extra.pop("embeds", None)  # the prompt's embeddings are not needed past the prefills
    # 3. Draft, score, verify, commit.
    generated, records = [first], _TokenRecords([TARGET], [None], [None], [margin])
    t_start = clock()
    with ForwardClock(_forward_modules(backend, drafter)) as forwards, SyncCounter() as syncs:
        plain_layers = tuple(sorted(set(drafter.hidden_layers))) if drafts else ()  # what the drafter reads of every step
        prepare_in_decode = _decode(Decoding(backend, drafter, verifier, state, layers, plain_layers, generated,
                                             records, stats, StopCheck(backend, max_new_tokens, until), clock,
                                             forwards, syncs))
    stats.decode_s = clock() - t_start - prepare_in_decode
    n, text = _truncate(backend, generated, max_new_tokens, until)
    stats.num_new_tokens = n
    stats.e2e_s = clock() - t0
    # What follows is for the record, not the answer: outside the timed window, as what vanilla frees
    # is freed when this returns (the drafter's policy estimates, the request's tensors it holds).
    _record_preparation(stats, getattr(drafter, "preparation", None))
    stats.policy = drafter.estimates()
    drafter.finish()
    stats.peak_memory_mb = peak_memory_mb(devices)
    return Output(tokens=generated[:n], text=text, stats=stats, kinds=records.kinds[:n],
                  relevance=records.relevance[:n], replaced=records.replaced[:n], margins=records.margins[:n])


@dataclass
class Decoding:
    """What one request's decode steps share: the models' sides, the answer so far and the meters."""

    backend: Backend
    drafter: object
    verifier: object
    state: object  # the target's backends.base.DecodeState
    layers: tuple[int, ...]  # hidden layers a drafted step's verification reads
    plain_layers: tuple[int, ...]  # hidden layers a step without draft nodes reads (the drafter's own)
    generated: list[int]
    records: _TokenRecords
    stats: SampleStats
    stop: StopCheck
    clock: Callable[[], float]
    forwards: ForwardClock  # seconds inside the models' forwards
    syncs: SyncCounter  # host synchronisations made by the engine's own code


def _decode(run: Decoding) -> float:
    """Draft, score, verify and commit until `run.stop`; extends `run.generated` and `run.records` in
    place. Returns the seconds spent preparing a lazy draft inside the steps (not decoding time)."""
    prepare_in_decode, t_prev = 0.0, run.clock()
    fwd_prev, syncs_prev = run.forwards.seconds, run.syncs.count
    drafter, backend, state = run.drafter, run.backend, run.state
    while not _finished(run.stop, run.generated):
        before = _prepared_s(drafter)
        draft = drafter.propose(run.generated)
        t_drafted = run.clock()
        prepared = _prepared_s(drafter) - before
        prepare_in_decode += prepared
        judge, judged_layers = (run.verifier, run.layers) if draft.num_nodes else (PLAIN, run.plain_layers)
        scores = backend.score(state, draft, hidden_layers=judged_layers)
        verdict = judge.verify(draft, scores, state.visual_hidden)
        backend.commit(state, verdict, scores)  # the next root stays on the device
        t_verified = run.clock()
        step = StepStats(draft.num_nodes, verdict.num_accepted, t_drafted - t_prev - prepared,
                         t_verified - t_drafted, draft.plan)
        drafter.observe(verdict, scores, step)  # its bookkeeping counts as the next step's drafting
        run.generated += verdict.tokens
        run.records.add(scores.host_view(draft), verdict)  # the verifier made the view: no second transfer
        run.stats.add_step(step)
        if not prepared:  # the step that prepared a lazy draft is left out: its forwards are preparation
            run.stats.add_step_time(t_verified - t_prev, run.forwards.seconds - fwd_prev, run.syncs.count - syncs_prev)
        t_prev, fwd_prev, syncs_prev = t_verified, run.forwards.seconds, run.syncs.count
    return prepare_in_decode


def _prepared_s(drafter) -> float:
    """Seconds the drafter has spent preparing its draft in this request so far."""
    preparation = getattr(drafter, "preparation", None)
    return 0.0 if preparation is None else preparation.total_s


def _record_preparation(stats: SampleStats, preparation) -> None:
    """The draft's preparation (types.Preparation) into the sample's stats; None: never prepared."""
    if preparation is None:
        return
    stats.prune_s, stats.draft_vision_s = preparation.prune_s, preparation.draft_vision_s
    stats.draft_prefill_s, stats.draft_prepare_s = preparation.draft_prefill_s, preparation.total_s
    stats.draft_prepared_at = preparation.at
    if preparation.kept_visual_tokens is not None:
        stats.kept_visual_tokens = preparation.kept_visual_tokens


def _forward_modules(backend: Backend, drafter) -> list[torch.nn.Module]:
    """The modules whose forwards are model work (the rest of a step is the loop's overhead): the
    target's and the draft model's decoder stacks and LM heads, and a drafter's own head (Sparrow, MTP)
    with its direct parts (its input projection runs outside its forward) and the embedding it reads."""
    modules = [backend.text_model(), backend.model.lm_head]
    draft = getattr(drafter, "backend", None)
    if draft is not None and draft is not backend:
        modules += [draft.text_model(), draft.model.lm_head]
    head = getattr(drafter, "head", None)
    if isinstance(head, torch.nn.Module):
        modules += [head, *head.children()]
    embed = getattr(drafter, "embed", None)
    return modules + ([embed] if isinstance(embed, torch.nn.Module) else [])


def _greedy_with_margin(logits: torch.Tensor) -> tuple[int, float]:
    """The target's greedy token and its margin from [vocab] logits, in one transfer."""
    top2 = logits.float().topk(min(2, logits.numel())).values
    token, margin = torch.stack([logits.argmax().double(), (top2[0] - top2[-1]).double()]).tolist()
    return int(token), margin


def _committed_margins(view, verdict) -> list[float]:
    """The target's margin at the row that judged each committed token (its parent's row; the
    bonus: the row after the last committed node)."""
    rows = [view.parents[c] + 1 for c in verdict.path] + [(verdict.path[-1] if verdict.path else -1) + 1]
    return [view.margins[r] for r in rows]


def _overruled(view, verdict) -> int | None:
    """The draft token in the slot the target's closing token filled (None: the path was used up)."""
    last = verdict.path[-1] if verdict.path else -1
    child = tree.best_child(view.parents, view.scores, last)
    return None if child is None else view.tokens[child]


@dataclass
class _TokenRecords:
    """Per committed token: how it was committed, its relevance, the draft token it overruled and the
    target's margin (Output's lists), appended step by step."""

    kinds: list[str]
    relevance: list[float | None]
    replaced: list[int | None]
    margins: list[float]

    def add(self, view, verdict) -> None:
        self.kinds += verdict.kinds
        self.relevance += verdict.relevance or [None] * len(verdict.tokens)
        self.replaced += [None] * verdict.num_accepted + [_overruled(view, verdict)]
        self.margins += _committed_margins(view, verdict)


def _finished(stop: StopCheck, generated: list[int]) -> bool:
    """Checked once before every step (tests count a step's work between two calls)."""
    return stop(generated)


class StopCheck:
    """Whether an answer is done: the limit, an EOS token, or a stop string in its text.

    Called once per step, it looks only at what the step added: the new tokens for EOS, and for the
    stop strings the text of the new tokens with the longest stop string's length in UTF-8 bytes +
    TAIL_SLACK tokens before them. A stop string that ends in the new text starts at most its length in
    bytes back, and every token that decodes to text adds at least one byte of it (a byte-level
    tokenizer's token may be one byte of a character: a 3-character CJK stop string spans 9 tokens), so
    it lies in that window whether a step added one token or many. Decoding the whole answer every step
    cost O(length) per step; this costs O(new tokens). A hit in the window is confirmed on the whole
    text, so the answer stops exactly where a whole-text check would stop it.
    """

    # extra tokens in the window: for tokens that decode to nothing on their own, and for the bytes of a
    # character the previous step left unfinished (at most 3 of UTF-8's 4), which the new tokens complete
    TAIL_SLACK = 4

    def __init__(self, backend: Backend, max_new_tokens: int, until: tuple[str, ...] = ()):
        self.eos, self.decode, self.limit = backend.eos_token_ids, backend.tokenizer.decode, max_new_tokens
        self.until = tuple(s for s in until if s)
        self.window = max((len(s.encode()) for s in self.until), default=0) + self.TAIL_SLACK
        self.checked = 0  # tokens of `generated` already looked at

    def __call__(self, generated: list[int]) -> bool:
        start, self.checked = self.checked, len(generated)
        if len(generated) >= self.limit or any(t in self.eos for t in generated[start:]):
            return True
        if not self.until or start == len(generated):
            return False
        tail = self.decode(generated[max(0, start - self.window):])
        return any(s in tail for s in self.until) and self._in_whole(generated)

    def _in_whole(self, generated: list[int]) -> bool:
        text = self.decode(generated)
        return any(s in text for s in self.until)


def _truncate(backend: Backend, generated: list[int], max_new_tokens: int, until) -> tuple[int, str]:
    """(number of tokens kept, text): stop at EOS (excluded), the limit, or a stop string."""
    n = min(len(generated), max_new_tokens)
    eos = next((i for i, t in enumerate(generated[:n]) if t in backend.eos_token_ids), None)
    if eos is not None:
        n = eos
    text = backend.tokenizer.decode(generated[:n], skip_special_tokens=True)
    for stop in until:
        if stop and stop in text:
            text = text[: text.index(stop)]
            while n > 0 and stop in backend.tokenizer.decode(generated[: n - 1], skip_special_tokens=True):
                n -= 1
    return n, text
