"""Attention received by the video tokens, collected layer by layer during part of a prefill.

SpecVLM scores each video token by the attention the text after the video pays to it, averaged
over all layers, heads and those queries. We register an attention function that runs the
sdpa attention with the explicit 4-D mask the prefill passes and, for the few queries of the text-after-video part, also forms
their softmax rows and adds the video columns to a running sum: one [heads, queries, keys] block
per layer at a time, never all layers' maps at once.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "lvspec_collect_visual"


class VisualAttention:
    """Running sum over layers of the mean attention each key in [start, end) receives."""

    def __init__(self, start: int, end: int):
        self.start, self.end = start, end
        self.total: torch.Tensor | None = None
        self.num_layers = 0

    def add(self, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float) -> None:
        # query [1, heads, q, d]; key [1, kv_heads, k, d]
        key = key.repeat_interleave(query.shape[1] // key.shape[1], dim=1)
        logits = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scaling
        if mask is None or mask.dim() != 4:
            raise ValueError("visual attention collection needs an explicit 4-D additive mask")
        logits = logits + mask[..., : key.shape[-2]].float()
        weights = torch.softmax(logits, dim=-1)[..., self.start : self.end]
        layer_mean = weights.mean(dim=(0, 1, 2))  # [num_visual]
        self.total = layer_mean if self.total is None else self.total + layer_mean
        self.num_layers += 1

    def scores(self) -> torch.Tensor:
        if self.total is None:
            raise RuntimeError("no attention was collected")
        return (self.total / self.num_layers).cpu()


_ACTIVE: list[VisualAttention] = []


def _collecting_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    col = _ACTIVE[-1]
    out = sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
    col.add(query, key, attention_mask, scaling if scaling is not None else query.shape[-1] ** -0.5)
    return out


AttentionInterface.register(NAME, _collecting_attention)


@contextlib.contextmanager
def collect_visual_attention(text_config, start: int, end: int) -> Iterator[VisualAttention]:
    """While active, every attention layer of `text_config`'s model adds to the collector."""
    col = VisualAttention(start, end)
    original = text_config._attn_implementation
    _ACTIVE.append(col)
    text_config._attn_implementation = NAME
    try:
        yield col
    finally:
        text_config._attn_implementation = original
        _ACTIVE.pop()
