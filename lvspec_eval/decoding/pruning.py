"""SpecVLM's verifier-guided pruning of the draft's video tokens (two stages).

Scores: for each video token, the attention it receives from the text after the video, averaged
over all layers, heads and those query positions (collected during the target's prefill, see
backends/attention.py). Keep K = floor(n * (1 - ratio)) tokens:
  Stage I: the smallest top-scoring set whose scores sum to at least `lam` of the total (<= K);
  Stage II: the remaining K - m picked uniformly (evenly spaced) among the rest, in original order.
The union is returned in original (frame-major, row-major) order.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PruneConfig:
    ratio: float = 0.9  # share of video tokens dropped
    lam: float = 0.4  # Stage I mass

    def __post_init__(self):
        if not 0.0 <= self.ratio < 1.0:
            raise ValueError(f"prune_ratio must be in [0, 1), got {self.ratio}")
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"prune_lambda must be in [0, 1], got {self.lam}")


def select_visual_tokens(scores: torch.Tensor, cfg: PruneConfig) -> torch.Tensor:
    """scores: [n] attention received by each video token -> kept indices [K], ascending."""
    n = scores.numel()
    k = max(1, math.floor(n * (1 - cfg.ratio) + 1e-9))
    order = torch.argsort(scores.float(), descending=True, stable=True)
    cum = torch.cumsum(scores.float()[order], 0)
    target = cfg.lam * float(cum[-1])
    m = min(k, int(torch.searchsorted(cum, torch.tensor(target), side="left")) + 1) if target > 0 else 0
    stage1 = order[:m]
    rest = torch.ones(n, dtype=torch.bool)
    rest[stage1] = False
    rest_idx = rest.nonzero().flatten()
    need = k - m
    if need > 0 and rest_idx.numel():
        pick = torch.linspace(0, rest_idx.numel() - 1, need).round().long().unique()
        stage2 = rest_idx[pick]
    else:
        stage2 = rest_idx[:0]
    return torch.sort(torch.cat([stage1, stage2])).values
