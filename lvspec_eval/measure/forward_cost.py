"""`lvspec-eval bench --forward-cost`: what a forward over m new tokens costs next to a one-token step.

Speculation pays only if verifying (and drafting) several tokens costs little more than one step.
This prints, for the target (and the draft), the time of a forward over m = 1, 2, 4, ..., 64 new
tokens on top of a cache of `--cache-len` entries, as milliseconds and as a ratio to the one-token
step, for the engine's own forward (`Backend.forward`: with the CPU kernels of linear_kernels.py
when cpu_kernels is auto) and, on a CPU, for the same forward through plain nn.Linear; and the floor
the hardware implies: a forward must read the language model's weights once (at the measured
memory bandwidth) and do 2 x parameters x m floating-point operations (at the measured GEMM
throughput), so floor(m) = max(bytes / bandwidth, flops(m) / throughput). Times are the median of
`--repeats` forwards (each dropped again, so the cache stays at its length); the m = 1 forward is
the plain step vanilla decoding runs.
"""
from __future__ import annotations

import statistics

import torch

from ..backends import linear_kernels
from ..backends.base import Backend, DecodeState
from ..backends.loading import load_backend
from ..decoding.loop import make_clock  # waits for queued GPU work before reading the time

TOKEN_COUNTS = (1, 2, 4, 8, 16, 32, 64)




def cached_state(backend: Backend, cache_len: int) -> DecodeState:
    """A decode state whose cache holds `cache_len` text tokens (a repeated sentence)."""
    ids = backend.tokenizer("The quick brown fox jumps over the lazy dog. ", add_special_tokens=False)["input_ids"]
    prompt = backend.tokenizer.decode((ids * (cache_len // len(ids) + 1))[:cache_len])
    inputs = backend.prepare(prompt, [])
    state, logits = backend.prefill(inputs)
    state.pending = [int(logits.argmax())]
    return state


def time_forward(backend: Backend, state: DecodeState, m: int, repeats: int) -> float:
    """Median seconds of a forward over m new tokens (a chain; m = 1: the plain step), dropped after."""
    device, clock = backend.device, make_clock(backend.device)
    tokens = torch.full((m,), state.pending[0], dtype=torch.long, device=device)
    offsets = torch.arange(m, device=device)
    visible = None if m == 1 else torch.ones(m, m, dtype=torch.bool, device=device).tril()
    times = []
    for i in range(repeats + 1):
        t = clock()
        backend.forward(state, tokens, offsets, visible)
        if i:  # the first forward of a shape pays one-time costs
            times.append(clock() - t)
        backend.keep(state, m if m == 1 else 0)  # a plain step is kept (linear-attention layers advance)
    return statistics.median(times)


def weight_bytes(backend: Backend) -> int:
    """Bytes a forward reads: the language model's and the LM head's weights, the embedding table
    excepted (a forward gathers m of its rows)."""
    embed = backend.text_model().get_input_embeddings()
    skip = {id(p) for p in embed.parameters()}
    params = list(backend.text_model().parameters()) + list(backend.model.lm_head.parameters())
    seen, total = set(), 0
    for p in params:
        if id(p) not in seen and id(p) not in skip:
            seen.add(id(p))
            total += p.numel() * p.element_size()
    return total


def bandwidth_gbs(device: torch.device, size_mb: int = 512) -> float:
    """Measured memory read bandwidth (GB/s): the best of a few sums over a large buffer."""
    x, clock = torch.ones(size_mb * 2 ** 20 // 4, device=device), make_clock(device)
    best = float("inf")
    for _ in range(5):
        t = clock()
        x.sum()
        best = min(best, clock() - t)
    return x.numel() * 4 / best / 1e9


def gemm_gflops(device: torch.device, dtype: torch.dtype, n: int = 2048) -> float:
    a, clock = torch.randn(n, n, device=device).to(dtype), make_clock(device)
    best = float("inf")
    for _ in range(4):
        t = clock()
        a @ a
        best = min(best, clock() - t)
    return 2 * n ** 3 / best / 1e9


def curve(backend: Backend, cache_len: int, counts=TOKEN_COUNTS, repeats: int = 5) -> dict:
    """The cost curve of one model: per m, the engine's ms and ratio to m = 1, plain nn.Linear's (on a
    CPU with kernels installed), and the floor."""
    device = backend.device
    state = cached_state(backend, cache_len)
    engine = {m: time_forward(backend, state, m, repeats) for m in counts}
    plain = None
    if backend.kernels is not None:
        with linear_kernels.disabled():
            plain = {m: time_forward(backend, state, m, repeats) for m in counts}
    nbytes, bw, flops = weight_bytes(backend), bandwidth_gbs(device), gemm_gflops(device, backend.model.dtype)
    params = nbytes / backend.model.dtype.itemsize
    floor = {m: max(nbytes / (bw * 1e9), 2 * params * m / (flops * 1e9)) for m in counts}
    rows = []
    for m in counts:
        row = {"tokens": m, "ms": engine[m] * 1e3, "ratio": engine[m] / engine[1],
               "floor_ms": floor[m] * 1e3, "floor_ratio": floor[m] / floor[1]}
        if plain is not None:
            row.update(nn_linear_ms=plain[m] * 1e3, nn_linear_ratio=plain[m] / plain[1])
        rows.append(row)
    return {"cache_len": state.cache_len, "weight_mb": nbytes / 2 ** 20, "bandwidth_gbs": bw, "gemm_gflops": flops,
            "kernels": None if backend.kernels is None else backend.kernels.summary(), "rows": rows}


def format_curve(name: str, result: dict) -> str:
    head = (f"{name}: cache {result['cache_len']} tokens, weights {result['weight_mb']:.0f} MB, "
            f"bandwidth {result['bandwidth_gbs']:.1f} GB/s, GEMM {result['gemm_gflops']:.0f} GFLOP/s")
    plain = "nn_linear_ms" in result["rows"][0]
    cols = ["tokens", "engine ms", "x one token"] + (["nn.Linear ms", "x one token"] if plain else []) + \
        ["floor ms", "floor x"]
    lines = [head, "| " + " | ".join(cols) + " |", "|---" * len(cols) + "|"]
    for r in result["rows"]:
        cells = [str(r["tokens"]), f"{r['ms']:.2f}", f"{r['ratio']:.2f}"]
        if plain:
            cells += [f"{r['nn_linear_ms']:.2f}", f"{r['nn_linear_ratio']:.2f}"]
        cells += [f"{r['floor_ms']:.2f}", f"{r['floor_ratio']:.2f}"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def run(args) -> dict:
    torch.set_num_threads(args.threads)
    load = dict(device=args.device, dtype=args.dtype, cpu_kernels=args.cpu_kernels)
    out = {}
    for name in [args.model] + ([args.draft] if args.draft not in (None, "self") else []):
        out[name] = curve(load_backend(name, **load), args.cache_len, repeats=args.repeats)
        print(format_curve(name, out[name]), flush=True)
    return {"forward_cost": out}
