"""Decode statistics, per step and per sample.

tau (mean accepted length) counts the draft tokens accepted per step and EXCLUDES the bonus token
the target adds, as the papers report it; tokens_per_step = tau + 1 counts it. Decode time starts
after the target prefill, the pruning and the draft prefill; end-to-end time includes them.
"""
from __future__ import annotations

import resource
from dataclasses import asdict, dataclass, field

import torch

from .types import StepStats


@dataclass
class SampleStats:
    visual_tokens: int = 0
    kept_visual_tokens: int = 0
    prompt_tokens: int = 0
    prefill_s: float = 0.0
    prune_s: float = 0.0
    draft_prefill_s: float = 0.0
    decode_s: float = 0.0
    draft_s: float = 0.0
    verify_s: float = 0.0
    steps: list[StepStats] = field(default_factory=list)
    num_new_tokens: int = 0
    peak_memory_mb: float = 0.0
    error: str | None = None

    @property
    def accepted_lengths(self) -> list[int]:
        return [s.num_accepted for s in self.steps]

    @property
    def tau(self) -> float:
        return sum(self.accepted_lengths) / len(self.steps) if self.steps else 0.0

    @property
    def e2e_s(self) -> float:
        return self.prefill_s + self.prune_s + self.draft_prefill_s + self.decode_s

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
            e2e_s=self.e2e_s,
            decode_tokens_per_s=self.num_new_tokens / self.decode_s if self.decode_s > 0 else 0.0,
            e2e_tokens_per_s=self.num_new_tokens / self.e2e_s if self.e2e_s > 0 else 0.0,
            draft_step_ms=1000 * self.draft_s / n if n else 0.0,
            verify_step_ms=1000 * self.verify_s / n if n else 0.0,
            num_draft_nodes=[s.num_draft_nodes for s in self.steps],
        )
        return d


def peak_memory_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
