"""Linear-attention (Gated DeltaNet) layers in the engine's cache contract: temporary entries that
follow a draft tree, and a rollback to any accepted path.

The contract (base.py): `forward` appends temporary entries, seen through a tree mask; `keep` commits
one path of them (the pending tokens and a prefix of the accepted path) and drops the rest. A KV
layer holds a key and a value per token, so that is a gather and a crop. A Gated DeltaNet layer
(Qwen3.5: three of every four layers) holds one recurrent state S [heads, dk, dv] and the last few
inputs of a short causal convolution: a token cannot be cropped out of it, and a tree mask means
nothing to it. Here is how such a layer joins the contract, with no per-token copies of S:

- A temporary forward never touches the committed state (S0 and the convolution window).
- Its m tokens are computed along their own paths in one parallel pass: the gated delta rule's
  chunk form (transformers' `torch_chunk_gated_delta_rule`) with the causal order replaced by the
  ancestor relation (the `visible` rows the attention layers get) and the decay summed along each
  token's path. For token i with path decay G_i (the sum of the log-decays g of its temporary
  ancestors and itself), the state after it is

      S_i = exp(G_i) S0 + sum_{j on i's path} exp(G_i - G_j) k_j u_j^T,

  where u_j (what token j writes into the state) solves a unit lower-triangular system over the
  path. The convolution of token i reads its own input and its nearest ancestors' (the committed
  window where its path is shorter than the kernel).
- Each temporary entry keeps k_j, u_j, g_j, G_j, its convolution input and its depth: about
  2 x heads x 128 + conv_dim numbers, against heads x 128 x 128 for a state checkpoint.
- `keep` of a path ending at e sets S = S_e by the formula above (one matmul over the path) and the
  convolution window to the last inputs along the path. A later forward can build on temporary
  entries of an earlier one (a drafter feeds its tree level by level): their u_j enter the new
  tokens' system as known terms.

Which to keep per token was measured (scripts/bench_linear_rollback.py, docs/RESULTS.md): a state
checkpoint per token costs heads x dk x dv floats and a [dk, dv] product per (token, ancestor) pair
in every verification; re-deriving the accepted state costs one [dk, path] x [path, dv] product at
commit.

`install(model)` wraps every Gated DeltaNet module (recognised by its parameters, not its family):
inside `temporary(...)` (Backend.forward) it runs `tree_forward`; elsewhere (prefills) it runs
transformers' own forward, which fills the committed state. A plain step (one token, causal, over
no temporary entries: `temporary(PLAIN)`) also runs transformers' own forward, its one-token
recurrent kernel (the fused one where installed), which advances the committed state in place:
such a step is always kept (vanilla decoding, and a drafter's catch-up of one committed token), so
vanilla decodes exactly as transformers' generate() and lmms-eval's classes do, bf16 rounding
included; `keep` then only checks that it was kept.
"""
from __future__ import annotations

import contextlib
import contextvars
from dataclasses import dataclass

import torch
import torch.nn.functional as F

_PARTS = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "conv1d", "A_log", "dt_bias", "norm", "out_proj")
_LAYOUT: contextvars.ContextVar[torch.Tensor | str | None] = contextvars.ContextVar("linear_state_layout",
                                                                                    default=None)
_TEMP = "lvspec_temp"  # attribute of a cache layer holding its temporary entries (a Temp)
PLAIN = "plain"  # temporary()'s layout for a one-token causal step over no temporary entries
_ADVANCED = "advanced"  # a cache layer's _TEMP after a plain step: its state already includes the token


def is_gated_deltanet(module) -> bool:
    """A Gated DeltaNet token mixer with separate q/k/v, z, b and a projections (Qwen3.5, dense and MoE)."""
    return all(hasattr(module, name) for name in _PARTS) and hasattr(module, "layer_idx")


def is_linear_layer(cache_layer) -> bool:
    """A cache layer that holds a recurrent state instead of keys and values."""
    return hasattr(cache_layer, "recurrent_states") and hasattr(cache_layer, "conv_states")


