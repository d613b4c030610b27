"""Which attention kernel runs a forward, and the attention the video tokens receive.

Tree masks and kernels. Every multi-token forward of the decoding engine (tree verification,
drafting levels, the second part of a SpecVLM prefill) passes a 4-D additive float mask
[1, 1, m, cache + m] (0 visible, the dtype's min hidden). Not every kernel can take one:
transformers' flash_attention_2 path reads a 4-D mask as a 2-D padding mask (wrong "valid key"
indices, an IndexError on CPU, a device-side assert on CUDA), and its sdpa path, whenever a mask is
passed, repeats K/V once per query head for grouped-query attention (repeat_kv: 7x the KV traffic
on Qwen2.5-VL 7B, 5x on 32B, on every verification, growing with the video).

So the language model's attention is one function of ours, registered with transformers'
`AttentionInterface` under `lvspec_tree:<kernel>` (the kernel the user asked for) and installed on
the text config only (the vision tower keeps the user's kernel):

    mask None or 2-D (prefill, one-token steps)  -> the user's kernel (flash_attention_2 / sdpa / eager)
    mask 4-D (tree masks) with sdpa or flash      -> `grouped_attention`: torch sdpa with the query
                                                     heads of each KV head stacked along the query
                                                     axis, so K/V are never copied
    mask 4-D with eager                           -> eager (the reference math; it honours any mask)

SpecVLM's pruning scores. During the target's one prefill, `collect_text_queries` keeps each
layer's query rows of the text after the video (the kernel's own output untouched: the prefill is
the one vanilla runs); when a pruned draft is prepared, `pruning_scores` sums, layer by layer, the
attention those rows pay the video keys, read back from the cache (one [kv_heads, group * text rows,
keys] block at a time, never all layers' maps at once). `collect_visual_attention` sums the same
during a forward: the engine no longer uses it; it is the independent reference that
tests/test_attention.py checks `pruning_scores` against. Any other collector can be fed the same
way (`collecting`).
"""
from __future__ import annotations

import contextlib
import sys
from typing import Iterator

import torch
from transformers import AttentionInterface
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

# What a user may ask for (model_args attn_implementation).
KERNELS = ("sdpa", "flash_attention_2", "flash_attention_3", "eager")
PREFIX = "lvspec_tree:"


def tree_path(kernel: str) -> str:
    """How tree-masked forwards run with `kernel`: "eager" or "grouped". A flash kernel that
    transformers took from the `kernels` package instead of flash-attn (e.g.
    kernels-community/flash-attn2) counts as flash. Anything else is refused."""
    if kernel == "eager":
        return "eager"
    if kernel == "sdpa" or "flash" in kernel:
        return "grouped"
    raise ValueError(f"attn_implementation={kernel!r} is not supported; expected one of {', '.join(KERNELS)}")


def kernel_of(config) -> str:
    """The kernel the user asked for, whether or not our dispatcher is installed on `config`."""
    name = config._attn_implementation or "sdpa"
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def describe(kernel: str) -> str:
    """One line for dry-run and stats: which kernel serves which forwards."""
    tree = "eager" if tree_path(kernel) == "eager" else "torch sdpa with grouped query heads (no K/V copy)"
    return f"{kernel} for prefill and one-token steps; tree-masked forwards: {tree}"


