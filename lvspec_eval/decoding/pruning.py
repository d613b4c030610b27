"""SpecVLM's verifier-guided pruning of the draft's video tokens (two stages).

Scores: for each video token, the attention it receives from the text after the video, averaged
over all layers, heads and those query positions (collected during the target's prefill, see
backends/attention.py). Keep K = floor(n * (1 - ratio)) tokens:
  Stage I: the smallest top-scoring set whose scores sum to at least `lam` of the total (<= K);
  Stage II: the remaining K - m picked uniformly (evenly spaced) among the rest, in original order.
The union is returned in original (frame-major, row-major) order.

Scorers (`prune_scorer`): `attention` (the above, SpecVLM's) or `uv` (UV-Prune: how much each video
token's similarity to the text grows across the target's early layers, decoding/uv_prune.py; from
hidden states only). Both feed the same two-stage selection.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .uv_prune import uv_layers, uv_scores

PRUNE_SCORERS = ("attention", "uv")


@dataclass(frozen=True)
class PruneConfig:
    ratio: float = 0.9  # share of video tokens dropped
    lam: float = 0.4  # Stage I mass
    scorer: str = "attention"  # attention | uv (see the module docstring)
    uv_layers: tuple[int, int] | None = None  # uv: (l1, l2); None: uv_prune.uv_layers' default

    def __post_init__(self):
        if self.scorer not in PRUNE_SCORERS:
            raise ValueError(f"prune_scorer={self.scorer!r}; expected one of {', '.join(PRUNE_SCORERS)}")
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


def scorer_layers(cfg: PruneConfig | None, num_layers: int) -> tuple[int, ...]:
    """The target layers whose prefill hidden states the scorer reads (uv: l1 and l2; else none)."""
    return uv_layers(num_layers, cfg.uv_layers) if cfg is not None and cfg.scorer == "uv" else ()


def prune_scores(cfg: PruneConfig, target, inputs, target_state) -> torch.Tensor:
    """[num_visual] the scorer's score of each video token, from the target's prefill."""
    if cfg.scorer == "attention":
        return target.visual_attention(target_state)
    l1, l2 = uv_layers(target.num_layers, cfg.uv_layers)
    hidden = target_state.prompt_hidden
    return uv_scores(hidden[l1], hidden[l2], inputs.visual_mask, inputs.visual_span[1])