def install(model) -> int:
    """Route every Gated DeltaNet module's temporary forwards to `tree_forward`; returns how many."""
    count = 0
    for module in model.modules():
        if not is_gated_deltanet(module) or getattr(module, "_lvspec_tree", False):
            continue
        original = module.forward

        def forward(hidden_states, cache=None, attention_mask=None, _original=original, _module=module, **kwargs):
            visible = _LAYOUT.get()
            if visible is None or cache is None:
                return _original(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
            layer = cache.layers[_module.layer_idx]
            if isinstance(visible, str):  # PLAIN: transformers' own one-token step, in place
                if getattr(layer, _TEMP, None) is not None:
                    raise ValueError("a plain step needs a layer without temporary entries")
                out = _original(hidden_states, cache=cache, attention_mask=attention_mask, **kwargs)
                setattr(layer, _TEMP, _ADVANCED)
                return out
            return tree_forward(_module, hidden_states, layer, visible)

        module.forward, module._lvspec_tree = forward, True
        count += 1
    return count


@contextlib.contextmanager
def temporary(visible: torch.Tensor | str):
    """Inside: linear-attention layers treat the forward's m tokens as temporary entries whose
    ancestors (and themselves) among the temporary entries are `visible` [m, temp_len + m] bool;
    PLAIN: one token, causal, over no temporary entries (kept for sure: advanced in place)."""
    token = _LAYOUT.set(visible)
    try:
        yield
    finally:
        _LAYOUT.reset(token)


@dataclass
class Temp:
    """A layer's temporary entries (f of them), in feed order; per value head where it says h."""

    k: torch.Tensor  # [h, f, dk] float32: normalised keys
    u: torch.Tensor  # [h, f, dv] float32: what each token writes into the state
    g: torch.Tensor  # [h, f] float32: its log-decay
    G: torch.Tensor  # [h, f] float32: summed along its path (to the committed state)
    x: torch.Tensor  # [conv_dim, f]: its convolution input
    depth: torch.Tensor  # [f] long: temporary entries on its path, itself included

    @property
    def size(self) -> int:
        return self.depth.numel()


def _empty_temp(h: int, dk: int, dv: int, conv_dim: int, dtype, device) -> Temp:
    f32 = dict(dtype=torch.float32, device=device)
    return Temp(torch.zeros(h, 0, dk, **f32), torch.zeros(h, 0, dv, **f32), torch.zeros(h, 0, **f32),
                torch.zeros(h, 0, **f32), torch.zeros(conv_dim, 0, dtype=dtype, device=device),
                torch.zeros(0, dtype=torch.long, device=device))


def _conv_columns(visible: torch.Tensor, depth_all: torch.Tensor, depth_new: torch.Tensor, committed: int,
                  kernel: int) -> torch.Tensor:
    """[kernel, m] columns of [committed window | temporary inputs] each new token's convolution
    reads, oldest first: ancestor at distance d is the visible entry at depth - d, or, past the
    path's start, committed column committed - 1 - (d - depth)."""
    cols = []
    for d in range(kernel - 1, -1, -1):
        at = visible & (depth_all[None, :] == (depth_new - d)[:, None])
        fallback = committed - 1 - (d - depth_new)
        cols.append(torch.where(at.any(-1), committed + at.float().argmax(-1), fallback))
    return torch.stack(cols)


@torch.no_grad()
def tree_forward(module, hidden_states: torch.Tensor, layer, visible: torch.Tensor) -> torch.Tensor:
    """The Gated DeltaNet forward of m temporary tokens [1, m, hidden] along the ancestor relation
    `visible` [m, f + m] (f: the layer's earlier temporary entries); the committed state is read,
    never written; the tokens are appended to the layer's Temp."""
    m = hidden_states.shape[1]
    hv, dk, dv = module.num_v_heads, module.head_k_dim, module.head_v_dim
    conv_state, state = layer.conv_states[0][0], layer.recurrent_states[0][0]  # [conv_dim, C], [h, dk, dv]
    temp = getattr(layer, _TEMP, None)
    if temp is None:
        temp = _empty_temp(hv, dk, dv, module.conv_dim, conv_state.dtype, conv_state.device)
    f = temp.size
    if visible.shape != (m, f + m):
        raise ValueError(f"visibility {tuple(visible.shape)} for {m} tokens after {f} temporary entries")
    visible = visible.to(state.device)

    # projections, as transformers' forward does them
    x = module.in_proj_qkv(hidden_states)[0].T  # [conv_dim, m]
    z = module.in_proj_z(hidden_states).reshape(1, m, -1, dv)
    beta = module.in_proj_b(hidden_states)[0].sigmoid().float().T  # [h, m]
    g = (-module.A_log.float().exp() * F.softplus(module.in_proj_a(hidden_states)[0].float() + module.dt_bias)).T

    # the short causal convolution along each token's path
    depth_new = visible.sum(-1)
    depth_all = torch.cat([temp.depth, depth_new])
    committed = conv_state.shape[-1]
    history = torch.cat([conv_state, temp.x, x.to(conv_state.dtype)], dim=-1)
    cols = _conv_columns(visible, depth_all, depth_new, committed, module.conv_kernel_size)
    weight = module.conv1d.weight[:, 0]  # [conv_dim, kernel]
    # Accumulated in float32 and rounded once to the weight's dtype, then silu in that dtype: what
    # transformers' F.conv1d and causal_conv1d kernels compute. A sum of bf16 products rounds each
    # product, which put tree nodes 1-2 bf16 steps off one-token decoding (another argmax at some).
    mixed = (history[:, cols].float() * weight.float()[:, :, None]).sum(1).to(weight.dtype)  # [conv_dim, m]
    mixed = F.silu(mixed).to(hidden_states.dtype).T  # [m, conv_dim]
    q, k, v = torch.split(mixed, [module.key_dim, module.key_dim, module.value_dim], dim=-1)
    q, k = (t.reshape(m, -1, dk).float() for t in (q, k))
    if q.shape[1] != hv:  # grouped value heads: each q/k head serves hv // hk value heads
        q, k = (t.repeat_interleave(hv // t.shape[1], dim=1) for t in (q, k))
    q, k = (t.transpose(0, 1) for t in (q, k))  # [h, m, dk]
    v = v.reshape(m, hv, dv).float().transpose(0, 1)
    q, k = (t * torch.rsqrt((t * t).sum(-1, keepdim=True) + 1e-6) for t in (q, k))  # l2-normalised, as FLA does
    q = q * dk ** -0.5

    # the gated delta rule along the tree
    g_all = torch.cat([temp.g, g], dim=1)  # [h, f + m]
    G = g_all @ visible.float().T  # [h, m]: each new token's path decay
    G_all = torch.cat([temp.G, G], dim=1)
    decay = (G[:, :, None] - G_all[:, None, :]).masked_fill(~visible, float("-inf")).exp()  # [h, m, f + m]
    k_all = torch.cat([temp.k, k], dim=1)
    kk = (k @ k_all.transpose(-1, -2)) * decay  # [h, m, f + m]
    rhs = beta[..., None] * (v - G.exp()[..., None] * (k @ state.float()) - kk[:, :, :f] @ temp.u)
    system = beta[..., None] * kk[:, :, f:]  # strictly lower along the paths (topological order)
    u = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u_all = torch.cat([temp.u, u], dim=1)
    out = G.exp()[..., None] * (q @ state.float()) + ((q @ k_all.transpose(-1, -2)) * decay) @ u_all  # [h, m, dv]
    setattr(layer, _TEMP, Temp(k_all, u_all, g_all, G_all, torch.cat([temp.x, x.to(temp.x.dtype)], dim=-1),
                               depth_all))

    out = out.transpose(0, 1).to(hidden_states.dtype).reshape(-1, dv)
    out = module.norm(out, z.reshape(-1, dv)).reshape(1, m, -1)
    return module.out_proj(out)


@torch.no_grad()
def keep(layer, kept: torch.Tensor | None, num: int) -> None:
    """Commit the temporary entries `kept` (long indices, on the device; None: the first `num`),
    which form one path from the committed state; drop the rest."""
    temp = getattr(layer, _TEMP, None)
    if temp is None:
        if num:
            raise ValueError(f"keep({num}) on a linear-attention layer with no temporary entries")
        return
    setattr(layer, _TEMP, None)
    if isinstance(temp, str):  # a plain step: the state already holds its one token
        if num != 1:
            raise ValueError(f"keep({num}) after a plain one-token step, which advanced the state in place: "
                             "a plain step must be kept")
        return
    if num == 0:
        return
    if kept is None:
        kept = torch.arange(num, device=temp.G.device)
    kept = kept.to(temp.G.device)
    last = kept[-1:]
    G_end = temp.G.index_select(1, last)  # [h, 1]
    weight = (G_end - temp.G.index_select(1, kept)).exp()  # [h, n]
    k, u = temp.k.index_select(1, kept), temp.u.index_select(1, kept)
    state = layer.recurrent_states[0]
    new = G_end.exp()[..., None] * state[0].float() + (k * weight[..., None]).transpose(-1, -2) @ u
    state.copy_(new[None].to(state.dtype))
    conv = layer.conv_states[0]
    window = torch.cat([conv[0], temp.x.index_select(1, kept)], dim=-1)[:, -conv.shape[-1]:]
    conv.copy_(window[None])


def has_linear_layers(cache) -> bool:
    return any(is_linear_layer(layer) for layer in cache.layers)
