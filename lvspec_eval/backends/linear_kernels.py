"""Multi-token forwards near the hardware's cost on a CPU: a kernel per linear shape and row count,
picked by measuring on the machine in use.

Why. A forward over m new tokens (tree verification, a drafting level, a drafter's catch-up) reads
every weight once, as a one-token step does, and adds m times the arithmetic: on a memory-bound
CPU it could cost little more than one step. Through `nn.Linear` it does not: the GEMM library's
small-M path is poor and uneven. One 1536 -> 8960 fp32 projection of the Qwen2.5 1.5B target,
median of 30 calls, 2 threads, idle machine (the curve that motivated this module):

    rows                 1      2      4      8     16     32
    nn.Linear          2.25   2.42   6.20   8.70   5.45   8.85 ms
    oneDNN prepacked   2.73   4.07   3.92   4.58   5.32   6.95 ms

(8 rows cost more than 16.) So for each distinct weight shape of a model this module times, on this
machine and thread count, `F.linear` at each row count in ROWS, the same with the rows padded with
zeros up to a larger count (free in memory: it borrows a faster point of the library's own curve),
and a oneDNN prepacked weight (a second copy of the weights, in the library's blocked layout; only
where memory allows), and keeps, per row count, the fastest by at least MIN_GAIN. The measurements
are cached on disk per CPU model, thread count, torch version, dtype and shape
(`$LVSPEC_CACHE_DIR/cpu_kernels.json`, default ~/.cache/lvspec), so a run pays for them once.
Measured on the real pair (docs/RESULTS.md, `lvspec-eval bench --forward-cost`): an 8-token forward
of the 1.5B target costs 1.40x a one-token step with these kernels, 2.79x through nn.Linear (4 tokens:
1.12x / 2.02x); the prepacked copies took 5.9 GB beside the target's weights.

What it touches. Only forwards that the engine marks with `multi_token()` (backends/base.py
`Backend.forward` over more than one token): a prefill and every one-token step keep running
`nn.Linear` as transformers runs it, so vanilla decoding stays bit for bit transformers' own (and
lmms-eval's classes'). On an accelerator nothing is installed: a GPU verifies a small tree for about
the price of one token already. In float32 the chosen kernels round like any other multi-token
GEMM (within a few ulps of `nn.Linear`); exact methods stay token-identical to vanilla, as tested.
"""
from __future__ import annotations

import contextlib
import json
import os
import platform
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

MODES = ("auto", "measure", "torch")  # model_arg cpu_kernels: cached or measured / measured anew / off
ROWS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)  # row counts measured; more rows: nn.Linear
MIN_GAIN = 0.9  # another kernel is chosen only if it takes at most this share of nn.Linear's time
PACK_SHARE = 0.5  # prepacked weights may take at most this share of the memory available at install
REPEATS = 5  # timed calls per kernel and row count (the fastest counts: a neighbour only adds time)

_active = 0  # > 0 inside multi_token()
_disabled = 0  # > 0 inside disabled()


@contextlib.contextmanager
def multi_token():
    """Mark a multi-token forward of the engine: inside, installed linear layers use their choices."""
    global _active
    _active += 1
    try:
        yield
    finally:
        _active -= 1


@contextlib.contextmanager
def disabled():
    """Inside: installed kernels stand aside and nn.Linear runs every forward (for comparisons)."""
    global _disabled
    _disabled += 1
    try:
        yield
    finally:
        _disabled -= 1


@dataclass
class Choice:
    """How a linear layer of one shape runs m rows: `kind` torch | pad | onednn; `rows` the padded count."""

    kind: str
    rows: int = 0


@dataclass
class ShapeCurve:
    """Measured milliseconds per row count for one weight shape, and the choice per row count."""

    torch_ms: dict[int, float]
    onednn_ms: dict[int, float] = field(default_factory=dict)

    def choices(self) -> dict[int, Choice]:
        """Per row count 2..ROWS[-1]: the fastest option if it takes at most MIN_GAIN of nn.Linear's
        time at that count (an unmeasured count is taken to cost what the next measured one does)."""
        out = {}
        for m in range(2, ROWS[-1] + 1):
            bucket = min(r for r in ROWS if r >= m)
            options = [(self.torch_ms[r], Choice("pad", r)) for r in ROWS if r > m]
            options += [(self.onednn_ms[bucket], Choice("onednn"))] if bucket in self.onednn_ms else []
            best_ms, best = min(options, key=lambda o: o[0]) if options else (float("inf"), None)
            out[m] = best if best_ms <= MIN_GAIN * self.torch_ms[bucket] else Choice("torch")
        return out


def _time_ms(fn, repeats: int = REPEATS) -> float:
    fn()  # first call: allocation, primitive creation
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1e3


def onednn_available(weight: torch.Tensor) -> bool:
    return weight.device.type == "cpu" and torch.backends.mkldnn.is_available() and \
        weight.dtype in (torch.float32, torch.bfloat16)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight in oneDNN's blocked layout for small row counts (its size: the weight's)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, 8)


def packed_linear(x2d: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x2d, packed, bias, "none", [], "")


def measure(weight: torch.Tensor, bias: torch.Tensor | None, with_onednn: bool) -> ShapeCurve:
    """Time nn.Linear (and a prepacked copy) at every row count in ROWS, interleaved."""
    xs = {m: torch.randn(m, weight.shape[1], dtype=weight.dtype) for m in ROWS}
    packed = pack(weight) if with_onednn else None
    curve = ShapeCurve(torch_ms={})
    for m in ROWS:
        x = xs[m]
        curve.torch_ms[m] = _time_ms(lambda x=x: F.linear(x, weight, bias))
        if packed is not None and m > 1:
            curve.onednn_ms[m] = _time_ms(lambda x=x: packed_linear(x, packed, bias))
    return curve


