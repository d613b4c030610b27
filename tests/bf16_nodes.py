"""bfloat16 references for tree verification, node by node (tests/test_linear_state.py,
tests/test_backends.py, scripts/bf16_partings.py).

For one committed state (a prefill, its first greedy token pending) and a draft tree, four sets of
logits per node (the root, i.e. the pending token, then each draft node), each of the node's path:

- engine      the engine's verification rows: `backend.score` over the tree (what the loop verifies)
- one_token   one-token decoding of the path, through transformers' own forward (what vanilla does)
- whole_path  transformers' own forward over the whole path in one call, causal (a chunked prefill)
- flat_tree   transformers' own forward over the flattened tree in one call, with the engine's 4-D
              additive mask and positions; None where the text model has linear-attention layers
              (a Gated DeltaNet layer reads a flattened tree as one sequence: no mask reaches it)

"transformers' own" means the user's kernel (sdpa) as transformers calls it, not the engine's
attention dispatcher (backends/attention.py), and no linear_state tree path: plain model forwards on
a copy of the committed cache.

In bf16 a node's argmax may differ between one_token and the rest where the top two logits are
within rounding; what the engine adds of its own rounding shows as engine != flat_tree (attention
families) or as more argmax differences from one_token than whole_path has (Qwen3.5).
"""
from __future__ import annotations

import contextlib
import copy
import random
from dataclasses import dataclass

import torch

from lvspec_eval.backends import attention, linear_state
from lvspec_eval.backends.base import additive_mask
from lvspec_eval.decoding import tree
from lvspec_eval.decoding.types import Draft

# The weights `scale_weights` multiplies: what feeds the short convolution of a Gated DeltaNet layer
# (in_proj_qkv), and an attention layer's queries and keys: their projections, and where a QK-norm
# undoes those (Qwen3-VL), its gain. Qwen3.5's attention norms scale by (1 + weight), zero in a
# random model: they stay as they are, and the scale reaches its Gated DeltaNet layers only.
SCALED = ("in_proj_qkv", "q_proj", "k_proj", "q_norm", "k_norm")


@dataclass
class NodeRows:
    """[1 + n, vocab] float32 logits per node (root first), one set per way of computing them."""

    engine: torch.Tensor
    one_token: torch.Tensor
    whole_path: torch.Tensor
    flat_tree: torch.Tensor | None

    def argmax_differences(self, rows: torch.Tensor) -> int:
        """Nodes where `rows` picks another token than one-token decoding."""
        return int((rows.argmax(-1) != self.one_token.argmax(-1)).sum())


def random_tree(rng: random.Random, n: int, vocab: int) -> tuple[list[int], list[int]]:
    """n nodes, each hanging off the root or an earlier node (parents before children)."""
    parents = [-1] + [rng.randint(-1, i - 1) for i in range(1, n)]
    return [rng.randrange(vocab) for _ in range(n)], parents


@torch.no_grad()
def scale_weights(model, factor: float) -> None:
    """Multiply the SCALED projections of the language model by `factor`: larger activations and
    sharper attention than a tiny random model's, where a rounding of the engine's own shows."""
    for name, module in model.named_modules():
        if name.rsplit(".", 1)[-1] in SCALED and "visual" not in name and "vision" not in name:
            module.weight.mul_(factor)


def committed_state(backend, prompt: str, videos: list):
    """A prefill with its greedy token pending (the root of the first tree)."""
    state, logits = backend.prefill(backend.prepare(prompt, videos))
    state.pending = [int(logits.argmax())]
    return state


@contextlib.contextmanager
def transformers_attention(backend):
    """Inside: the language model's attention is the user's kernel as transformers calls it (its
    sdpa repeats K/V and takes the 4-D mask as is), not the engine's dispatcher."""
    text_config = backend.model.config.get_text_config()
    kernel = attention.kernel_of(text_config)
    text_config._attn_implementation = kernel
    try:
        yield
    finally:
        attention.install(backend.model, kernel)


def _plain(backend, state, cache, tokens: list[int], offsets: torch.Tensor, mask=None) -> torch.Tensor:
    """transformers' own forward of `tokens` at next_pos + offsets on `cache`; logits [m, vocab]."""
    positions = backend.position_ids(state.extra, state.next_pos + offsets.to(backend.device))
    with transformers_attention(backend), torch.no_grad():
        out = backend.text_model()(input_ids=torch.tensor([tokens], device=backend.device), position_ids=positions,
                                   attention_mask=mask, cache=cache, use_cache=True)
        return backend.lm_head(out.last_hidden_state[0])


def one_token_rows(backend, state, tokens: list[int], parents: list[int]) -> torch.Tensor:
    """Each node's logits after decoding its path one token at a time (a cache per node, built on
    its parent's: parents come before children)."""
    root = copy.deepcopy(state.cache)
    rows = [_plain(backend, state, root, state.pending, torch.tensor([0]))[0]]
    caches = []
    for node, parent in enumerate(parents):
        cache = copy.deepcopy(root if parent < 0 else caches[parent])
        depth = len(tree.path_to(node, parents))
        rows.append(_plain(backend, state, cache, [tokens[node]], torch.tensor([depth]))[0])
        caches.append(cache)
    return torch.stack(rows)


def whole_path_rows(backend, state, tokens: list[int], parents: list[int]) -> torch.Tensor:
    """Each node's logits from one causal forward over the pending token and its path."""
    rows = []
    for node in [-1, *range(len(tokens))]:
        seq = state.pending + [tokens[i] for i in tree.path_to(node, parents)]
        rows.append(_plain(backend, state, copy.deepcopy(state.cache), seq, torch.arange(len(seq)))[-1])
    return torch.stack(rows)


def flat_tree_rows(backend, state, tokens: list[int], parents: list[int]) -> torch.Tensor | None:
    """transformers' own forward over pending + tree with the engine's mask and positions."""
    if linear_state.has_linear_layers(state.cache):
        return None
    offsets, visible = tree.pending_and_tree_layout(len(state.pending), torch.tensor(parents))
    mask = additive_mask(state.cache_len, visible, backend.model.dtype, backend.device)
    return _plain(backend, state, copy.deepcopy(state.cache), state.pending + tokens, offsets, mask)


def engine_rows(backend, state, tokens: list[int], parents: list[int]) -> torch.Tensor:
    """The verification rows the loop reads: backend.score over the tree, on a copy of the state."""
    draft = Draft(torch.tensor(tokens), torch.tensor(parents))
    return backend.score(copy.deepcopy(state), draft).logits


def node_rows(backend, state, tokens: list[int], parents: list[int]) -> NodeRows:
    return NodeRows(engine_rows(backend, state, tokens, parents), one_token_rows(backend, state, tokens, parents),
                    whole_path_rows(backend, state, tokens, parents), flat_tree_rows(backend, state, tokens, parents))
