"""The decoding loop: the only one. Every method is a drafter and a verifier plugged in here.

    prefill target (and draft) -> loop { drafter.propose -> target.score -> verifier.verify ->
    commit accepted tokens + bonus -> drafter.observe } until EOS, a stop string or the limit.

Vanilla decoding is the same loop with a drafter that proposes nothing.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from ..backends.base import Backend
from . import tree
from .stats import SampleStats, peak_memory_mb
from .types import TARGET, StepStats


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


def make_clock(device: torch.device):
    """A wall clock that waits for queued GPU work first, so timings are not under-read."""
    if device.type == "cuda":
        def clock() -> float:
            torch.cuda.synchronize(device)
            return time.perf_counter()
        return clock
    return time.perf_counter


@torch.no_grad()
def generate(backend: Backend, drafter, verifier, prompt: str, videos: list, max_new_tokens: int,
             until: tuple[str, ...] = ()) -> Output:
    clock = make_clock(backend.device)
    stats = SampleStats()
    # 1. Target prefill (in two parts when the drafter prunes by the verifier's attention).
    t0 = clock()
    inputs = backend.prepare(prompt, videos)
    inputs.extra["request"] = (prompt, videos)
    layers = tuple(sorted(set(verifier.hidden_layers) | set(drafter.hidden_layers)))
    state, logits = backend.prefill(inputs, hidden_layers=layers, visual_attention=drafter.needs_visual_attention)
    stats.prefill_s = clock() - t0
    stats.visual_tokens = stats.kept_visual_tokens = inputs.num_visual_tokens
    stats.prompt_tokens = int(inputs.input_ids.shape[1])
    # 2. Draft prefill (pruning first, if any).
    info = drafter.start(backend, inputs, state, clock)
    stats.prune_s, stats.draft_prefill_s = info.get("prune_s", 0.0), info.get("draft_prefill_s", 0.0)
    stats.kept_visual_tokens = info.get("kept_visual_tokens", stats.visual_tokens)
    # 3. The first token comes from the prefill; then draft, score, verify, commit.
    generated, kinds, relevance, replaced = [int(logits.argmax())], [TARGET], [None], [None]
    state.pending = list(generated)
    t_start = clock()
    while not _finished(backend, generated, max_new_tokens, until):
        t1 = clock()
        draft = drafter.propose(generated)
        t2 = clock()
        scores = backend.score(state, draft, hidden_layers=layers)
        verdict = verifier.verify(draft, scores, state.visual_hidden)
        backend.commit(state, verdict)
        drafter.observe(verdict, scores)
        t3 = clock()
        generated += verdict.tokens
        kinds += verdict.kinds
        relevance += verdict.relevance or [None] * len(verdict.tokens)
        replaced += [None] * verdict.num_accepted + [_overruled(draft, verdict)]
        stats.steps.append(StepStats(draft.num_nodes, verdict.num_accepted, t2 - t1, t3 - t2))
        stats.draft_s += t2 - t1
        stats.verify_s += t3 - t2
    stats.decode_s = clock() - t_start
    n, text = _truncate(backend, generated, max_new_tokens, until)
    stats.num_new_tokens = n
    stats.peak_memory_mb = peak_memory_mb(backend.device)
    return Output(tokens=generated[:n], text=text, stats=stats, kinds=kinds[:n], relevance=relevance[:n],
                  replaced=replaced[:n])


def _overruled(draft, verdict) -> int | None:
    """The draft token in the slot the target's closing token filled (None: the path was used up)."""
    last = verdict.path[-1] if verdict.path else -1
    child = tree.best_child(draft.parents, draft.scores, last)
    return None if child is None else int(draft.tokens[child])


def _finished(backend: Backend, generated: list[int], max_new_tokens: int, until) -> bool:
    if len(generated) >= max_new_tokens or any(t in backend.eos_token_ids for t in generated):
        return True
    return bool(until) and any(s in backend.tokenizer.decode(generated) for s in until)


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
