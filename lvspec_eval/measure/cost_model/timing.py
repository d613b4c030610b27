"""Timing primitives: one call's seconds with its decoder-layer share scaled to the real depth, the
fastest of repeats, a cache rewinder so every repeat starts from the same cache, a timed prefill and
a timed tree-masked forward. Clocks come from the caller (decoding/loop.make_clock: on a GPU they
synchronise before reading)."""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch

from ...backends.base import Backend, DecodeState, PreparedInputs, crop_cache
from .architectures import special_ids
from .config import CostConfig


@contextlib.contextmanager
def layer_stack_spans(backend: Backend, clock) -> Iterator[list[list[float]]]:
    """Record [start, end] of every pass through the decoder layers (first layer in, last out)."""
    layers = backend.text_model().layers
    spans: list[list[float]] = []

    def enter(_module, _args):
        spans.append([clock(), clock()])

    def leave(_module, _args, _out):
        spans[-1][1] = clock()

    handles = [layers[0].register_forward_pre_hook(enter), layers[-1].register_forward_hook(leave)]
    try:
        yield spans
    finally:
        for handle in handles:
            handle.remove()


def timed_call(fn, backend: Backend, clock) -> float:
    """Seconds of one fn() call, its decoder-layer part scaled to the model's real depth.

    Decoder layers are identical, so a model built with d of its L layers costs what the real one
    does once the time spent in the layer stack is multiplied by L / d (KV reads included).
    """
    factor = backend.depth_factor
    if factor == 1:
        t0 = clock()
        fn()
        return clock() - t0
    with layer_stack_spans(backend, clock) as spans:
        t0 = clock()
        fn()
        total = clock() - t0
    return total + sum(end - start for start, end in spans) * (factor - 1)


def best_seconds(fn, backend: Backend, repeats: int, clock, warmup: int = 1,
                 reset: Callable[[], None] | None = None) -> float:
    """The fastest of `repeats` timed calls of fn() after `warmup` untimed ones; `reset` (untimed)
    runs after every call.

    The minimum, not the median: a forward's cost is fixed and other processes on a shared
    machine only ever add to it, so the fastest repeat is the best estimate of the cost itself
    (the models here are timed one after another, so drift cannot cancel out in a ratio).
    """
    times = []
    for k in range(warmup + repeats):
        seconds = timed_call(fn, backend, clock)
        if k >= warmup:
            times.append(seconds)
        if reset is not None:
            reset()
    return min(times)


def rewinder(state: DecodeState) -> Callable[[], None]:
    """A function that puts `state` back to what its cache holds now, so that every repeat of a
    timed call that commits entries (Backend.keep) starts from the same cache."""
    cache_len, next_pos, pending = state.cache_len, state.next_pos, list(state.pending)

    def rewind() -> None:
        crop_cache(state.cache, cache_len)
        state.cache_len, state.next_pos, state.pending, state.temp_len = cache_len, next_pos, list(pending), 0

    return rewind


def timed_prefill(backend: Backend, inputs: PreparedInputs, clock):
    """(seconds, state) of one prefill (a warm-up prefill ran first on a short prompt)."""
    out = {}

    def run():
        out["state"] = backend.prefill(inputs)[0]

    return timed_call(run, backend, clock), out["state"]


def random_tokens(backend: Backend, n: int, seed: int) -> torch.Tensor:
    """[n] random text token ids (below the visual markers)."""
    top = special_ids(backend.model.config.get_text_config().vocab_size)["vision_end"] - 1
    return torch.randint(0, top, (n,), generator=torch.Generator().manual_seed(seed))


def forward_seconds(backend: Backend, state, offsets: torch.Tensor, visible: torch.Tensor, cfg: CostConfig,
                    clock) -> float:
    """Time of one tree-masked forward of len(offsets) tokens; the cache is left as it was."""
    tokens = random_tokens(backend, offsets.numel(), cfg.seed)

    def step():
        backend.forward(state, tokens, offsets, visible)
        backend.keep(state, [])  # drop the temporary entries: every repeat sees the same cache

    return best_seconds(step, backend, cfg.repeats, clock)
