"""UV-Prune's scorer (decoding/uv_prune.py) on hand-made hidden states, and through a pruned draft."""
import pytest
import torch

from lvspec_eval.backends.base import Backend
from lvspec_eval.decoding import loop, methods
from lvspec_eval.decoding.pruning import PruneConfig, prune_scores
from lvspec_eval.decoding.uv_prune import uv_layers, uv_scores


def test_scores_are_the_growth_of_similarity_to_the_text_after_the_video():
    # rows: 0 text before the video, 1-3 video, 4-5 the question (mean direction e0)
    e0, e1 = torch.tensor([1.0, 0.0]), torch.tensor([0.0, 1.0])
    h1 = torch.stack([e1, e1, e0, -e0, e0, e0])  # layer l1
    h2 = torch.stack([e1, e0, e0, e1, e0, e0])  # layer l2: token 1 turns to the text, token 3 half way back
    vmask = torch.tensor([False, True, True, True, False, False])
    scores = uv_scores(h1, h2, vmask, visual_end=4)
    # growth: token 1: 1 - 0 = 1; token 2: 1 - 1 = 0; token 3: 0 - (-1) = 1; shifted by the minimum (0)
    assert scores.tolist() == pytest.approx([1.0, 0.0, 1.0])
    # row 0 (before the video) is not the text: with it as the text (e1) token 1 would lose similarity
    h1[4:], h2[4:] = e1, e1
    assert uv_scores(h1, h2, vmask, visual_end=4).tolist() == pytest.approx([0.0, 1.0, 2.0])


def test_text_falls_back_to_all_text_rows_when_the_video_ends_the_prompt():
    h = torch.tensor([[1.0, 0.0], [1.0, 1.0], [0.0, 1.0]])
    scores = uv_scores(h, h, torch.tensor([False, True, True]), visual_end=3)
    assert scores.tolist() == [0.0, 0.0]  # no growth between identical layers


def test_layers_default_and_validation():
    assert uv_layers(8) == (1, 2) and uv_layers(28) == (1, 7) and uv_layers(2) == (1, 2)
    assert uv_layers(28, (3, 9)) == (3, 9)
    with pytest.raises(ValueError, match="prune_uv_layers"):
        uv_layers(8, (4, 4))
    with pytest.raises(ValueError, match="prune_scorer"):
        PruneConfig(scorer="entropy")
    spec = methods.resolve("specvlm")
    assert methods.make_options(spec, {"prune_scorer": "uv", "prune_uv_layers": "2:5"}).prune_config().uv_layers \
        == (2, 5)
    with pytest.raises(ValueError, match="l1:l2"):
        methods.make_options(spec, {"prune_uv_layers": "2"}).prune_config()


def test_a_uv_pruned_draft_reads_no_attention(qwen_family, make_case, monkeypatch):
    """prune_scorer=uv: the target's prefill collects no attention, the draft keeps the tokens the UV
    scores pick, and the answer is vanilla's."""
    target = qwen_family.target
    spec = methods.resolve("specvlm")
    options = methods.make_options(spec, {"prune_scorer": "uv", "tree": "chain", "tree_depth": 3,
                                          "draft_prepare": "eager"})
    drafter, verifier = methods.build(spec, options, None, target)
    assert not drafter.needs_visual_attention and drafter.prefill_layers == uv_layers(target.num_layers)
    picked = {}
    real = prune_scores.__globals__["uv_scores"]

    def spy(*args):
        picked["scores"] = real(*args)
        return picked["scores"]

    monkeypatch.setitem(prune_scores.__globals__, "uv_scores", spy)
    monkeypatch.setattr(Backend, "visual_attention", lambda *a: pytest.fail("uv must not read attention"))
    case = make_case(3, qwen_family.max_side)
    out = loop.generate(target, drafter, verifier, case.prompt, case.videos, 8)
    n = out.stats.visual_tokens
    assert picked["scores"].numel() == n and out.stats.kept_visual_tokens == max(1, int(n * 0.1 + 1e-9))
    vanilla_drafter, vanilla_verifier = methods.build(methods.resolve("vanilla"), methods.DecodeOptions(), None, target)
    assert out.tokens == loop.generate(target, vanilla_drafter, vanilla_verifier, case.prompt, case.videos, 8).tokens


@pytest.mark.parametrize("prepare", ["eager", "lazy"])
@pytest.mark.parametrize("method", ["specvlm", "lvspec"])
def test_uv_layers_are_captured_in_the_prefill_only(qwen_family, make_case, monkeypatch, method, prepare):
    """UV-Prune reads layers l1 and l2 of the target's prefill only (issue 52, item 7): the steps' scoring
    forwards capture no hidden layer for it, only what the verifier reads (LVSpec's relevance layer), also
    where the draft is prepared lazily, after some steps."""
    target = qwen_family.target
    spec = methods.resolve(method)
    options = methods.make_options(spec, {"prune_scorer": "uv", "tree": "chain", "tree_depth": 3,
                                          "draft_prepare": prepare})
    drafter, verifier = methods.build(spec, options, qwen_family.draft, target)
    prefills, steps = [], []
    real_prefill, real_score = Backend.prefill, Backend.score

    def prefill(self, inputs, *args, hidden_layers=(), **kwargs):
        if self is target:
            prefills.append(tuple(hidden_layers))
        return real_prefill(self, inputs, *args, hidden_layers=hidden_layers, **kwargs)

    def score(self, state, draft, hidden_layers=()):
        steps.append(tuple(hidden_layers))
        return real_score(self, state, draft, hidden_layers=hidden_layers)

    monkeypatch.setattr(Backend, "prefill", prefill)
    monkeypatch.setattr(Backend, "score", score)
    case = make_case(3, qwen_family.max_side)
    out = loop.generate(target, drafter, verifier, case.prompt, case.videos, 8)
    assert out.stats.kept_visual_tokens < out.stats.visual_tokens  # the UV scores pruned the draft's video
    assert prefills == [tuple(sorted(set(uv_layers(target.num_layers)) | set(verifier.hidden_layers)))]
    assert steps and all(set(layers) <= set(verifier.hidden_layers) for layers in steps), steps
    vanilla_drafter, vanilla_verifier = methods.build(methods.resolve("vanilla"), methods.DecodeOptions(), None, target)
    if method == "specvlm":  # exact: vanilla's answer
        assert out.tokens == loop.generate(target, vanilla_drafter, vanilla_verifier, case.prompt, case.videos,
                                           8).tokens
