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
are cached on disk per CPU (model name, flags as backends/host.py reads them, core count), thread count, torch version, dtype and
shape (`$LVSPEC_CACHE_DIR/cpu_kernels.json`, default ~/.cache/lvspec), so a run pays for them once;
a cache of another SCHEMA is measured anew, and so is a measurement whose spread says the machine
was busy while it was taken (LOADED_SPREAD; the calmer measurement is kept).
Measured on the real pair (docs/RESULTS.md, `lvspec-eval bench --forward-cost`): an 8-token forward
of the 1.5B target costs 1.40x a one-token step with these kernels, 2.79x through nn.Linear (4 tokens:
1.12x / 2.02x); the prepacked copies took 5.9 GB beside the target's weights.

What it touches. Only forwards that the engine marks with `multi_token()` (backends/base.py
`Backend.forward` over more than one token): a prefill and every one-token step keep running
`nn.Linear` as transformers runs it, so vanilla decoding stays bit for bit transformers' own (and
lmms-eval's classes'). On an accelerator nothing is installed: a GPU verifies a small tree for about
the price of one token already. In float32 the chosen kernels round like any other multi-token
GEMM (within a few ulps of `nn.Linear`); exact methods stay token-identical to vanilla, as tested.

The one-token step too, as an opt-in (model_arg one_token_kernels=engine, ONE_TOKEN_MODES): one row
is measured like the others (nn.Linear, padded rows, a prepacked copy), and installed with
`install(..., one_token=True)`, its choice serves one-row calls inside `one_token_steps()`: an
"engine vanilla" whose steps run the fastest kernel found, so that a method's speedup over it is
the speculation's alone, not the kernels' (issue 43, item 5).

Safety. bf16 is prepacked only where torch says oneDNN supports bf16 on this CPU (AVX512-BW, AVX-NE-
CONVERT or AMX; elsewhere torch's reorder raises), and any error while measuring or packing a weight
leaves that weight on nn.Linear with one warning. Prepacked copies take at most PACK_SHARE of the
memory available when the first lvspec process of the machine installed them, for all lvspec
processes together (data-parallel ranks, a benchmark and its neighbour): a ledger in the cache
folder, under a file lock, holds each live process's prepacked bytes (`Ledger`; an entry counts
only while its process runs: same host, boot and start time). Whether a forward
is multi-token, one-token opted in or disabled is context-local state (contextvars): a thread's
forward never sees another's, and nesting cannot leave it on.
"""
from __future__ import annotations

import contextlib
import contextvars
import json
import os
import statistics
import time
import warnings
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from filelock import FileLock

from . import host

MODES = ("auto", "measure", "torch")  # model_arg cpu_kernels: cached or measured / measured anew / off
ONE_TOKEN_MODES = ("torch", "engine")  # model_arg one_token_kernels: transformers' own step / the measured kernel
ROWS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 20, 24, 32, 48, 64)  # row counts measured; more rows: nn.Linear
MIN_GAIN = 0.9  # another kernel is chosen only if it takes at most this share of nn.Linear's time
PACK_SHARE = 0.5  # prepacked weights may take at most this share of the machine's available memory (Ledger)
REPEATS = 5  # timed calls per kernel and row count (the fastest counts: a neighbour only adds time)
SCHEMA = 2  # of the cache file: bumped whenever what a cached curve holds changes (ROWS, its fields)
LOADED_SPREAD = 1.5  # a curve whose typical median/fastest call ratio exceeds this was measured on a busy machine

# context-local (a thread's or task's own), so concurrent forwards cannot change each other's state
_multi = contextvars.ContextVar("lvspec_multi_token", default=False)
_one = contextvars.ContextVar("lvspec_one_token_steps", default=False)
_off = contextvars.ContextVar("lvspec_kernels_disabled", default=False)


@contextlib.contextmanager
def _set(var: contextvars.ContextVar) -> Iterator[None]:
    token = var.set(True)
    try:
        yield
    finally:
        var.reset(token)


def multi_token():
    """Mark a multi-token forward of the engine: inside, installed linear layers use their choices."""
    return _set(_multi)


def one_token_steps():
    """Inside: one-row calls of layers installed with one_token=True use the kernel measured fastest
    for one row (the opt-in "engine vanilla"); elsewhere one row is nn.Linear's."""
    return _set(_one)


