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


def test_restyled_demo_draft_words_things_differently_and_lvspec_keeps_the_facts():
    """The shipped demo-draft-restyled (the draft fine-tuned on another phrasing style): SpecVLM
    stays token-identical to vanilla with it; LVSpec loosely accepts some of its wording, only at
    tokens below the relevance threshold, and states the same visual facts as vanilla."""
    from judges.oracle import score_caption

    torch.set_num_threads(1)
    vanilla = Runner("demo", "vanilla")
    kw = dict(draft="demo-draft-restyled", target_backend=vanilla.target)
    specvlm, lvspec = Runner("demo", "specvlm", **kw), Runner("demo", "lvspec", **kw)
    threshold = lvspec.verifier.threshold
    loose = 0
    for s in bench.make_samples("synthvid_caption", 3):
        base = vanilla.generate(s["prompt"], [s["video"]], 64)
        assert specvlm.generate(s["prompt"], [s["video"]], 64).tokens == base.tokens
        out = lvspec.generate(s["prompt"], [s["video"]], 64)
        picked = [r for k, r in zip(out.kinds, out.relevance) if k == "loose"]
        assert all(r < threshold for r in picked)
        loose += len(picked)
        facts = score_caption(out.text, s["scene"]), score_caption(base.text, s["scene"])
        assert facts[0]["visual_correct"] == facts[1]["visual_correct"]
    assert loose > 0


def test_paired_timing_decodes_vanilla_beside_each_request_in_alternating_order(monkeypatch):
    from lvspec_eval import runner as runner_module

    torch.set_num_threads(1)
    vanilla = Runner("demo", "vanilla", paired_timing=True)
    sd_tree = Runner("demo", "sd_tree", draft="demo-draft", paired_timing=True, target_backend=vanilla.target)
    s = bench.make_samples("synthvid_caption", 1)[0]
    assert vanilla.baseline is None and "vanilla_decode_s" not in vanilla.generate(s["prompt"], [s["video"]], 8).stats
    order, real = [], runner_module.loop.generate
    monkeypatch.setattr(runner_module.loop, "generate",
                        lambda backend, drafter, *rest: order.append(drafter.name) or real(backend, drafter, *rest))
    first, second = (sd_tree.generate(s["prompt"], [s["video"]], 32).stats for _ in range(2))
    assert order == [sd_tree.drafter.name, "none", "none", sd_tree.drafter.name]  # who goes first alternates
    for rec in (first, second):  # sd_tree is lossless: vanilla beside it said the same
        assert rec["vanilla_tokens"] == rec["tokens"] and rec["vanilla_num_new_tokens"] == rec["num_new_tokens"]
        assert rec["vanilla_decode_s"] > 0 and rec["vanilla_e2e_s"] >= rec["vanilla_decode_s"]


def test_fact_errors_count_what_vanilla_had_right_and_the_method_lost():
    from lvspec_eval.demo import world

    scene = world.make_scene(4)
    caption = world.make_caption(scene, seed=1)
    colour = scene.objects[0].colour
    wrong = caption.replace(colour, next(c for c in world.COLOURS if c != colour), 1)
    samples = [{"scene": scene, "answer": None}, {"scene": scene, "answer": "B"},
               {"scene": scene, "answer": None}]
    base = [{"text": caption, "quality": 1.0}, {"text": "B", "quality": 1.0}, {"text": caption, "quality": 1.0}]
    recs = [{"text": wrong, "quality": 0.9}, {"text": "C", "quality": 0.0},
            {"text": "", "quality": 0.0, "error": "video unreadable"}]  # a failed sample is left out
    lost, right = bench.fact_errors(samples, recs, base)
    n_facts = 2 + 4 * len(scene.objects)  # count, background, colour/shape/size/motion of each object
    assert (lost, right) == (1 + 1, n_facts + 1)
    assert bench.fact_errors(samples, base, base) == (0, 2 * n_facts + 1)  # nothing lost against itself
