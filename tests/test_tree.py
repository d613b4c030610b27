"""Tree helpers, tree shapes and the exact verifier on hand-built tensors (no model)."""
import pytest
import torch

from lvspec_eval.decoding import tree
from lvspec_eval.decoding.types import Draft, Scores
from lvspec_eval.decoding.verifiers.exact import ExactVerifier

# root -> 0 (a) -> 2 (c) -> 3 (d)
#      -> 1 (b)
PARENTS = torch.tensor([-1, -1, 0, 2])


def test_depths_and_ancestors():
    assert tree.depths(PARENTS).tolist() == [1, 1, 2, 3]
    anc = tree.ancestor_mask(PARENTS)
    assert anc[3].tolist() == [True, False, True, True]
    assert anc[1].tolist() == [False, True, False, False]


def test_parents_must_precede_children():
    with pytest.raises(ValueError, match="parents must precede"):
        tree.validate(torch.tensor([1, -1]))


def test_pending_layout_offsets_and_visibility():
    offsets, visible = tree.pending_and_tree_layout(2, PARENTS)
    # two pending tokens at offsets 0, 1; the root is the second, so depth d sits at 1 + d
    assert offsets.tolist() == [0, 1, 2, 2, 3, 4]
    assert visible[0].tolist() == [True, False, False, False, False, False]
    assert visible[5].tolist() == [True, True, True, False, True, True]


def test_path_and_children():
    assert tree.path_to(3, PARENTS) == [0, 2, 3]
    assert tree.children(PARENTS) == [[0, 1], [2], [], [3], []]


def _scores(target_tokens, vocab=10):
    logits = torch.full((len(target_tokens), vocab), -5.0)
    for i, t in enumerate(target_tokens):
        logits[i, t] = 5.0
    return Scores(logits=logits)


def test_exact_accepts_longest_matching_path_and_bonus():
    draft = Draft(tokens=torch.tensor([4, 5, 6, 7]), parents=PARENTS)
    # rows: after root 4 (node 0 matches); after node 0: 6 (node 2 matches); after node 2: 9 (node 3's 7 fails)
    verdict = ExactVerifier().verify(draft, _scores([4, 6, 2, 9, 3]))
    assert verdict.path == [0, 2]
    assert verdict.tokens == [4, 6, 9]
    assert verdict.num_cached == 2 and verdict.num_accepted == 2
    assert verdict.kinds == ["exact", "exact", "target"]


def test_exact_rejects_at_root():
    draft = Draft(tokens=torch.tensor([4, 5, 6, 7]), parents=PARENTS)
    verdict = ExactVerifier().verify(draft, _scores([3, 1, 6, 9, 2]))
    assert verdict.tokens == [3] and verdict.path == [] and verdict.num_accepted == 0


def test_empty_draft_is_one_greedy_step():
    verdict = ExactVerifier().verify(Draft.empty(), _scores([8]))
    assert verdict.tokens == [8]


def test_tree_config_validation():
    with pytest.raises(ValueError, match="tree kind"):
        tree.TreeConfig("bushy")
    with pytest.raises(ValueError, match="tree_depth"):
        tree.TreeConfig("chain", depth=0)
    with pytest.raises(ValueError, match="unknown static tree"):
        tree.TreeConfig("static", choices="nope")


def test_specvlm_static_tree_has_26_nodes_with_root():
    cfg = tree.TreeConfig("static")
    assert len(cfg.choices) == 25 and cfg.depth == 5
    sizes = [sum(1 for c in cfg.choices if len(c) == d) for d in range(1, 6)]
    assert sizes == [4, 8, 8, 3, 2]
    assert all(c[:-1] in cfg.choices or len(c) == 1 for c in cfg.choices)  # closed under prefixes


def test_ancestor_mask_of_a_deep_chain_and_wide_tree():
    # a 40-deep chain needs several squarings; check against the host walk
    chain = tree.chain_parents(40)
    assert tree.ancestor_mask(chain).equal(torch.ones(40, 40, dtype=torch.bool).tril())
    parents = torch.tensor([-1, -1, -1, 0, 0, 3, 5, 1, 7, 6])
    anc = tree.ancestor_mask(parents)
    for i in range(len(parents)):
        assert anc[i].nonzero().flatten().tolist() == sorted(tree.path_to(i, parents))
    assert tree.depths(parents, max_depth=5).tolist() == [1, 1, 1, 2, 2, 3, 4, 2, 3, 5]


def test_shapes_level_sizes():
    eagle = tree.TreeConfig("dynamic", depth=5, topk=10, total=60).shape()
    assert [len(level.rows) for level in eagle.levels] == [10, 100, 100, 100, 100] and eagle.total == 60
    chain = tree.TreeConfig("chain", depth=4).shape()
    assert chain.num_nodes == 4 and chain.total is None
    static = tree.TreeConfig("static").shape()
    assert [len(level.rows) for level in static.levels] == [4, 8, 8, 3, 2]


def test_select_keeps_best_and_their_ancestors():
    from lvspec_eval.decoding.drafters.growth import Nodes, _select
    # node 3 (-0.05) is best, then 0 (-0.1): 3's parent 1 must come along although its value is low
    # (values here need not fall along a path; real ones do, and ties are broken by depth)
    nodes = Nodes(tokens=torch.tensor([5, 6, 7, 8]), parents=torch.tensor([-1, -1, 0, 1]),
                  logp=torch.zeros(4), score=torch.tensor([-0.1, -3.0, -0.2, -0.05]),
                  value=torch.tensor([-0.1, -0.06, -0.2, -0.05]), depth=torch.tensor([1, 1, 2, 2]))
    draft = _select(nodes, 3, 2, None)
    assert draft.tokens.tolist() == [5, 6, 8] and draft.parents.tolist() == [-1, -1, 1]
