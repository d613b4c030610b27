"""Decode statistics, per step and per sample.

tau (mean accepted length) counts the draft tokens accepted per step and EXCLUDES the bonus token
the target adds, as the papers report it; tokens_per_step = tau + 1 counts it. Decode time starts
after the target prefill and leaves out the draft's preparation (pruning, its vision tower, its
prefill), also when that happens in the middle of a request (draft_prepare=lazy); end-to-end time
(e2e_s) is read off the clock from the request to the answer, so it includes all of them.
"""
from __future__ import annotations

import resource
import time
import weakref
from dataclasses import asdict, dataclass, field
from typing import Self

import torch

from .types import StepStats


@dataclass
class SampleStats:
    dtype: str = "float32"  # the target's compute dtype (what exact-match tolerances depend on)
    visual_tokens: int = 0
    kept_visual_tokens: int = 0
    prompt_tokens: int = 0
    preprocess_s: float = 0.0  # frames to pixels and prompt to ids (CPU work, before the prefill)
    prefill_s: float = 0.0  # the target's one prefill (vision tower included)
    prune_s: float = 0.0  # selecting the pruned draft's video tokens (part of draft_prepare_s)
    draft_vision_s: float = 0.0  # the draft's input embeddings: its vision tower (part of draft_prepare_s)
    draft_prefill_s: float = 0.0  # the draft's prefill, vision tower excluded (part of draft_prepare_s)
    draft_prepare_s: float = 0.0  # all draft-side preparation: prune_s + draft_vision_s + draft_prefill_s
    draft_prepared_at: int | None = None  # generated tokens when the draft was prepared; None: never
    decode_s: float = 0.0  # after the target prefill, draft preparation left out
    e2e_s: float = 0.0  # wall clock from the request to the answer (measured, not summed)
    draft_s: float = 0.0
    verify_s: float = 0.0
    steps: list[StepStats] = field(default_factory=list)
    num_new_tokens: int = 0
    peak_memory_mb: float = 0.0
    error: str | None = None
    policy: dict | None = None  # the adaptive draft policy's estimates at the end of the sample
    # The loop's own cost: of the decode steps' wall time (the step that prepared a lazy draft left out),
    # forward_s went to the models' forwards (ForwardClock) and overhead_s to everything else: the
    # policy, tree growth around the draft's forwards, masks, verification, commit, stats, stop strings.
    # On a GPU overhead_s also holds the host's waits for the device (the forwards return early).
    forward_s: float = 0.0
    overhead_s: float = 0.0
    timed_steps: int = 0  # the steps forward_s and overhead_s cover
    # Host synchronisations the engine's own code made in those steps (host_sync.py: reads of tensor
    # data and tensors made from host values; on a GPU each waits for the device), and the most in one step.
    host_syncs: int = 0
    host_syncs_max_step: int = 0

    def add_step(self, step: StepStats) -> None:
        self.steps.append(step)
        self.draft_s += step.draft_s
        self.verify_s += step.verify_s

    def add_step_time(self, wall_s: float, forward_s: float, host_syncs: int = 0) -> None:
        """One decode step's wall time, of which `forward_s` in model forwards, and its host syncs."""
        self.forward_s += forward_s
        self.overhead_s += max(0.0, wall_s - forward_s)
        self.timed_steps += 1
        self.host_syncs += host_syncs
        self.host_syncs_max_step = max(self.host_syncs_max_step, host_syncs)

    @property
    def accepted_lengths(self) -> list[int]:
        return [s.num_accepted for s in self.steps]

    @property
    def tau(self) -> float:
        return sum(self.accepted_lengths) / len(self.steps) if self.steps else 0.0

    def to_dict(self) -> dict:
        """The JSON record written to stats_path (one per sample); report.py reads these keys."""
        d = {k: v for k, v in asdict(self).items() if k != "steps"}
        n = len(self.steps)
        d.update(
            num_steps=n,
            num_target_forwards=n + 1,  # + the prefill
            accepted_lengths=self.accepted_lengths,
            tau=self.tau,
            tokens_per_step=self.tau + 1 if n else 0.0,
            decode_tokens_per_s=self.num_new_tokens / self.decode_s if self.decode_s > 0 else 0.0,
            e2e_tokens_per_s=self.num_new_tokens / self.e2e_s if self.e2e_s > 0 else 0.0,
            draft_step_ms=1000 * self.draft_s / n if n else 0.0,
            # drafting time of the steps that drafted: a policy that skips drafting on some steps lowers
            # draft_step_ms (a mean over every step) without making a draft any cheaper
            drafted_draft_s=sum(s.draft_s for s in self.steps if s.num_draft_nodes),
            verify_step_ms=1000 * self.verify_s / n if n else 0.0,
            num_draft_nodes=[s.num_draft_nodes for s in self.steps],
            overhead_step_ms=1000 * self.overhead_s / self.timed_steps if self.timed_steps else 0.0,
            host_syncs_per_step=self.host_syncs / self.timed_steps if self.timed_steps else 0.0,
        )
        if any(s.plan for s in self.steps):  # what the adaptive policy chose, step by step
            d.update(plan_depth=[(s.plan or {}).get("depth", 0) for s in self.steps],
                     plan_width=[(s.plan or {}).get("width", 0) for s in self.steps],
                     plan_est_rate=[(s.plan or {}).get("est_rate") for s in self.steps])
        return d


