"""FLy and LVSpec end to end on a tiny random Qwen2.5-VL target and draft (CPU, fp32).

Invariants: with their loose rules switched off, both are token-identical to vanilla greedy;
with them on, runs complete and every committed token says how it got there. A PST step leaves
tokens without KV entries (pending): the first token of the next step must still be the target's
greedy choice given everything committed, which a full recompute checks.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from judges.oracle import correct_facts
from lvspec_eval.measure import sweep
from lvspec_eval.backends.base import Backend
from lvspec_eval.backends.qwen2_5_vl import QwenVLBackend
from lvspec_eval.backends.qwen_vision import VisionPreprocessConfig
from lvspec_eval.decoding import loop, methods, tree
from lvspec_eval.decoding.types import EXACT, LOOSE, PST, TARGET
from lvspec_eval.demo import models, world

TOKENIZER = Path(models.__file__).parent / "checkpoints" / "tokenizer"
MAX_NEW = 24


def _random_backend(tokenizer, config, seed: int) -> Backend:
    """A random model whose logits are well separated (large init), so greedy choices are stable."""
    for cfg in (config, config.text_config, config.vision_config):
        cfg.initializer_range = 0.2
    torch.manual_seed(seed)
    model = Qwen2_5_VLForConditionalGeneration(config).float().eval()
    pre = VisionPreprocessConfig(min_pixels=models.DEMO_PREPROCESS.min_pixels,
                                 max_pixels=models.DEMO_PREPROCESS.max_pixels)
    return QwenVLBackend(model, tokenizer, "cpu", pre)


@pytest.fixture(scope="module")
def pair():
    torch.set_num_threads(1)
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    target = _random_backend(tokenizer, models.target_config(tokenizer), seed=0)
    draft = _random_backend(tokenizer, models.draft_config(tokenizer), seed=1)
    return target, draft


@pytest.fixture(scope="module")
def video():
    scene = world.make_scene(7)
    return [(world.render(scene, models.FRAMES, models.FRAME_SIZE, models.FRAME_SIZE), models.FPS)]


def run(pair, video, method: str, options: dict | None = None, drafter_backend: str = "draft"):
    target, draft = pair
    spec = methods.resolve(method)
    opts = methods.make_options(spec, options or {})
    drafter, verifier = methods.build(spec, opts, draft if drafter_backend == "draft" else None, target)
    return loop.generate(target, drafter, verifier, world.CAPTION_PROMPT, video, MAX_NEW)


@pytest.fixture(scope="module")
def vanilla(pair, video):
    return run(pair, video, "vanilla")


def test_lvspec_strict_everywhere_without_pst_equals_vanilla(pair, video, vanilla):
    out = run(pair, video, "lvspec", {"lv_threshold": -1.0, "pst": "off", "lv_lambda": 0.0})
    assert out.tokens == vanilla.tokens
    assert set(out.kinds) <= {EXACT, TARGET}
    assert all(r is None or -1.0 <= r <= 1.0 for r in out.relevance)


@pytest.mark.parametrize("method", ["specvlm", "lvspec"])
def test_records_name_the_draft_token_the_target_overruled(pair, video, vanilla, method):
    out = run(pair, video, method)
    assert len(out.replaced) == len(out.tokens)
    assert all(r is None for r in vanilla.replaced)  # vanilla drafts nothing
    assert all(r is None for r, k in zip(out.replaced, out.kinds) if k != TARGET)
    overruled = [(r, t) for r, t, k in zip(out.replaced, out.tokens, out.kinds) if k == TARGET and r is not None]
    assert overruled  # a random draft is overruled often
    assert all(r != t for r, t in overruled)  # no child of the last accepted node carried the target's token


def test_best_child_is_the_highest_scored():
    parents = torch.tensor([-1, -1, 0, 0, 0])
    scores = torch.tensor([-2.0, -1.0, -3.0, -2.5, -2.9])
    assert [tree.best_child(parents, scores, n) for n in (-1, 0, 1, 4)] == [1, 3, None, None]
    assert tree.best_child(parents, None, 0) == 2  # unknown scores: the first child
    assert tree.best_child(torch.zeros(0, dtype=torch.long), None, -1) is None  # an empty draft


def test_fly_with_infinite_entropy_threshold_equals_vanilla(pair, video, vanilla):
    out = run(pair, video, "fly", {"fly_entropy": float("inf"), "fly_k": 6})
    assert out.tokens == vanilla.tokens
    assert set(out.kinds) <= {EXACT, TARGET}


def _first_tokens_are_greedy(backend: Backend, video, out) -> None:
    """Each step's first committed token (unless LOOSE) is the target's choice after the prefix."""
    inputs = backend.prepare(world.CAPTION_PROMPT, video)
    state, first = backend.prefill(inputs)
    gen = out.tokens
    n = len(gen)
    logits, _ = backend.forward(state, torch.tensor(gen), torch.arange(n),
                                torch.tril(torch.ones(n, n, dtype=torch.bool)))
    greedy = [int(first.argmax())] + logits.argmax(-1).tolist()  # greedy[i]: choice after gen[:i]
    start = 1
    for step in out.stats.steps:
        if start < n and out.kinds[start] != LOOSE:
            assert gen[start] == greedy[start], f"step starting at token {start}"
        start += step.num_accepted + 1


def test_loose_runs_complete_and_report_kinds(pair, video, vanilla):
    target, _ = pair
    # fixed trees: the adaptive default may stop drafting a random draft (timing-dependent)
    blind = run(pair, video, "lvspec", {"lv_relevance": "off", "lv_lambda": 0.0, "pst": "off", "tree": "dynamic"})
    assert LOOSE in blind.kinds  # a random draft is wrong often; accept-all takes it anyway
    assert blind.stats.num_new_tokens == len(blind.tokens) <= MAX_NEW
    assert all(r is None for r in blind.relevance)
    fly = run(pair, video, "fly", {"fly_entropy": 0.0, "fly_window": 1, "fly_k": 4, "tree": "chain"})
    assert set(fly.kinds) <= {EXACT, LOOSE, TARGET} and len(fly.kinds) == len(fly.tokens)
    for out in (blind, fly):
        _first_tokens_are_greedy(target, video, out)


def test_pst_steps_refeed_their_tokens_correctly(pair):
    target, _ = pair
    seen_pst = False
    for seed in (7, 3, 11, 19, 23, 31):  # a random draft's wide tree holds the target's token deeper
        scene = world.make_scene(seed)  # down on some videos, not all: run until PST has fired
        video = [(world.render(scene, models.FRAMES, models.FRAME_SIZE, models.FRAME_SIZE), models.FPS)]
        out = run(pair, video, "lvspec", {"lv_threshold": -1.0, "pst_window": 3, "pst_confirm": 0, "tree": "dynamic"})
        assert len(out.kinds) == len(out.tokens) and set(out.kinds) <= {EXACT, PST, TARGET}
        _first_tokens_are_greedy(target, video, out)
        if PST in out.kinds:
            seen_pst = True
            break
    assert seen_pst


def test_lvspec_without_video_runs_with_zero_relevance(pair):
    out = run(pair, [], "lvspec", {"lv_lambda": 0.0, "pst": "off"})
    assert out.stats.visual_tokens == 0 and len(out.tokens) > 0
    assert {r for r, k in zip(out.relevance, out.kinds) if k != TARGET} <= {0.0}


# ---- the sweep's pure parts ----------------------------------------------------------------------

def test_sweep_settings_vary_one_axis_at_a_time_or_all():
    base = {"lv_threshold": "auto", "lv_lambda": 0.3}
    axes = {"lv_lambda": [0.1, 0.3], "pst_window": [0]}
    runs = sweep.make_settings(base, axes, "axes", [{"lv_relevance": "off"}])
    assert runs == [base, {**base, "lv_lambda": 0.1}, {**base, "pst_window": 0}, {**base, "lv_relevance": "off"}]
    assert [sweep.setting_name(r, base) for r in runs] == ["base", "lv_lambda=0.1", "pst_window=0", "lv_relevance=off"]
    assert len(sweep.make_settings(base, axes, "grid", [])) == 2
    with pytest.raises(ValueError, match="lv_lambda=2"):
        sweep.make_settings(base, {"lv_lambda": [2]}, "axes", [])


def test_sweep_auto_threshold_comes_from_the_probe():
    key = sweep.probe_key({"lv_layer": 2})
    calibration = {key: {"threshold": 0.6}}
    assert sweep.resolve_auto({"lv_layer": 2, "lv_threshold": "auto-0.1"}, calibration)["lv_threshold"] == 0.5
    assert sweep.resolve_auto({"lv_threshold": 0.2}, {}) == {"lv_threshold": 0.2}
    with pytest.raises(ValueError, match="no threshold"):
        sweep.resolve_auto({"lv_layer": 4, "lv_threshold": "auto"}, calibration)


def test_sweep_table_says_which_draft_and_drafter_settings_it_ran():
    row = {c: 1.0 for c in ("est_speedup", "decode_speedup", "tau", "caption_f1", "caption_retention", "mcq_accuracy",
                            "mcq_retention", "loose_share", "pst_share", "exact_match_rate")}
    result = {"model": "demo", "draft": "demo-draft-restyled", "tree": {"tree": "chain", "tree_depth": 10},
              "limit": 2, "max_new_tokens": 8, "base": {"lv_lambda": 0.1}, "settings": {}, "auto": [],
              "rows": {"base": {**row, "facts_lost": 0, "pareto": True}}, "relevance_probe": {}}
    head = sweep.format_markdown(result).splitlines()[0]
    assert "target demo, draft demo-draft-restyled (tree=chain, tree_depth=10)" in head
    assert "(the drafter's defaults)" in sweep.format_markdown({**result, "tree": {}})


def test_sweep_scores_facts_separation_and_pareto():
    scene = world.make_scene(3)
    right = correct_facts(world.make_caption(scene), scene)
    assert {"count", "background", "object0.colour", "object0.shape"} <= right
    assert sweep.separation([0.9, 0.8], [0.1, 0.2])["auc"] == 1.0
    assert sweep.separation([0.5], [0.5])["auc"] == 0.5
    rows = {"a": {"est_speedup": 1.0, "retention": 1.0}, "b": {"est_speedup": 2.0, "retention": 0.9},
            "c": {"est_speedup": 1.5, "retention": 0.8}}
    sweep.mark_pareto(rows)
    assert [n for n, r in rows.items() if r["pareto"]] == ["a", "b"]


def test_model_drafter_proposes_the_same_tree_twice_without_a_commit(pair, video):
    import time

    target, draft = pair
    spec = methods.resolve("sd_tree")
    drafter, _ = methods.build(spec, methods.make_options(spec, {}), draft, target)
    inputs = target.prepare(world.CAPTION_PROMPT, video)
    inputs.extra["request"] = (world.CAPTION_PROMPT, video)
    state, logits = target.prefill(inputs, visual_attention=drafter.needs_visual_attention)
    drafter.start(target, inputs, state, time.perf_counter)
    generated = [int(logits.argmax())]
    first, again = drafter.propose(generated), drafter.propose(generated)
    assert first.tokens.tolist() == again.tokens.tolist() and first.parents.tolist() == again.parents.tolist()