# ---- the on-disk cache of measured curves ---------------------------------------------------------
def cache_file() -> Path:
    root = os.environ.get("LVSPEC_CACHE_DIR") or Path.home() / ".cache" / "lvspec"
    return Path(root) / "cpu_kernels.json"


def machine_key() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def shape_key(weight: torch.Tensor, bias: torch.Tensor | None, with_onednn: bool) -> str:
    out_f, in_f = weight.shape
    return f"{str(weight.dtype).removeprefix('torch.')}|{out_f}x{in_f}|bias={bias is not None}|onednn={with_onednn}"


def _load_cache() -> dict:
    try:
        return json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {}


def _save_cache(data: dict) -> None:
    path = cache_file()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)  # atomic: a concurrent reader sees the old file or the new one
    except OSError:
        pass  # a read-only home: measure again next time


def curve_for(weight, bias, with_onednn: bool, remeasure: bool, cache: dict) -> ShapeCurve:
    entry = cache.setdefault(machine_key(), {})
    key = shape_key(weight, bias, with_onednn)
    if not remeasure and key in entry:
        raw = entry[key]
        return ShapeCurve({int(k): v for k, v in raw["torch_ms"].items()},
                          {int(k): v for k, v in raw.get("onednn_ms", {}).items()})
    curve = measure(weight, bias, with_onednn)
    entry[key] = {"torch_ms": curve.torch_ms, "onednn_ms": curve.onednn_ms, "measured": time.time()}
    return curve


# ---- installing on a model's linear layers -------------------------------------------------------
@dataclass
class KernelReport:
    """What `install` chose: per shape, the curve and choices; the memory its packed copies take."""

    mode: str
    shapes: dict[str, dict] = field(default_factory=dict)
    packed_mb: float = 0.0
    measure_s: float = 0.0

    def summary(self) -> dict:
        return {"mode": self.mode, "packed_mb": round(self.packed_mb, 1), "measure_s": round(self.measure_s, 2),
                "shapes": self.shapes}


def _available_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def linear_layers(modules) -> list[torch.nn.Linear]:
    seen, out = set(), []
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, torch.nn.Linear) and id(sub) not in seen and sub.weight.dim() == 2:
                seen.add(id(sub))
                out.append(sub)
    return out


def install(modules, mode: str = "auto") -> KernelReport | None:
    """Measure (or read) and install per-shape kernels for multi-token forwards on the linear layers
    of `modules` (a language model and its LM head). None where nothing is installed: mode `torch`,
    a non-CPU device, or no shape where another kernel beats nn.Linear."""
    if mode not in MODES:
        raise ValueError(f"cpu_kernels={mode!r}; expected one of {', '.join(MODES)}")
    layers = [l for l in linear_layers(modules) if l.weight.device.type == "cpu"]
    if mode == "torch" or not layers:
        return None
    start, report = time.perf_counter(), KernelReport(mode=mode)
    groups: dict[tuple, list[torch.nn.Linear]] = {}
    for layer in layers:
        groups.setdefault((tuple(layer.weight.shape), layer.weight.dtype, layer.bias is not None), []).append(layer)
    budget = PACK_SHARE * _available_bytes()
    cache = _load_cache()
    plan = []
    for (_shape, _dtype, _bias), members in sorted(groups.items(), key=lambda g: -g[1][0].weight.numel()):
        first = members[0]
        group_bytes = sum(l.weight.numel() * l.weight.element_size() for l in members)
        with_onednn = onednn_available(first.weight) and group_bytes <= budget
        curve = curve_for(first.weight.detach(), None if first.bias is None else first.bias.detach(),
                          with_onednn, mode == "measure", cache)
        choices = curve.choices()
        if any(c.kind == "onednn" for c in choices.values()):
            budget -= group_bytes
            report.packed_mb += group_bytes / 2 ** 20
        report.shapes[shape_key(first.weight, first.bias, with_onednn)] = {
            "layers": len(members), "torch_ms": curve.torch_ms, "onednn_ms": curve.onednn_ms,
            "choices": {m: (c.kind if c.kind != "pad" else f"pad{c.rows}") for m, c in choices.items()}}
        if any(c.kind != "torch" for c in choices.values()):
            plan.append((members, choices))
    _save_cache(cache)
    for members, choices in plan:
        for layer in members:
            _wrap(layer, choices)
    report.measure_s = time.perf_counter() - start
    return report if plan else None


def _wrap(layer: torch.nn.Linear, choices: dict[int, Choice]) -> None:
    packed = pack(layer.weight.detach()) if any(c.kind == "onednn" for c in choices.values()) else None
    plain = layer.forward
    in_features = layer.in_features

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // in_features
        choice = choices.get(rows) if _active and not _disabled and rows > 1 else None
        if choice is None or choice.kind == "torch":
            return plain(x)
        x2d = x.reshape(rows, in_features)
        if choice.kind == "onednn":
            out = packed_linear(x2d, packed, layer.bias)
        else:  # pad: the library's faster point at a larger row count
            padded = x2d.new_zeros(choice.rows, in_features)
            padded[:rows] = x2d
            out = F.linear(padded, layer.weight, layer.bias)[:rows]
        return out.reshape(*x.shape[:-1], out.shape[-1])

    layer.forward = forward
