"""How should a Gated DeltaNet layer roll back to the accepted path? Three ways, timed on one layer.

    checkpoint  the verification forward also materialises every token's state S_i [h, dk, dv]
                (kept per token); commit copies the accepted one
    rerun       keep the committed state; commit re-runs the recurrent rule over the accepted
                tokens one at a time (what a snapshot + re-run does)
    rederive    (what backends/linear_state.py does) keep per token only k_j and u_j; commit
                builds S_e = exp(G_e) S0 + sum_j exp(G_e - G_j) k_j u_j^T in one matmul

Each is timed after the same tree forward (linear_state.tree_forward over pending + m draft nodes,
timed too): the figure that matters is what each adds per verification step and layer, and the
memory its temporary entries hold. Layer size: transformers' default Qwen3.5 text config (16 key / 32 value
heads of 128) unless given.

    python scripts/bench_linear_rollback.py [--nodes 8 24 64] [--accept 4] [--threads 2]
"""
from __future__ import annotations

import argparse
import json
import time

import torch
from transformers import DynamicCache, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

from lvspec_eval.backends import linear_state
from lvspec_eval.decoding import tree


def _chain_tree(n: int, width: int) -> torch.Tensor:
    """`width` chains of n // width nodes off the root (a verification tree's usual bulk)."""
    per = max(1, n // width)
    parents = []
    for _ in range(width):
        start = len(parents)
        parents += [-1] + [start + i for i in range(per - 1)]
    return torch.tensor(parents[:n])


def _time(fn, repeats: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, nargs="+", default=[8, 24, 64])
    ap.add_argument("--accept", type=int, default=4, help="accepted draft tokens per step")
    ap.add_argument("--width", type=int, default=4, help="branches of the verification tree")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    config = Qwen3_5TextConfig(num_hidden_layers=1, layer_types=["linear_attention"])
    layer = Qwen3_5GatedDeltaNet(config, 0).eval()
    h, dk, dv = layer.num_v_heads, layer.head_k_dim, layer.head_v_dim
    cache = DynamicCache(config=config)
    with torch.no_grad():
        layer(torch.randn(1, 16, config.hidden_size), cache=cache)  # transformers' prefill fills the state
    cache_layer = cache.layers[0]
    rows = []
    for n in args.nodes:
        parents = _chain_tree(n, args.width)
        _, visible = tree.pending_and_tree_layout(1, parents)
        x = torch.randn(1, n + 1, config.hidden_size)
        accepted = tree.path_to(min(args.accept, n) - 1, parents)
        kept = torch.tensor([0] + [1 + i for i in accepted])

        with torch.no_grad():
            t_forward = _time(lambda: (linear_state.tree_forward(layer, x, cache_layer, visible),
                                       setattr(cache_layer, linear_state._TEMP, None)), args.repeats)
            linear_state.tree_forward(layer, x, cache_layer, visible)
        temp = getattr(cache_layer, linear_state._TEMP)
        s0 = cache_layer.recurrent_states[0][0]
        q_seq, v_seq = torch.randn(h, len(kept), dk), torch.randn(h, len(kept), dv)

        def checkpoint():  # every token's state, made in the verification forward; commit picks one
            decay = (temp.G[:, :, None] - temp.G[:, None, :]).masked_fill(~visible, float("-inf")).exp()
            states = (temp.G.exp()[..., None, None] * s0[:, None]
                      + torch.einsum("hij,hjk,hjv->hikv", decay, temp.k, temp.u))  # [h, m, dk, dv]
            return states[:, kept[-1]].clone()

        def rerun():  # transformers' recurrent rule over the accepted tokens, one at a time
            state = s0.clone()
            for t in range(len(kept)):
                k_t = temp.k[:, kept[t]]
                state = state * temp.g[:, kept[t]].exp()[:, None, None]
                delta = (v_seq[:, t] - (state * k_t[..., None]).sum(-2)) * 0.5
                state = state + k_t[..., None] * delta[:, None, :]
                (state * q_seq[:, t, :, None]).sum(-2)
            return state

        def rederive():  # linear_state.keep's formula
            g_end = temp.G.index_select(1, kept[-1:])
            weight = (g_end - temp.G.index_select(1, kept)).exp()
            k, u = temp.k.index_select(1, kept), temp.u.index_select(1, kept)
            return g_end.exp()[..., None] * s0 + (k * weight[..., None]).transpose(-1, -2) @ u

        with torch.no_grad():
            row = {"nodes": n, "kept": len(kept), "tree_forward_ms": 1e3 * t_forward}
            for name, fn in (("checkpoint", checkpoint), ("rerun", rerun), ("rederive", rederive)):
                row[f"{name}_ms"] = 1e3 * _time(fn, args.repeats)
            # the three give the same state (the rerun's values are random: its time only)
            torch.testing.assert_close(checkpoint(), rederive(), atol=1e-3, rtol=1e-3)
        setattr(cache_layer, linear_state._TEMP, None)
        m = n + 1
        row["checkpoint_mib"] = m * h * dk * dv * 4 / 2**20
        row["rederive_mib"] = m * h * (dk + dv + 2) * 4 / 2**20
        rows.append(row)
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()}))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"layer": {"heads": h, "dk": dk, "dv": dv}, "threads": args.threads, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
