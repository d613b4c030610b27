"""The draft model's precision (model_arg `draft_dtype`): as asked, or on a CPU measured at load.

Why the draft may run in another precision than the target: the target verifies every token an
exact method commits, so the draft's numerics change how many of its tokens are accepted, never what
is output (DESIGN.md). On the real pair the 0.5B draft's one-token step is 40 % of the 1.5B target's,
and a drafting step four levels deep costs more than a target step: the draft is the bill, and in
bfloat16 it reads half the bytes.

`int8` (CPU only, never chosen by `auto`): the draft's linear layers in dynamic int8
(draft_int8.py), the cheapest step measured, with a small loss of agreement with the target that a
timing of linear layers cannot see; a user opts in.

`auto` on a CPU: bfloat16 only where torch's oneDNN reports bfloat16 support on this CPU
(AVX-512 BF16 or AMX; linear_kernels.bf16_supported, asked at run time, never assumed), and only
where it is measured faster: per distinct linear shape of the draft's language model and LM head,
the best of REPEATS calls of `F.linear` on ROWS rows (a one-token step and a small drafting level)
in float32 and in bfloat16, weighted by how many layers have that shape. bfloat16 is chosen when it
takes at most MIN_GAIN of float32's time. The measurements are cached on disk per CPU model, thread
count, torch version and shape (`$LVSPEC_CACHE_DIR/draft_dtype.json`, beside linear_kernels.py's
cpu_kernels.json, and measured and written under the same lock, `linear_kernels.cache_lock`), so a
run pays for them once. `auto` on an accelerator keeps the dtype the models load in (bfloat16 by
default there).

Memory: a bfloat16 draft holds half its float32 weights (the Qwen2.5 0.5B: 0.99 GB instead of
1.98 GB); measuring holds a bfloat16 copy of one layer per shape for a moment (the 0.5B's LM head,
the largest: 272 MB).
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from . import linear_kernels

DRAFT_DTYPES = ("auto", "float32", "bfloat16", "float16", "int8")  # model_arg draft_dtype (int8: draft_int8.py)
ROWS = (1, 4)  # rows timed per shape: a one-token step and a small drafting level
REPEATS = 7  # timed calls per shape, rows and dtype (the fastest counts: a neighbour only adds time)
MIN_GAIN = 0.9  # bfloat16 is chosen when it takes at most this share of float32's time
CACHE_VERSION = 1


@dataclass
class Decision:
    """What `choose` decided and why (recorded on the backend as `precision`)."""

    dtype: str  # float32 | bfloat16 | float16 | int8
    reason: str
    float32_ms: float | None = None  # the draft's linear layers, summed over ROWS (None: not measured)
    bfloat16_ms: float | None = None
    shapes: dict = field(default_factory=dict)  # shape key -> {"layers", "float32_ms", "bfloat16_ms"}

    def summary(self) -> dict:
        return asdict(self)


def measure_shape(weight: torch.Tensor) -> dict[str, float]:
    """Milliseconds of `F.linear` over ROWS rows (summed) with this weight in float32 and in bfloat16:
    per row count the fastest of REPEATS calls, the two dtypes' calls alternating so that a busy spell
    of the machine hits both alike."""
    weights = {"float32": weight.detach().float(), "bfloat16": weight.detach().to(torch.bfloat16)}
    out = {f"{name}_ms": 0.0 for name in weights}
    for m in ROWS:
        xs = {name: torch.randn(m, weight.shape[1], dtype=w.dtype) for name, w in weights.items()}
        best = {name: float("inf") for name in weights}
        for round_ in range(REPEATS + 1):  # round 0 warms up (allocation, primitive creation)
            for name, w in weights.items():
                t = time.perf_counter()
                F.linear(xs[name], w)
                if round_:
                    best[name] = min(best[name], time.perf_counter() - t)
        for name in weights:
            out[f"{name}_ms"] += best[name] * 1e3
    return out


def cache_file() -> Path:
    return linear_kernels.cache_file().with_name("draft_dtype.json")


def _load_cache() -> dict:
    try:
        data = json.loads(cache_file().read_text())
        return data if data.get("version") == CACHE_VERSION else {"version": CACHE_VERSION}
    except (OSError, ValueError, AttributeError):
        return {"version": CACHE_VERSION}


def _save_cache(data: dict) -> None:
    linear_kernels.write_json_atomic(cache_file(), data)


def _shape_groups(modules) -> dict[str, list[torch.nn.Linear]]:
    groups: dict[str, list[torch.nn.Linear]] = {}
    for layer in linear_kernels.linear_layers(modules):
        out_f, in_f = layer.weight.shape
        groups.setdefault(f"{out_f}x{in_f}", []).append(layer)
    return groups


def choose(modules, device: torch.device, load_dtype: torch.dtype, remeasure: bool = False) -> Decision:
    """draft_dtype=auto: the dtype the draft's `modules` (its language model and LM head) run fastest in."""
    name = str(load_dtype).removeprefix("torch.")
    if device.type != "cpu":
        return Decision(name, f"on {device.type} auto keeps the load dtype")
    if load_dtype != torch.float32:
        return Decision(name, "loaded in a reduced precision already")
    if not linear_kernels.bf16_supported(device):
        return Decision("float32", "torch's oneDNN reports no bfloat16 support on this CPU")
    decision = Decision("float32", "", 0.0, 0.0)
    with linear_kernels.cache_lock():  # one writer of the cache folder at a time, measuring undisturbed
        cache = _load_cache()
        entry = cache.setdefault(linear_kernels.machine_key(), {})
        for key, layers in _shape_groups(modules).items():
            if remeasure or key not in entry:
                entry[key] = measure_shape(layers[0].weight)
            decision.shapes[key] = {"layers": len(layers), **entry[key]}
            decision.float32_ms += len(layers) * entry[key]["float32_ms"]
            decision.bfloat16_ms += len(layers) * entry[key]["bfloat16_ms"]
        _save_cache(cache)
    faster = decision.bfloat16_ms <= MIN_GAIN * decision.float32_ms
    decision.dtype = "bfloat16" if faster else "float32"
    decision.reason = (f"bfloat16 linear layers measured {decision.bfloat16_ms:.2f} ms against float32's "
                       f"{decision.float32_ms:.2f} ms ({'at most' if faster else 'more than'} {MIN_GAIN:.0%})")
    return decision