# ---- the grouped (non-repeating) masked path ------------------------------------------------------
def group_queries(query: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """[b, heads, q, d] -> [b, kv_heads, group * q, d]; head h = kv * group + j lands in row j * q + i,
    the KV head that repeat_kv would have given it."""
    b, heads, q, d = query.shape
    return query.reshape(b, num_kv_heads, heads // num_kv_heads * q, d)


def group_mask(mask: torch.Tensor | None, group: int) -> torch.Tensor | None:
    """[b, 1, q, k] -> [b, 1, group * q, k], matching `group_queries`' rows (a mask is small next to K/V).

    Every layer of a forward gets the same mask object: the grouped copy is made for the first layer
    and kept on the mask itself for the others (freed with the mask), not made per layer."""
    if mask is None or group == 1:
        return mask
    if mask.shape[1] != 1:
        raise ValueError(f"a tree mask must be shared by all heads (shape [b, 1, q, k]), got {tuple(mask.shape)}")
    made_for, grouped = getattr(mask, _GROUPED, (0, None))
    if made_for != group:
        grouped = mask.repeat(1, 1, group, 1)
        setattr(mask, _GROUPED, (group, grouped))
    return grouped


_GROUPED = "_lvspec_grouped"  # a tree mask's attribute: (group, its grouped copy)


def grouped_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **_kwargs):
    """Masked attention for grouped-query models without repeating K/V.

    query [b, heads, q, d]; key/value [b, kv_heads, k, d]; attention_mask [b, 1, q, k] (float
    additive or bool). Returns ([b, q, heads, d], None) like transformers' attention functions.
    """
    b, heads, q, _ = query.shape
    kv_heads = key.shape[1]
    out = torch.nn.functional.scaled_dot_product_attention(
        group_queries(query, kv_heads), key, value, attn_mask=group_mask(attention_mask, heads // kv_heads),
        dropout_p=dropout, scale=scaling)
    return out.reshape(b, heads, q, value.shape[-1]).transpose(1, 2).contiguous(), None


def _kernel_function(kernel: str, module):
    """The user's kernel as transformers would call it; eager is each model file's own function."""
    if kernel == "eager":
        return sys.modules[type(module).__module__].eager_attention_forward
    return ALL_ATTENTION_FUNCTIONS[kernel]


def _dispatching(kernel: str):
    path = tree_path(kernel)

    def attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        tree_mask = isinstance(attention_mask, torch.Tensor) and attention_mask.dim() == 4
        fn = grouped_attention if tree_mask and path == "grouped" else _kernel_function(kernel, module)
        out = fn(module, query, key, value, attention_mask, scaling=scaling, dropout=dropout, **kwargs)
        collector = _COLLECTORS.get(id(module.config))
        if collector is not None:
            collector.add(query, key, attention_mask, scaling if scaling is not None else query.shape[-1] ** -0.5,
                          module.layer_idx)
        return out

    return attention


def dispatch_name(kernel: str) -> str:
    """Register (once) and return the name of the dispatcher for `kernel`."""
    tree_path(kernel)
    name = PREFIX + kernel
    if name not in ALL_ATTENTION_FUNCTIONS:
        AttentionInterface.register(name, _dispatching(kernel))
        # Masks transformers builds itself (prefill, generate()) are the ones the kernel expects
        # (a hub flash kernel takes flash-attn's).
        mask_kernel = kernel if kernel in ALL_MASK_ATTENTION_FUNCTIONS else "flash_attention_2"
        ALL_MASK_ATTENTION_FUNCTIONS.register(name, ALL_MASK_ATTENTION_FUNCTIONS[mask_kernel])
    return name


def install(model, kernel: str | None = None) -> str:
    """Route the language model's attention through the dispatcher for `kernel` (default: the one
    it was loaded with, as transformers resolved it). Returns the kernel.

    Only the text config changes: the vision tower keeps the kernel `from_pretrained` gave it.
    """
    text_config = model.config.get_text_config()
    kernel = kernel or kernel_of(text_config)
    text_config._attn_implementation = dispatch_name(kernel)
    return kernel


# ---- SpecVLM's visual attention ---------------------------------------------------------------------
class VisualAttention:
    """Running sum over layers of the mean attention each key in [start, end) receives.

    query_start: the sequence index of the first query that counts (the text after the video). The
    prompt then runs in ONE forward: each layer takes only those query rows (a few dozen) and rebuilds
    their causal mask itself, whatever the kernel got (sdpa's None, eager's 4-D mask, flash's padding
    mask): a [kv_heads, group * rows, keys] block per layer, never a whole attention map. None: every
    query of the forward counts, under the forward's explicit 4-D additive mask (the text after the
    video run as a second part: how the scores were collected before, kept for comparison).
    """

    def __init__(self, start: int, end: int, query_start: int | None = None):
        self.start, self.end, self.query_start = start, end, query_start
        self.total: torch.Tensor | None = None  # on the first layer's device (layers may sit on several)
        self.num_layers = 0

    def add(self, query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None, scaling: float,
            layer: int | None = None) -> None:
        """query [1, heads, q, d]; key [1, kv_heads, k, d]; mask [1, 1, q, >= k] additive; every layer counts."""
        if self.query_start is not None:
            query, mask = self._text_rows(query, key)
        elif mask is None or mask.dim() != 4:
            raise ValueError("visual attention collection needs an explicit 4-D additive mask")
        group = query.shape[1] // key.shape[1]
        grouped = group_queries(query, key.shape[1]).float()  # the keys are not repeated per query head
        logits = torch.matmul(grouped, key.float().transpose(-1, -2)) * scaling  # [1, kv_heads, group * q, k]
        logits = logits + group_mask(mask[..., : key.shape[-2]], group).float()
        weights = torch.softmax(logits, dim=-1)[..., self.start : self.end]
        layer_mean = weights.mean(dim=(0, 1, 2))  # [num_visual]: the mean over every (head, query) row
        self.total = layer_mean if self.total is None else self.total + layer_mean.to(self.total.device)
        self.num_layers += 1

    def _text_rows(self, query: torch.Tensor, key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The query rows from `query_start` on and their causal mask [1, 1, rows, k] (row at sequence
        index i sees keys 0..i); the forward's queries end at the last key (a prefill)."""
        num_keys = key.shape[-2]
        first = self.query_start - (num_keys - query.shape[-2])  # row of query_start in this forward
        if not 0 <= first < query.shape[-2]:
            raise ValueError(f"visual attention from query {self.query_start}: this forward's queries are "
                             f"{num_keys - query.shape[-2]}..{num_keys - 1}")
        rows = torch.arange(self.query_start, num_keys, device=key.device)
        hidden = torch.arange(num_keys, device=key.device)[None, :] > rows[:, None]
        mask = torch.zeros(hidden.shape, dtype=torch.float32, device=key.device).masked_fill(
            hidden, torch.finfo(torch.float32).min)
        return query[:, :, first:], mask[None, None]

    def scores(self) -> torch.Tensor:
        if self.total is None:
            raise RuntimeError("no attention was collected")
        return (self.total / self.num_layers).cpu()


class TextQueries:
    """What the pruning scores need of the target's one prefill, kept for later: per layer, the query
    rows from `query_start` on (the text after the video, after rotary embedding, as the kernel got
    them), cloned: a few dozen rows per layer, next to nothing in the prefill. The keys they attend
    to stay in the cache (the prompt's slots never change while decoding), so the scores are only
    computed (`pruning_scores`) when a pruned draft is prepared, and never when none is."""

    def __init__(self, query_start: int):
        self.query_start = query_start
        self.queries: dict[int, torch.Tensor] = {}  # layer -> [1, heads, rows, d]
        self.scaling: dict[int, float] = {}
        self.num_keys = 0  # the prompt's length: the keys the rows attend to

    def add(self, query: torch.Tensor, key: torch.Tensor, mask, scaling: float, layer: int | None = None) -> None:
        num_keys = key.shape[-2]
        first = self.query_start - (num_keys - query.shape[-2])
        if layer is None or not 0 <= first < query.shape[-2]:
            raise ValueError(f"text queries from {self.query_start} (layer {layer}): this forward's queries are "
                             f"{num_keys - query.shape[-2]}..{num_keys - 1}")
        self.queries[layer] = query[:, :, first:].clone()
        self.scaling[layer], self.num_keys = scaling, num_keys


def pruning_scores(queries: TextQueries, cache, start: int, end: int) -> torch.Tensor:
    """[end - start] SpecVLM's pruning scores from the kept text queries and the cache's prompt keys:
    the same sum as `VisualAttention` over the prefill's layers, one layer at a time."""
    col = VisualAttention(start, end, queries.query_start)
    for layer in sorted(queries.queries):
        key = cache.layers[layer].keys[:, :, : queries.num_keys]
        col.add(queries.queries[layer], key, None, queries.scaling[layer], layer)
    return col.scores()


_COLLECTORS: dict[int, object] = {}  # id(text config) -> the collector active on that model


@contextlib.contextmanager
def collecting(text_config, collector):
    """While active, every attention layer of `text_config`'s model, after computing its output,
    calls `collector.add(query, key, mask, scaling, layer_idx)` (queries and keys after rotary
    embedding, as the kernel got them). Models loaded by `load_backend` already run the dispatcher;
    any other model runs it (with its own kernel) for the duration. Used by SpecVLM's pruning scores
    (`collect_text_queries`) and by the demo target's attention supervision (training/demo.py
    `SlotAttention`)."""
    if id(text_config) in _COLLECTORS:
        raise RuntimeError("attention is already being collected on this model")
    original = text_config._attn_implementation
    _COLLECTORS[id(text_config)] = collector
    text_config._attn_implementation = dispatch_name(kernel_of(text_config))
    try:
        yield collector
    finally:
        text_config._attn_implementation = original
        del _COLLECTORS[id(text_config)]


@contextlib.contextmanager
def collect_text_queries(text_config, query_start: int) -> Iterator[TextQueries]:
    """While active, every attention layer of `text_config`'s model keeps its text query rows."""
    with collecting(text_config, TextQueries(query_start)) as col:
        yield col


@contextlib.contextmanager
def collect_visual_attention(text_config, start: int, end: int,
                             query_start: int | None = None) -> Iterator[VisualAttention]:
    """While active, every attention layer of `text_config`'s model adds to a `VisualAttention`."""
    with collecting(text_config, VisualAttention(start, end, query_start)) as col:
        yield col