def disabled():
    """Inside: installed kernels stand aside and nn.Linear runs every forward (for comparisons)."""
    return _set(_off)


def _row_choice(choices: dict[int, Choice], rows: int, always: bool = False) -> Choice | None:
    """The choice for a call over `rows` rows in the current context, None for nn.Linear.
    always: a draft's layer, whose one-row calls take their choice in every context."""
    if _off.get():
        return None
    if rows == 1:
        return choices.get(1) if always or _one.get() else None
    return choices.get(rows) if _multi.get() else None


@dataclass
class Choice:
    """How a linear layer of one shape runs m rows: `kind` torch | pad | onednn; `rows` the padded count."""

    kind: str
    rows: int = 0


@dataclass
class ShapeCurve:
    """Measured milliseconds per row count for one weight shape, and the choice per row count.
    spread: the median over measured points of (median call / fastest call); near 1 on a quiet machine."""

    torch_ms: dict[int, float]
    onednn_ms: dict[int, float] = field(default_factory=dict)
    spread: float = 1.0

    def choices(self) -> dict[int, Choice]:
        """Per row count 1..ROWS[-1]: the fastest option if it takes at most MIN_GAIN of nn.Linear's
        time at that count (an unmeasured count is taken to cost what the next measured one does)."""
        out = {}
        for m in range(1, ROWS[-1] + 1):
            bucket = min(r for r in ROWS if r >= m)
            options = [(self.torch_ms[r], Choice("pad", r)) for r in ROWS if r > m]
            options += [(self.onednn_ms[bucket], Choice("onednn"))] if bucket in self.onednn_ms else []
            best_ms, best = min(options, key=lambda o: o[0]) if options else (float("inf"), None)
            out[m] = best if best_ms <= MIN_GAIN * self.torch_ms[bucket] else Choice("torch")
        return out

    def without_onednn(self) -> ShapeCurve:
        return ShapeCurve(self.torch_ms, {}, self.spread)


def _time_ms(fn, repeats: int = REPEATS) -> tuple[float, float]:
    """(fastest, median) milliseconds of `repeats` calls, after one untimed call."""
    fn()  # first call: allocation, primitive creation
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e3, statistics.median(times) * 1e3


def bf16_supported(device: torch.device | str = "cpu") -> bool:
    """Whether `device` runs bfloat16 matrix products natively, asked of torch at run time: on a CPU
    whether its oneDNN runs bf16 (its reorder raises where it does not; AVX512-BW, AVX-NE-CONVERT or
    AMX), on CUDA torch.cuda.is_bf16_supported(). The one such check (draft_precision asks it too)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    if device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):  # a torch build without the query
        return False


def onednn_available(weight: torch.Tensor) -> bool:
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    return weight.dtype == torch.float32 or (weight.dtype == torch.bfloat16 and bf16_supported())


def pack(weight: torch.Tensor) -> torch.Tensor:
    """The weight in oneDNN's blocked layout for small row counts (its size: the weight's)."""
    return torch.ops.mkldnn._reorder_linear_weight(weight, 8)


def packed_linear(x2d: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x2d, packed, bias, "none", [], "")


def measure(weight: torch.Tensor, bias: torch.Tensor | None, with_onednn: bool) -> ShapeCurve:
    """Time nn.Linear (and a prepacked copy) at every row count in ROWS, interleaved."""
    xs = {m: torch.randn(m, weight.shape[1], dtype=weight.dtype) for m in ROWS}
    packed = pack(weight) if with_onednn else None
    curve, spreads = ShapeCurve(torch_ms={}), []
    for m in ROWS:
        x = xs[m]
        curve.torch_ms[m], median = _time_ms(lambda x=x: F.linear(x, weight, bias))
        spreads.append(median / max(curve.torch_ms[m], 1e-9))
        if packed is not None:
            curve.onednn_ms[m], median = _time_ms(lambda x=x: packed_linear(x, packed, bias))
            spreads.append(median / max(curve.onednn_ms[m], 1e-9))
    curve.spread = statistics.median(spreads)
    return curve


# ---- the on-disk cache of measured curves ---------------------------------------------------------
def cache_dir() -> Path:
    return Path(os.environ.get("LVSPEC_CACHE_DIR") or Path.home() / ".cache" / "lvspec")


def cache_file() -> Path:
    return cache_dir() / "cpu_kernels.json"


def machine_key() -> str:
    """The CPU as far as kernels care: its model name (generic on virtual machines), a digest of its
    flags (AVX-512, AMX... decide oneDNN's paths), its core count and torch's dispatch level; the
    thread count and torch version."""
    cpu, flags = host.cpu_identity()
    capability = torch.backends.cpu.get_cpu_capability()
    return (f"{cpu}|flags={flags}|cores={os.cpu_count()}|isa={capability}|threads={torch.get_num_threads()}"
            f"|torch={torch.__version__}")


def shape_key(weight: torch.Tensor, bias: torch.Tensor | None, with_onednn: bool) -> str:
    out_f, in_f = weight.shape
    return f"{str(weight.dtype).removeprefix('torch.')}|{out_f}x{in_f}|bias={bias is not None}|onednn={with_onednn}"


def _load_cache() -> dict:
    """The cache file's machines -> shapes -> curves; empty for a missing, broken or other-SCHEMA file."""
    try:
        data = json.loads(cache_file().read_text())
    except (OSError, ValueError):
        return {"schema": SCHEMA, "machines": {}}
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("machines"), dict):
        return {"schema": SCHEMA, "machines": {}}  # another layout: measured anew, and replaced when saved
    return data


