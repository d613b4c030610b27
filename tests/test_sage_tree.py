"""SAGE's entropy-driven tree (decoding/sage_tree.py) on hand-made logits (no model)."""
import math

import pytest
import torch

from lvspec_eval.decoding import methods, tree
from lvspec_eval.decoding.drafters.growth import TreePlanner
from lvspec_eval.decoding.sage_tree import SageShape, SageTree, confidence
from lvspec_eval.decoding.types import Verdict

VOCAB = 30


def _logits(probs: dict[int, float]) -> torch.Tensor:
    """[VOCAB] logits whose softmax puts `probs` on the given tokens and spreads the rest evenly."""
    rest = (1.0 - sum(probs.values())) / (VOCAB - len(probs))
    p = torch.full((VOCAB,), rest)
    for t, q in probs.items():
        p[t] = q
    return p.log()


def test_confidence_is_one_for_a_sure_draft_and_zero_for_a_flat_one():
    assert confidence(torch.zeros(VOCAB), 10) == pytest.approx(0.0, abs=1e-6)
    assert confidence(_logits({3: 1.0 - 1e-9}), 10) == pytest.approx(1.0, abs=1e-6)
    half = _logits({3: 0.5, 4: 0.5})  # top-10 renormalised: two halves and eight near-zeros
    assert confidence(half, 10) == pytest.approx(1 - math.log(2) / math.log(10), abs=1e-3)


def test_depth_and_width_follow_the_confidence():
    sage = SageTree()
    sage.alpha = 1.0
    assert sage.next_shape()[0] == SageShape(8, 2)  # sure: deep and narrow
    sage.alpha = 0.0
    assert sage.next_shape()[0] == SageShape(3, 10)  # unsure: shallow and wide
    sage.alpha = 0.5
    assert sage.next_shape()[0] == SageShape(6, 6)  # 5.5 rounds half up


def test_d_max_moves_with_the_mean_accepted_length_within_bounds():
    sage = SageTree()
    for _ in range(9):
        sage.observe(1)
    assert sage.d_max == 8  # the window is not full yet
    sage.observe(1)
    assert sage.d_max == 7  # mean 1 < 2: one lower
    for _ in range(20):
        sage.observe(0)
    assert sage.d_max == 3  # never below D_min
    for _ in range(30):
        sage.observe(5)
    assert sage.d_max == 8  # mean 5 > 3: back up, never above the cap


def _fake_feed(calls, per_depth):
    """A drafter whose logits depend only on the depth fed; records (tokens, visible, parent_rows)."""
    def feed(tokens, visible, parent_rows, depth):
        calls.append((tokens.tolist(), visible.clone(), parent_rows.tolist(), depth))
        return per_depth[depth][None].expand(tokens.numel(), -1)
    return feed


def test_growth_counts_expansion_and_visibility():
    sage = SageTree()
    root = _logits({5: 0.6, 6: 0.3})  # alpha measured here is for the next step
    per_depth = {1: _logits({7: 0.9}), 2: _logits({8: 0.9})}
    calls = []
    draft = sage.grow(SageShape(3, 2), {}, root, _fake_feed(calls, per_depth))
    # depth 1: round(2 x 1.5) = 3 children of the root: 5 (0.6), 6 (0.3), and a 1/280 token
    assert draft.tokens[:3].tolist()[:2] == [5, 6] and draft.parents[:3].tolist() == [-1, -1, -1]
    # threshold at depth 1 is 0.1 x 1 / 3: nodes 0 and 1 are grown, the third is a leaf
    assert calls[0][0] == [5, 6] and calls[0][2] == [-1, -1] and calls[0][3] == 1
    # depth 2: node 0 (P 0.6) gets round(2 / 2 x 1.1) = 1 child, node 1 (P 0.3) round(0.8) = 1
    assert draft.tokens[3:5].tolist() == [7, 7] and draft.parents[3:5].tolist() == [0, 1]
    # depth 2 threshold 0.2 / 3: paths 0.54 and 0.27 both grow; each fed node sees its parent
    _, visible, parent_rows, depth = calls[1]
    assert parent_rows == [0, 1] and depth == 2
    assert visible.tolist() == [[True, False, True, False], [False, True, False, True]]
    assert draft.tokens[5:].tolist() == [8, 8] and draft.parents[5:].tolist() == [3, 4]
    assert draft.depth == 3 and len(calls) == 2  # the last level is not fed
    tree.validate(draft.parents)
    assert draft.probs[0].item() == pytest.approx(0.6, rel=1e-5)
    assert draft.scores[5].item() == pytest.approx(math.log(0.6 * 0.9 * 0.9), rel=1e-5)
    assert sage.alpha == pytest.approx(confidence(root, 10))


def test_node_cap_keeps_the_likeliest():
    sage = SageTree(max_nodes=4)
    root = _logits({1: 0.4, 2: 0.3, 3: 0.2, 4: 0.05})
    draft = sage.grow(SageShape(3, 10), {}, root, _fake_feed([], {}))  # 15 candidates, 4 kept, none fed
    assert draft.tokens.tolist() == [1, 2, 3, 4] and draft.num_nodes == 4


def test_planner_uses_sage_and_feeds_it_accepted_lengths():
    spec = methods.resolve("sage")
    options = methods.make_options(spec, {"draft_when": "always"})  # SAGE's own schedule: every step drafts
    assert spec.drafter == "pruned" and spec.verifier == "exact" and options.tree == "sage"
    planner = TreePlanner(options.tree_config(), torch.device("cpu"))
    shape, plan = planner.next_shape(0)
    assert shape == SageShape(6, 6) and plan["alpha"] == 0.5

    class Step:
        num_draft_nodes = 3

    for _ in range(10):
        planner.observe(Verdict(tokens=[1, 2, 3, 4, 5], path=[0, 1, 2, 3], num_cached=4, kinds=[]), None, Step())
    assert planner.sage.d_max == 8  # mean 4 > 3, already at the cap
    planner.sage.d_max = 5
    planner.observe(Verdict(tokens=[1, 2, 3, 4, 5], path=[0, 1, 2, 3], num_cached=4, kinds=[]), None, Step())
    assert planner.sage.d_max == 6
