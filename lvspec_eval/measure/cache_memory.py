"""How much a model's decoding cache holds: keys and values per token, and a fixed recurrent state.

A full-attention layer keeps a key and a value per token (KV: grows with the prompt). A Gated
DeltaNet layer (Qwen3.5: three of every four text layers) keeps instead, whatever the length, one
recurrent state of value heads x key dim x value dim (transformers' Qwen3.5 computes and keeps it in
float32) and the last `linear_conv_kernel_dim` inputs of its short convolution (conv_dim = 2 x key heads
x key dim + value heads x value dim, in the model's dtype). `lvspec-eval dry-run` prints both for a
run's prompt; docs/GPU.md tabulates them per model.
"""
from __future__ import annotations

from dataclasses import dataclass

STATE_BYTES = 4  # the Gated DeltaNet recurrent state: float32 (transformers' torch and fla kernels)


@dataclass(frozen=True)
class CacheMemory:
    full_layers: int  # layers with a KV cache
    linear_layers: int  # Gated DeltaNet layers (a fixed state each)
    kv_per_token: int  # bytes, over every full-attention layer
    state: int  # bytes, over every linear layer: recurrent state and convolution window

    def total(self, tokens: int) -> int:
        return self.kv_per_token * tokens + self.state


def layer_types(text_config) -> list[str]:
    """`layer_types` of a text config; a model without it (every family but Qwen3.5) is full attention."""
    kinds = getattr(text_config, "layer_types", None)
    if kinds:
        return list(kinds)
    return ["full_attention"] * text_config.num_hidden_layers


def cache_memory(text_config, dtype_bytes: int = 2) -> CacheMemory:
    """Cache sizes of a text model (transformers text config) with KV in `dtype_bytes` per number."""
    kinds = layer_types(text_config)
    full = sum(1 for k in kinds if k == "full_attention")
    linear = sum(1 for k in kinds if k == "linear_attention")
    c = text_config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    kv = 2 * full * c.num_key_value_heads * head_dim * dtype_bytes
    state = 0
    if linear:
        heads_v, dk, dv = c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
        conv_dim = 2 * c.linear_num_key_heads * dk + heads_v * dv
        state = linear * (heads_v * dk * dv * STATE_BYTES + conv_dim * c.linear_conv_kernel_dim * dtype_bytes)
    return CacheMemory(full, linear, kv, state)


def describe(memory: CacheMemory, tokens: int) -> str:
    """One line: the cache a `tokens`-token prompt fills (KV, and the fixed state where there is one)."""
    kv = memory.kv_per_token * tokens
    text = f"cache {human(kv)} KV ({human(memory.kv_per_token)} a token, {memory.full_layers} attention layers)"
    if memory.linear_layers:
        text += f" + {human(memory.state)} fixed state ({memory.linear_layers} Gated DeltaNet layers)"
    return text


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} GiB"
