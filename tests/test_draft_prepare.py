"""The draft is prepared only when drafting will pay (issue 29): a one-token answer costs no
draft-side work at all (no draft vision tower, no draft prefill, no token selection), whatever the
drafter; `draft_prepare=eager` (the fixed trees' default) keeps preparing it at the start. The
draft's vision tower is skipped when it is the target's up to its merger (the demo pair)."""
from __future__ import annotations

import pytest
import torch

from lvspec_eval.backends.loading import load_backend
from lvspec_eval.decoding import loop, methods
from lvspec_eval.decoding.drafters.sparrow import SparrowHead
from lvspec_eval.demo import models, world

CASES = [("sd_tree", "std"), ("sd_tree", "self"), ("specvlm", "std"), ("specvlm", "self"), ("sparrow", None)]


class Calls:
    """Counts calls of a backend's draft-side entry points (instance attributes shadow the methods)."""

    def __init__(self, monkeypatch, backend, names=("prefill", "input_embeds")):
        self.counts = dict.fromkeys(names, 0)
        for name in names:
            real = getattr(backend, name)

            def counted(*args, _real=real, _name=name, **kwargs):
                self.counts[_name] += 1
                return _real(*args, **kwargs)

            monkeypatch.setattr(backend, name, counted)


def _decode(family, method, draft, options, case, max_new_tokens, tmp_path):
    spec = methods.resolve(method)
    if method == "sparrow":
        torch.manual_seed(0)
        SparrowHead.for_target(family.target).save(tmp_path / "head")
        options = {**options, "sparrow_head": str(tmp_path / "head")}
    drafter, verifier = methods.build(spec, methods.make_options(spec, options),
                                      family.draft if draft == "std" else None, family.target)
    heads = []
    if method == "sparrow":  # the head's forwards are its preparation and its drafting
        drafter.head.register_forward_hook(lambda *_: heads.append(1))
    out = loop.generate(family.target, drafter, verifier, case.prompt, case.videos, max_new_tokens)
    return out, heads


@pytest.mark.parametrize("options", [{}, {"tree": "dynamic", "draft_prepare": "lazy"}], ids=["adaptive", "lazy"])
@pytest.mark.parametrize("method,draft", CASES)
@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_onevision"], indirect=True)
def test_a_one_token_answer_prepares_no_draft(family, make_case, method, draft, options, monkeypatch, tmp_path):
    case = make_case(5, family.max_side)
    target, draft_calls = Calls(monkeypatch, family.target), Calls(monkeypatch, family.draft)
    out, heads = _decode(family, method, draft, options, case, 1, tmp_path)
    assert len(out.tokens) <= 1
    assert draft_calls.counts == {"prefill": 0, "input_embeds": 0}  # the separate draft: untouched
    assert target.counts == {"prefill": 1, "input_embeds": 1}  # the target's one prefill, nothing for Self-SD
    assert heads == []
    s = out.stats
    assert s.draft_prepared_at is None and s.draft_prepare_s == s.prune_s == s.draft_prefill_s == 0.0
    assert s.e2e_s >= s.preprocess_s + s.prefill_s + s.decode_s


@pytest.mark.parametrize("method,draft", CASES)
@pytest.mark.parametrize("family", ["qwen2_5_vl"], indirect=True)
def test_eager_preparation_still_prepares_at_the_start(family, make_case, method, draft, monkeypatch, tmp_path):
    """The counters above can fail: with draft_prepare=eager the same request prepares the draft."""
    case = make_case(5, family.max_side)
    target, draft_calls = Calls(monkeypatch, family.target), Calls(monkeypatch, family.draft)
    out, heads = _decode(family, method, draft, {"tree": "dynamic"}, case, 1, tmp_path)
    assert out.stats.draft_prepared_at == 0 and out.stats.draft_prepare_s > 0
    if draft == "std":
        assert draft_calls.counts == {"prefill": 1, "input_embeds": 1}
    elif method == "sparrow":
        assert heads
    else:
        assert target.counts == {"prefill": 2, "input_embeds": 1}  # Self-SD reuses the target's embeddings


def test_the_demo_draft_embeds_the_video_from_the_targets_tower(qwen_family):
    """The demo draft's vision blocks are a frozen copy of the target's: its tower does not run again,
    only its merger, on the target's trunk output, and the embeddings are the same bit for bit."""
    torch.set_num_threads(1)
    target, draft = load_backend("demo"), load_backend("demo-draft")
    assert draft.shares_vision_trunk(target)
    assert not qwen_family.draft.shares_vision_trunk(qwen_family.target)  # random towers: each runs its own
    spec = methods.resolve("sd_tree")
    methods.build(spec, methods.make_options(spec, {}), draft, target)  # the drafter asks the target to keep it
    assert target.keep_vision_trunk
    frames = world.render(world.make_scene(3), models.FRAMES, models.FRAME_SIZE, models.FRAME_SIZE)
    inputs = target.prepare(world.CAPTION_PROMPT, [(frames, models.FPS)])
    with torch.no_grad():
        target.input_embeds(inputs)
        shared = draft.adopt_inputs(inputs, target)
        blocks = []
        handle = draft.model.model.visual.blocks[0].register_forward_hook(lambda *_: blocks.append(1))
        reused = draft.input_embeds(shared)
        assert blocks == []
        shared.extra.pop("vision_trunk")
        own = draft.input_embeds(shared)
        handle.remove()
    assert blocks and torch.equal(reused, own)
