"""A sparse view of a target's own KV cache (Sparse-to-Dense, StD: arXiv 2505.19155), for the target
to draft over itself.

Per attention layer and per KV head, the view keeps every text entry of the prompt (everything that
is not a video token: the template, the question, Qwen3-VL's timestamps) and the K video entries the
text after the video attended to most at prefill, its queries' attention summed over the query heads
of the KV head's group and over the text rows (computed from the query rows the prefill kept,
attention.TextQueries, and the prompt's keys in the cache: no attention map is ever materialised, and
the prefill's own kernel may be FlashAttention). Entries the target commits later (generated text)
are appended as they come (`extend`).

The view is a gathered copy (a DynamicCache whose attention layers hold only the kept entries), not a
mask over the dense cache: the cached keys are already rotated, so a kept entry keeps its position,
and attention over K + m_t entries costs what K + m_t entries cost (a mask would still read all of
them). Drafted tokens are appended to it as temporary entries and dropped after the step. A layer
without keys (Qwen3.5's Gated DeltaNet) is the target's own cache layer, shared: the draft only
ever runs temporary forwards through it, which never touch its committed state (linear_state.py),
and the step's `keep(state, 0)` drops them.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from .attention import group_queries


def head_scores(query: torch.Tensor, key: torch.Tensor, scaling: float, query_start: int) -> torch.Tensor:
    """[kv_heads, num_keys] attention the text rows pay each key, summed over the group's query
    heads and the rows. query: [1, heads, rows, d] (sequence indices query_start...); key:
    [1, kv_heads, num_keys, d] (the prompt's keys, rotated as the kernel got them)."""
    kv_heads, num_keys = key.shape[1], key.shape[-2]
    grouped = group_queries(query, kv_heads).float()  # [1, kv, group * rows, d]
    logits = torch.matmul(grouped, key.float().transpose(-1, -2)) * scaling
    rows = torch.arange(query_start, num_keys, device=key.device).repeat(grouped.shape[2] // (num_keys - query_start))
    hidden = torch.arange(num_keys, device=key.device)[None, :] > rows[:, None]  # causal: row i sees keys <= i
    logits = logits.masked_fill(hidden[None, None], torch.finfo(torch.float32).min)
    return torch.softmax(logits, dim=-1).sum(dim=2)[0]


def kept_entries(scores: torch.Tensor, video: torch.Tensor, k: int) -> torch.Tensor:
    """[kv_heads, num_text + k] ascending prompt indices per KV head: every non-video entry and the
    k best-scored video entries. scores: [kv_heads, num_keys]; video: [num_keys] bool."""
    video = video.to(scores.device)
    text = (~video).nonzero().flatten()
    k = min(k, int(video.sum()))
    best = scores.masked_fill(~video[None], -1.0).topk(k, dim=-1).indices  # video scores are >= 0
    return torch.cat([text[None].expand(scores.shape[0], -1), best], dim=-1).sort(dim=-1).values


def build(cache: DynamicCache, config, keep: dict[int, torch.Tensor], length: int) -> DynamicCache:
    """A view of `cache`'s first `length` entries: layer l keeps the entries keep[l] [kv_heads, n]
    (all of them where keep has no l); layers without keys are cache's own (shared)."""
    view = DynamicCache(config=config)
    for i, layer in enumerate(cache.layers):
        if getattr(layer, "keys", None) is None or not hasattr(layer, "update"):
            view.layers[i] = layer  # a recurrent state: shared, only ever used through temporary forwards
            continue
        keys, values = layer.keys[:, :, :length], layer.values[:, :, :length]
        if i in keep:
            index = keep[i].to(keys.device)[None, :, :, None]
            keys = keys.gather(2, index.expand(-1, -1, -1, keys.shape[-1]))
            values = values.gather(2, index.expand(-1, -1, -1, values.shape[-1]))
        view.layers[i].update(keys.contiguous(), values.contiguous())
    return view


def extend(view: DynamicCache, cache: DynamicCache, start: int, end: int) -> None:
    """Append `cache`'s entries [start, end) (committed since the last call) to every KV layer of the view."""
    if end <= start:
        return
    for mine, theirs in zip(view.layers, cache.layers):
        if mine is theirs or getattr(theirs, "keys", None) is None:
            continue
        mine.keys = torch.cat([mine.keys, theirs.keys[:, :, start:end]], dim=-2)
        mine.values = torch.cat([mine.values, theirs.values[:, :, start:end]], dim=-2)
