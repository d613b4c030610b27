"""Every method on a hybrid linear-attention model (a tiny Qwen3.5), beyond the exact ones that
tests/test_lossless.py sweeps: FLy and LVSpec with their loose rules switched off are exact, so
they must give vanilla's tokens (their chains and PST re-feeds roll the Gated DeltaNet state back
to a prefix of a path); with their rules on they run and label every token. Pruned drafts keep
fewer video tokens in their own recurrent state (the state never reads the dropped ones)."""
from __future__ import annotations

import numpy as np
import pytest

from lvspec_eval.decoding import loop, methods


def _video(seed=0, t=4, h=64, w=96):
    return [(np.random.default_rng(seed).integers(0, 256, size=(t, h, w, 3), dtype=np.uint8), 2.0)]


def _run(backend, draft, method: str, videos, options=None, max_new=12):
    spec = methods.resolve(method)
    drafter, verifier = methods.build(spec, methods.make_options(spec, options or {}), draft, backend)
    return loop.generate(backend, drafter, verifier, "describe the video", videos, max_new)


@pytest.mark.parametrize("method,options", [
    ("fly", {"fly_entropy": float("inf"), "fly_k": 5}),  # loose rules off: a mismatch is never salvaged
    ("lvspec", {"lv_threshold": -1.0, "pst": "off", "lv_lambda": 0.0}),  # every token an anchor: strict
])
def test_loose_methods_with_their_rules_off_equal_vanilla(qwen3_5_family, method, options):
    videos = _video(8)
    want = _run(qwen3_5_family.target, None, "vanilla", videos).tokens
    for draft in (qwen3_5_family.draft, None):
        assert _run(qwen3_5_family.target, draft, method, videos, options).tokens == want


@pytest.mark.parametrize("method", ["fly", "lvspec"])
def test_loose_methods_run_with_their_rules_on(qwen3_5_family, method):
    out = _run(qwen3_5_family.target, qwen3_5_family.draft, method, _video(9))
    assert len(out.tokens) > 0 and len(out.kinds) == len(out.tokens)


def test_pruned_draft_keeps_fewer_video_tokens(qwen3_5_family):
    out = _run(qwen3_5_family.target, qwen3_5_family.draft, "specvlm", _video(3),
               {"prune_ratio": 0.5, "tree": "chain", "tree_depth": 3})  # a fixed tree: prepared eagerly
    assert out.stats.kept_visual_tokens < out.stats.visual_tokens
    assert out.tokens == _run(qwen3_5_family.target, None, "vanilla", _video(3)).tokens