class ForwardClock:
    """Seconds spent inside the forwards of some modules (host wall clock, summed), while entered:
    a pre-hook and a hook per module, removed on exit. Modules may nest (a head's projection called
    on its own and inside the head): time counts from the outermost call's start to its end."""

    def __init__(self, modules):
        self.modules, self.seconds, self._handles, self._started = list(dict.fromkeys(modules)), 0.0, [], 0.0
        self._depth = 0

    def _start(self, *_args) -> None:
        if not self._depth:
            self._started = time.perf_counter()
        self._depth += 1

    def _stop(self, *_args) -> None:
        self._depth -= 1
        if not self._depth:
            self.seconds += time.perf_counter() - self._started

    def __enter__(self) -> Self:
        for module in self.modules:
            self._handles += [module.register_forward_pre_hook(self._start), module.register_forward_hook(self._stop)]
        return self

    def __exit__(self, *exc) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []


# ---- peak memory of one sample ---------------------------------------------------------------------
# A sample's peak is measured between reset_peak_memory(devices) at its start and
# peak_memory_mb(devices) at its end. On CUDA: the sum over the devices of the peak bytes allocated by
# tensors on each (a model spread by device_map counts every GPU it uses; the per-device peaks may
# fall at different moments, so the sum is an upper bound of the simultaneous total). On the CPU: the
# process's peak resident memory (VmHWM; Linux resets it through /proc/self/clear_refs, elsewhere it
# stays a maximum since the process started).
_CLEAR_REFS, _STATUS = "/proc/self/clear_refs", "/proc/self/status"


_DEVICES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # module -> (first device, its devices)


def memory_devices(*modules: torch.nn.Module | None) -> tuple[torch.device, ...]:
    """The devices holding the parameters and buffers of `modules` (None entries are skipped).
    Walking every tensor of two models took 1-3 ms per request on the demo, so each module's devices are
    kept, and looked at again only when its first tensor has moved."""
    found = {d for m in modules if m is not None for d in _module_devices(m)}
    return tuple(sorted(found, key=str))


def _module_devices(module: torch.nn.Module) -> frozenset:
    first = next(module.parameters(), None)
    first = None if first is None else first.device
    cached = _DEVICES.get(module)
    if cached is None or cached[0] != first:
        cached = _DEVICES[module] = (first, frozenset(t.device for t in (*module.parameters(), *module.buffers())))
    return cached[1]


def _as_devices(devices) -> tuple[torch.device, ...]:
    if isinstance(devices, (torch.device, str)):
        return (torch.device(devices),)
    return tuple(torch.device(d) for d in devices)


def reset_peak_memory(devices) -> None:
    """Start a new peak on these devices (a device, a device name, or an iterable of them)."""
    devices = _as_devices(devices)
    for device in devices:
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
    if any(d.type == "cpu" for d in devices):
        try:
            with open(_CLEAR_REFS, "w") as f:
                f.write("5")  # 5: reset the peak resident set size (proc(5))
        except OSError:
            pass  # not Linux, or not permitted: the CPU figure stays the process's maximum


def peak_memory_mb(devices) -> float:
    """Peak MiB since the last reset_peak_memory: summed over the CUDA devices, or the CPU peak RSS."""
    devices = _as_devices(devices)
    cuda = [d for d in devices if d.type == "cuda"]
    if cuda:
        return sum(torch.cuda.max_memory_allocated(d) for d in cuda) / 2**20
    return _cpu_peak_kib() / 1024


def _cpu_peak_kib() -> float:
    try:
        with open(_STATUS) as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return float(line.split()[1])
    except OSError:
        pass
    return float(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)  # KiB on Linux
