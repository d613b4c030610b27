"""`lvspec-eval bench` pieces that are not timings: the transformers generate() baseline pairs
like with like (same samples, tokens before EOS on both sides)."""
from __future__ import annotations

import torch

from lvspec_eval import bench
from lvspec_eval.runner import Runner


def test_hf_baseline_counts_the_same_tokens_as_our_loop():
    torch.set_num_threads(1)
    runner = Runner("demo", "vanilla")
    samples = bench.make_samples("synthvid_caption", 2)
    out = bench.hf_generate_baseline(runner, samples, max_new_tokens=48)
    ours = sum(len(runner.generate(s["prompt"], [s["video"]], 48).tokens) for s in samples)
    assert out["tokens"] == out["ours_tokens"] == ours > 0  # greedy on both sides, EOS not counted
    assert out["ratio"] == (out["ours_tokens"] / out["ours_seconds"]) / (out["tokens"] / out["seconds"])
