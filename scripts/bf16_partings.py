"""Where bfloat16 tree verification parts from one-token decoding, per family, and whose rounding it is.

Each family's tiny random target (tests/conftest.py's builders; Qwen3.5 with the released models'
layout, 3 Gated DeltaNet layers to 1 attention layer) is loaded in bfloat16 on the CPU, its language
model's SCALED projections multiplied by each --scales factor (tests/bf16_nodes.py: a tiny random
model's near-uniform activations hide roundings that larger ones show). On --trees random trees of
--nodes draft nodes (one prompt with a random video each), every node (the pending root included)
gets its logits four ways (tests/bf16_nodes.py), and the line counts:

  nodes       nodes checked
  engine      nodes where the engine's verification row (backend.score) picks another token than
              one-token decoding of the node's path (transformers' own forward, one token a call)
  whole_path  the same for transformers' own forward over the node's whole path in one call
  flat_tree   the same for transformers' own forward over the flattened tree with the engine's 4-D
              additive mask and positions ("-": not possible with linear-attention layers)
  engine!=flat  nodes where the engine's row differs from flat_tree's in any bit ("-" as above)
  engine!=path  nodes where it differs from whole_path's in any bit
  worst/tol   the largest difference between a node's engine row and its one-token row, in units of
              the report's near-tie tolerance there (reporting/divergence.py: 4 bf16 steps of the
              row's top logit): below 1, a parting at that node is classified a near-tie

With --generate N: greedy sd_tree (the target drafting for itself, tree=dynamic) against vanilla on
--prompts prompts, at most N new tokens each: vanilla's tokens in all, how many prompts part, and
at which token, each parting classified as the report does (near_tie: numerics; elsewhere: a bug).

    python scripts/bf16_partings.py                                   # every family, scales 1 4 16
    python scripts/bf16_partings.py --families qwen3_5 --generate 64 --prompts 18
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import bf16_nodes  # noqa: E402
from conftest import TARGET_CHECKPOINTS, random_case  # noqa: E402

from lvspec_eval.backends.loading import load_backend  # noqa: E402
from lvspec_eval.decoding import loop, methods  # noqa: E402
from lvspec_eval.reporting import divergence  # noqa: E402

LAYOUT = {"qwen3_5": {"full_every": 4}}  # Qwen3.5's released models: every fourth layer full attention
MAX_SIDE = 80  # frame sides drawn from [14, MAX_SIDE]


def load(path: Path, scale: float):
    backend = load_backend(str(path), dtype="bfloat16")
    bf16_nodes.scale_weights(backend.model, scale)
    return backend


def node_counts(backend, trees: int, nodes: int) -> dict:
    vocab = backend.model.config.get_text_config().vocab_size
    counts = dict.fromkeys(("nodes", "engine", "whole_path", "flat_tree", "engine!=flat", "engine!=path",
                            "worst/tol"), 0)
    for seed in range(trees):
        case = random_case(seed, MAX_SIDE)
        state = bf16_nodes.committed_state(backend, case.prompt, case.videos)
        tokens, parents = bf16_nodes.random_tree(random.Random(seed), nodes, vocab)
        rows = bf16_nodes.node_rows(backend, state, tokens, parents)
        counts["nodes"] += rows.engine.shape[0]
        counts["engine"] += rows.argmax_differences(rows.engine)
        counts["whole_path"] += rows.argmax_differences(rows.whole_path)
        counts["engine!=path"] += int((rows.engine != rows.whole_path).any(-1).sum())
        for ours, theirs in zip(rows.engine, rows.one_token):
            worst = float((ours - theirs).abs().max()) / divergence.tolerance("bfloat16", float(theirs.abs().max()))
            counts["worst/tol"] = round(max(counts["worst/tol"], worst), 2)
        if rows.flat_tree is None:
            counts["flat_tree"] = counts["engine!=flat"] = "-"
        else:
            counts["flat_tree"] += rows.argmax_differences(rows.flat_tree)
            counts["engine!=flat"] += int((rows.engine != rows.flat_tree).any(-1).sum())
    return counts


def partings(backend, prompts: int, max_new: int) -> tuple[list[str], int]:
    """(where sd_tree parts from vanilla, "token:class" per parted prompt, the class as the report's
    divergence table gives it (reporting/divergence.py: near_tie or elsewhere, at its default logit
    scale); vanilla's tokens in all)."""
    parted, total = [], 0
    runs = {name: methods.resolve(name) for name in ("vanilla", "sd_tree")}
    for seed in range(prompts):
        case = random_case(1000 + seed, MAX_SIDE)
        out = {}
        for name, spec in runs.items():
            drafter, verifier = methods.build(spec, methods.make_options(spec, {"tree": "dynamic"}), None, backend)
            out[name] = loop.generate(backend, drafter, verifier, case.prompt, case.videos, max_new)
        total += len(out["vanilla"].tokens)
        records = [{"task": "bf16", "doc_id": seed, "tokens": o.tokens, "margins": o.margins, "dtype": "bfloat16"}
                   for o in (out["sd_tree"], out["vanilla"])]
        _, div = divergence.compare(*records)
        if div is not None:
            parted.append(f"{div.index}:{div.kind}")
    return parted, total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--families", nargs="+", default=list(TARGET_CHECKPOINTS), choices=list(TARGET_CHECKPOINTS))
    ap.add_argument("--scales", type=float, nargs="+", default=[1.0, 4.0, 16.0])
    ap.add_argument("--trees", type=int, default=20)
    ap.add_argument("--nodes", type=int, default=10, help="draft nodes per tree (the root comes on top)")
    ap.add_argument("--generate", type=int, default=0, help="also run sd_tree against vanilla, this many tokens")
    ap.add_argument("--prompts", type=int, default=18)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", default=None, help="also write the lines as JSON here")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    lines = []
    with tempfile.TemporaryDirectory() as root:
        for family in args.families:
            path = TARGET_CHECKPOINTS[family](Path(root) / family, **LAYOUT.get(family, {}))
            for scale in args.scales:
                backend = load(path, scale)
                line = {"family": family, "scale": scale, **node_counts(backend, args.trees, args.nodes)}
                if args.generate:
                    parted, total = partings(backend, args.prompts, args.generate)
                    line.update(prompts=args.prompts, vanilla_tokens=total, parted=len(parted), parted_at=parted)
                print(" ".join(f"{k}={v}" for k, v in line.items()), flush=True)
                lines.append(line)
    if args.out:
        Path(args.out).write_text(json.dumps(lines, indent=1))


if __name__ == "__main__":
    main()
