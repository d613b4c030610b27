"""What a draft step costs, and on what: SpecVLM's pruned draft runs on the pruned video for the
whole decode, and the figure that compares draft steps counts only the steps that drafted.

What makes SpecVLM's draft step cheaper than SD-Tree's at long video is that every draft forward
(the refeed of committed tokens and each tree level) attends over a KV cache that holds only the
kept video tokens. These tests spy on the draft backend's forward during a real SpecVLM run
(tiny random-weight models of both families, a fixed tree so that the draft runs every step) and
check the cache it runs over: its committed length, and the length of every layer's key and
value tensors, which must be the kept count plus the text, never the full video.
"""
from __future__ import annotations

import pytest
import torch

from lvspec_eval.measure import bench
from lvspec_eval.decoding import loop, methods
from lvspec_eval.decoding.stats import SampleStats
from lvspec_eval.decoding.types import StepStats

TREE = {"tree": "dynamic", "tree_depth": 3, "tree_topk": 2, "tree_total": 6}
MAX_NEW_TOKENS = 8


def _run_with_spy(family, case, method: str, monkeypatch) -> tuple[loop.Output, list[dict]]:
    """Decode `case` with `method` and the family's separate draft; record, before each draft
    forward, the committed cache length and every layer's key/value length."""
    seen: list[dict] = []
    original = family.draft.forward

    def spy(state, tokens, pos_offsets, visible, hidden_layers=()):
        lengths = {t.shape[-2] for layer in state.cache.layers for t in (layer.keys, layer.values)}
        seen.append({"cache_len": state.cache_len, "temp_len": state.temp_len, "kv_lengths": lengths,
                     "num_tokens": tokens.numel()})
        return original(state, tokens, pos_offsets, visible, hidden_layers)

    monkeypatch.setattr(family.draft, "forward", spy)
    spec = methods.resolve(method)
    drafter, verifier = methods.build(spec, methods.make_options(spec, dict(TREE)), family.draft, family.target)
    out = loop.generate(family.target, drafter, verifier, case.prompt, case.videos, MAX_NEW_TOKENS)
    return out, seen


def _video_case(family, make_case):
    """A request with enough visual tokens that pruning 90% of them leaves a clearly shorter cache."""
    for seed in range(40):
        case = make_case(seed, family.max_side, max_frames=8)
        if family.target.prepare(case.prompt, case.videos).num_visual_tokens >= 20:
            return case
    pytest.skip("no random case with 20+ visual tokens")


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_onevision"], indirect=True)
def test_every_pruned_draft_forward_runs_over_the_kept_tokens_only(family, make_case, monkeypatch):
    out, seen = _run_with_spy(family, _video_case(family, make_case), "specvlm", monkeypatch)
    st = out.stats
    assert st.kept_visual_tokens == max(1, int(st.visual_tokens * 0.1 + 1e-9)) < st.visual_tokens
    pruned_prompt = st.prompt_tokens - st.visual_tokens + st.kept_visual_tokens
    assert seen, "the draft never ran"
    # The first draft forward follows the draft's prefill: its cache holds the pruned prompt.
    assert seen[0]["cache_len"] == pruned_prompt
    for call in seen:
        # committed entries: the pruned prompt plus generated tokens already fed (never the full video)
        assert pruned_prompt <= call["cache_len"] < pruned_prompt + MAX_NEW_TOKENS
        # and the tensors are that long: temporary tree entries are dropped after each proposal
        assert call["kv_lengths"] == {call["cache_len"] + call["temp_len"]}


@pytest.mark.parametrize("family", ["qwen2_5_vl"], indirect=True)
def test_full_video_draft_runs_over_the_whole_prompt(family, make_case, monkeypatch):
    """The contrast the pruned draft is measured against: SD-Tree's draft holds every video token."""
    out, seen = _run_with_spy(family, _video_case(family, make_case), "sd_tree", monkeypatch)
    assert seen and seen[0]["cache_len"] == out.stats.prompt_tokens
    assert all(call["kv_lengths"] == {call["cache_len"] + call["temp_len"]} for call in seen)


def test_draft_cost_per_draft_counts_only_the_steps_that_drafted():
    """An adaptive policy drafts on some steps only. draft_step_ms (a mean over every step) then
    mostly says how often a method drafts; draft_ms_per_draft is what one draft costs. Here method
    a drafts on 1 step in 4 at 8 ms, b on every step at 4 ms: b's draft is the cheaper one."""
    def record(steps):
        steps = [StepStats(*s) for s in steps]
        stats = SampleStats(decode_s=1.0, e2e_s=1.2, num_new_tokens=8, steps=steps, draft_s=sum(s.draft_s for s in steps),
                            verify_s=sum(s.verify_s for s in steps))
        return dict(stats.to_dict(), tokens=[1], quality=None)

    a = record([(0, 0, 0.001, 0.02)] * 3 + [(4, 0, 0.008, 0.03)])
    b = record([(4, 0, 0.004, 0.03)] * 4)
    base = record([(0, 0, 0.0, 0.02)] * 4)
    samples = [{"id": 0, "scene": None, "answer": None}]
    rows = {name: bench.summarise(name, [rec], [base], samples) for name, rec in (("a", a), ("b", b))}
    assert rows["a"]["draft_step_ms"] < rows["b"]["draft_step_ms"]  # 2.75 vs 4: the misleading mean
    assert rows["a"]["draft_ms_per_draft"] == pytest.approx(8.0)
    assert rows["b"]["draft_ms_per_draft"] == pytest.approx(4.0)
    table = bench.format_table({"task": "synthvid_caption", "methods": rows})
    assert all(c in table for c in ("draft_ms_per_draft", "draft_share", "e2e_speedup_total", "draft_prepare_ms"))
    # the draft's share of the decode time: a drafts 0.011 s of its 1 s, b 0.016 s
    assert rows["a"]["draft_share"] == pytest.approx(0.011) and rows["b"]["draft_share"] == pytest.approx(0.016)
    assert rows["a"]["e2e_speedup_total"] == pytest.approx(1.0)  # every record above waited 1.2 s
