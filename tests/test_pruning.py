"""SpecVLM's two-stage pruning on hand-made attention scores."""
import pytest
import torch

from lvspec_eval.decoding.pruning import PruneConfig, select_visual_tokens


def test_stage_one_takes_top_mass_then_stage_two_is_uniform():
    scores = torch.zeros(20)
    scores[1], scores[7] = 5.0, 2.0
    scores[2:5] = 1.0
    kept = select_visual_tokens(scores, PruneConfig(ratio=0.8, lam=0.4))
    # K = 4; stage I: token 1 alone holds 5/10 >= 0.4 of the mass; stage II: 3 evenly spaced of the rest
    assert kept.tolist() == [0, 1, 10, 19]


def test_stage_one_capped_at_budget():
    scores = torch.ones(10)
    kept = select_visual_tokens(scores, PruneConfig(ratio=0.8, lam=1.0))
    assert kept.numel() == 2


def test_keeps_at_least_one_and_sorted():
    kept = select_visual_tokens(torch.rand(7), PruneConfig(ratio=0.99, lam=0.4))
    assert kept.numel() == 1
    kept = select_visual_tokens(torch.rand(100), PruneConfig())
    assert kept.numel() == 10 and torch.all(kept[1:] > kept[:-1])


@pytest.mark.parametrize("ratio,lam", [(1.0, 0.4), (-0.1, 0.4), (0.9, 1.5)])
def test_invalid_config(ratio, lam):
    with pytest.raises(ValueError):
        PruneConfig(ratio=ratio, lam=lam)
