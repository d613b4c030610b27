"""Cost model: predicted decode speedups of each drafter at real model sizes, no trained weights.

Why: the demo's models are too small for the long-video effects the papers report (DESIGN.md:
their decode cost barely depends on the number of visual tokens). What decides a drafter's speed
at scale is how its per-step cost grows with the video, and that depends only on architecture and
implementation, not on trained weights. So we time the real architectures (layer counts, widths,
heads, vocabularies of Qwen2.5-VL-7B/32B, Qwen3-VL-2B/4B/8B/32B, Qwen3.5-2B/4B/27B/35B-A3B and
LLaVA-OneVision-0.5B/7B) with random weights,
through this project's own backends and drafter (prefill, tree growth, tree-masked forward, cache
compaction), and combine the timings with acceptance lengths tau (measured by a benchmark run, or
assumed) into speedups:

    step           = t_draft_tree + t_verify + t_compact
    decode speedup = (tau + 1) * t_target_step / step
    e2e speedup    = (P + T * t_target_step) / (P + P_draft + T / (tau + 1) * step)

t_target_step: one vanilla decode step of the target (1 token, KV holding the whole video).
t_verify: one target forward over the root and a draft tree (`tree_nodes` nodes, tree mask).
t_compact: the target's commit after that forward: Backend.keep of the root and an accepted path
  of round(tau) nodes (not contiguous in the tree, so every cache layer is gathered and copied).
t_draft_tree: one whole proposal of the drafter (decoding/drafters/model.ModelDrafter.propose):
  feeding the round(tau) + 1 tokens committed since its last proposal, growing an EAGLE-2 dynamic
  tree (`depth` levels, `level_width` = top-k nodes expanded per level, `tree_nodes` kept) with
  one batched forward per level, and dropping the tree's cache entries; its KV holds
  full: all visual tokens (a Std-SD draft model on the whole video, as SD-Tree),
  pruned: 1 - prune_ratio of them (SpecVLM's pruned draft, ratio 0.9 by default),
  sparrow: none (Sparrow's head: modelled as a one-layer decoder at the target's width and
  vocabulary over the prompt's text only; its visual information arrives in hidden states).
P, P_draft: target and draft prefill (the draft's includes SpecVLM's token selection); T:
generated tokens (`new_tokens`).
Visual features are random (the vision encoder is not timed: its cost is the same with or
without speculation); they are made on the device, in the model's dtype, before any clock starts.
On a GPU, clocks are read after a synchronise (decoding/loop.make_clock).

Sizes: on a GPU the real sizes in bf16; on a CPU, `scale` (a width factor: attention heads,
hidden, MLP and vocabulary widths shrink together, head_dim kept) and `max_layers` (the layer
stack's time is scaled back up to the real depth) shrink the models until they fit; the shape of
the curves, not their values, is what transfers. At width
factor w a token's KV weighs 1/w times more against the weights than in the real model (KV per
token shrinks with w, weights with w^2), so a shrunk run's n visual tokens stand for about n / w
real ones (rows carry it as "equivalent_visual_tokens").

Qwen3.5 (hybrid): three of every four text layers are Gated DeltaNet layers, timed through the
engine's own linear-attention path (backends/linear_state.py): their cost per token does not grow
with the video (a recurrent state of value heads x 128 x 128 per layer, no KV), so only the
full-attention quarter of the stack reads a KV that grows with the visual tokens
(measure/cache_memory.py gives both sizes). A shrunk Qwen3.5 keeps that quarter: with fewer than 4
layers, the last one is full attention. Qwen3.5-MoE targets keep their expert count and top-k; the
experts' widths shrink with the rest.

The parts, each its own module: architectures.py (the real shapes and `shrink`), config.py
(CostConfig), synthetic.py (random-weight models through the project's backends), layouts.py (the
shape of one step), timing.py (timing primitives), predict.py (speedups and rows), measure.py (the
measurements and `run_cost_model`), outputs.py (JSON, table, plot), cli.py (the options, `run` and
`main`). Each imports only modules listed before it.
"""
from __future__ import annotations

from .architectures import ARCHITECTURES, PAIRS, Scale
from .cli import add_arguments, main, run
from .config import CostConfig
from .measure import run_cost_model

# the face for callers: settings, a run, the command line
__all__ = ["ARCHITECTURES", "PAIRS", "CostConfig", "Scale", "add_arguments", "main", "run", "run_cost_model"]