def _save_cache(data: dict) -> None:
    write_json_atomic(cache_file(), data)


def write_json_atomic(path: Path, data: dict) -> None:
    """Write a measurement cache so that a concurrent reader sees the old file or the new one; a
    read-only home is not an error (the measurement is simply taken again next time)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=1, sort_keys=True))
        tmp.replace(path)
    except OSError:
        pass


def _cached_curve(raw, with_onednn: bool) -> ShapeCurve | None:
    """A cached entry as a curve, or None where it lacks a row count measured now."""
    try:
        curve = ShapeCurve({int(k): float(v) for k, v in raw["torch_ms"].items()},
                           {int(k): float(v) for k, v in raw.get("onednn_ms", {}).items()}, float(raw["spread"]))
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    complete = set(ROWS) <= set(curve.torch_ms) and (not with_onednn or set(ROWS) <= set(curve.onednn_ms))
    return curve if complete else None


def curve_for(weight, bias, with_onednn: bool, remeasure: bool, cache: dict) -> ShapeCurve:
    """The cached curve, unless asked to measure anew or it was measured on a busy machine (spread
    above LOADED_SPREAD): then measured now, and the calmer of the two kept and returned."""
    entry = cache.setdefault("machines", {}).setdefault(machine_key(), {})
    key = shape_key(weight, bias, with_onednn)
    cached = None if remeasure else _cached_curve(entry.get(key), with_onednn)
    if cached is not None and cached.spread <= LOADED_SPREAD:
        return cached
    curve = measure(weight, bias, with_onednn)
    if cached is not None and cached.spread <= curve.spread:
        return cached
    entry[key] = {"torch_ms": curve.torch_ms, "onednn_ms": curve.onednn_ms, "spread": curve.spread,
                  "measured": time.time()}
    return curve


# ---- one memory budget for the machine's prepacked copies ----------------------------------------
_LIVE_PACKS: weakref.WeakSet = weakref.WeakSet()  # this process's prepacked weights still in use


def _own_packed_bytes() -> int:
    return sum(t.nbytes for t in _LIVE_PACKS)


@dataclass
class Ledger:
    """The prepacked bytes each live lvspec process of the machine holds, and the budget they share:
    PACK_SHARE of the memory available when the first of them installed (reset when none is left).
    Read and written under the cache folder's lock (`ledger()`).

    On disk: {"budget", "pids": {pid: bytes}, "owners": {pid: host.process_identity}}. The ledger
    outlives reboots and may sit on a home that cluster nodes share, and PIDs are reused: an entry
    counts only while its owner (same host, same boot, same start time) runs (host.is_running), so a
    stale entry can never hold the budget; one without an owner (written by an older version) is
    dropped alike."""

    budget: int | None = None
    pids: dict[str, int] = field(default_factory=dict)
    owners: dict[str, dict] = field(default_factory=dict)

    @classmethod
    def read(cls, path: Path) -> Ledger:
        try:
            raw = json.loads(path.read_text())
            owners = {str(p): o for p, o in raw.get("owners", {}).items() if isinstance(o, dict)}
            live = {p: o for p, o in owners.items() if o.get("pid") == int(p) and host.is_running(o)}
            pids = {str(p): int(b) for p, b in raw.get("pids", {}).items() if str(p) in live}
            budget = raw.get("budget") if pids else None  # nobody left holding: measure afresh
            return cls(None if budget is None else int(budget), pids, {p: live[p] for p in pids})
        except (OSError, ValueError, TypeError, AttributeError):
            return cls()

    def _hold(self, own: int) -> None:
        me = str(os.getpid())
        self.pids[me], self.owners[me] = own, host.process_identity()

    def allowance(self, available: int) -> int:
        """Bytes this process may still prepack: the shared budget less what every live process
        (this one included) holds, and never more than PACK_SHARE of what is available now."""
        self._hold(_own_packed_bytes())
        if self.budget is None:
            self.budget = int(PACK_SHARE * available)
        return max(0, min(self.budget - sum(self.pids.values()), int(PACK_SHARE * available)))

    def record(self) -> None:
        own = _own_packed_bytes()
        if own:
            self._hold(own)
        else:
            self.pids.pop(str(os.getpid()), None)
            self.owners.pop(str(os.getpid()), None)

    def saved(self) -> dict:
        return {"budget": self.budget, "pids": self.pids, "owners": self.owners}


@contextlib.contextmanager
def cache_lock() -> Iterator[bool]:
    """The cache folder's lock, held by every writer of its files (the ledger, cpu_kernels.json,
    draft_precision's draft_dtype.json): one lvspec process measures and writes at a time. Yields
    False (unlocked) where the folder cannot be written."""
    path = cache_dir() / "packed_ledger.json.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(path))
        lock.acquire()
    except OSError:
        yield False
        return
    try:
        yield True
    finally:
        lock.release()


@contextlib.contextmanager
def ledger() -> Iterator[Ledger]:
    """The machine's ledger, locked for the caller (one lvspec process installs at a time: its
    measurements undisturbed by another's, and the budget read and spent at once). Where the cache
    folder cannot be written, a ledger of this process alone."""
    path = cache_dir() / "packed_ledger.json"
    with cache_lock() as locked:
        if not locked:
            yield Ledger()
            return
        book = Ledger.read(path)
        yield book
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(book.saved()))
        tmp.replace(path)


def _available_bytes() -> int:
    try:
        for line in Path("/proc/meminfo").read_text().split("\n"):
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


# ---- installing on a model's linear layers -------------------------------------------------------
@dataclass
class KernelReport:
    """What `install` chose: per shape, the curve and choices; the memory its packed copies take."""

    mode: str
    shapes: dict[str, dict] = field(default_factory=dict)
    packed_mb: float = 0.0
    measure_s: float = 0.0
    one_token: bool | str = False  # the one-row choice installed: True inside one_token_steps(), "always"

    def summary(self) -> dict:
        return {"mode": self.mode, "packed_mb": round(self.packed_mb, 1), "measure_s": round(self.measure_s, 2),
                "one_token": self.one_token, "shapes": self.shapes}


@dataclass
class _Group:
    """Linear layers sharing a weight shape, dtype and bias: measured once, installed alike."""

    members: list[torch.nn.Linear]
    curve: ShapeCurve | None = None
    with_onednn: bool = False
    choices: dict[int, Choice] = field(default_factory=dict)
    packed: list[torch.Tensor | None] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return sum(l.weight.numel() * l.weight.element_size() for l in self.members)


def linear_layers(modules) -> list[torch.nn.Linear]:
    seen, out = set(), []
    for module in modules:
        for sub in module.modules():
            if isinstance(sub, torch.nn.Linear) and id(sub) not in seen and sub.weight.dim() == 2:
                seen.add(id(sub))
                out.append(sub)
    return out


def _groups(layers: list[torch.nn.Linear]) -> list[_Group]:
    """Layers by (shape, dtype, bias), the largest weights first (they gain most from a packed copy)."""
    groups: dict[tuple, list[torch.nn.Linear]] = {}
    for layer in layers:
        groups.setdefault((tuple(layer.weight.shape), layer.weight.dtype, layer.bias is not None), []).append(layer)
    return [_Group(m) for m in sorted(groups.values(), key=lambda g: -g[0].weight.numel())]


def _fallback_warning(group: _Group, step: str, err: Exception) -> None:
    weight = group.members[0].weight
    warnings.warn(f"lvspec: CPU kernels for the {tuple(weight.shape)} {weight.dtype} linear layers failed while "
                  f"{step} ({type(err).__name__}: {err}); they keep nn.Linear", RuntimeWarning, stacklevel=3)


def _measure_group(group: _Group, remeasure: bool, cache: dict) -> None:
    """group.curve from the cache or measured; None (nn.Linear, one warning) if measuring fails."""
    first = group.members[0]
    group.with_onednn = onednn_available(first.weight)
    bias = None if first.bias is None else first.bias.detach()
    try:
        group.curve = curve_for(first.weight.detach(), bias, group.with_onednn, remeasure, cache)
    except Exception as err:  # noqa: BLE001 - any kernel library error: this weight stays on nn.Linear
        _fallback_warning(group, "measuring", err)


def _choose_and_pack(group: _Group, allowance: int, one_token: bool) -> int:
    """group.choices (the prepacked copy only if it fits `allowance`) and group.packed; returns the
    bytes packed. A failed pack leaves the group on nn.Linear (no choices) with one warning."""
    choices = group.curve.choices()
    if any(c.kind == "onednn" for c in choices.values()) and group.nbytes > allowance:
        choices = group.curve.without_onednn().choices()
    group.choices = {m: c for m, c in choices.items() if (m > 1 or one_token) and c.kind != "torch"}
    if not any(c.kind == "onednn" for c in group.choices.values()):
        group.packed = [None] * len(group.members)
        return 0
    try:
        group.packed = [pack(l.weight.detach()) for l in group.members]
    except Exception as err:  # noqa: BLE001 - e.g. a dtype this CPU's oneDNN cannot reorder
        _fallback_warning(group, "packing", err)
        group.choices, group.packed = {}, []
        return 0
    _LIVE_PACKS.update(group.packed)
    return group.nbytes


def _describe(group: _Group, one_token: bool) -> dict:
    shown = {m: (c.kind if c.kind != "pad" else f"pad{c.rows}") for m, c in group.choices.items()}
    return {"layers": len(group.members), "torch_ms": group.curve.torch_ms, "onednn_ms": group.curve.onednn_ms,
            "spread": round(group.curve.spread, 3),
            "choices": {m: shown.get(m, "torch") for m in range(1 if one_token else 2, ROWS[-1] + 1)}}


def install(modules, mode: str = "auto", one_token: bool | str = False) -> KernelReport | None:
    """Measure (or read) and install per-shape kernels for multi-token forwards on the linear layers
    of `modules` (a language model and its LM head); with `one_token`, for one-row calls inside
    `one_token_steps()` too; with one_token="always", for every one-row call (a draft's layers, whose
    numerics never change an exact method's output). None where nothing is installed: mode `torch`,
    a non-CPU device, or no shape where another kernel beats nn.Linear."""
    if mode not in MODES:
        raise ValueError(f"cpu_kernels={mode!r}; expected one of {', '.join(MODES)}")
    layers = [l for l in linear_layers(modules) if l.weight.device.type == "cpu"]
    if mode == "torch" or not layers:
        return None
    start, report = time.perf_counter(), KernelReport(mode=mode, one_token=one_token)
    groups = _groups(layers)
    with ledger() as book:  # one installer at a time on the machine
        cache = _load_cache()
        for group in groups:
            _measure_group(group, mode == "measure", cache)
        _save_cache(cache)
        allowance = book.allowance(_available_bytes())
        for group in (g for g in groups if g.curve is not None):
            packed = _choose_and_pack(group, allowance, one_token)
            allowance -= packed
            report.packed_mb += packed / 2 ** 20
            report.shapes[shape_key(group.members[0].weight, group.members[0].bias, group.with_onednn)] = \
                _describe(group, one_token)
        book.record()
    plan = [g for g in groups if g.choices]
    for group in plan:
        for layer, packed in zip(group.members, group.packed):
            _wrap(layer, group.choices, packed, always=one_token == "always")
    report.measure_s = time.perf_counter() - start
    return report if plan else None


def _wrap(layer: torch.nn.Linear, choices: dict[int, Choice], packed: torch.Tensor | None, always: bool) -> None:
    plain = layer.forward
    in_features = layer.in_features

    def forward(x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // in_features
        choice = _row_choice(choices, rows, always)
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
