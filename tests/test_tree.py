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
        tree.depths(torch.tensor([1, -1]))


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


class _C:
    def __init__(self, parent, score, rank):
        self.parent, self.score, self.rank = parent, score, rank


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


def test_dynamic_select_keeps_best_and_their_ancestors():
    cfg = tree.TreeConfig("dynamic", depth=3, topk=2, total=2)
    cands = [_C(-1, -0.1, 0), _C(-1, -3.0, 1), _C(0, -0.2, 0), _C(1, -0.05, 0)]
    # best two by score: 3 (-0.05) and 0 (-0.1); 3's parent 1 must come along
    assert cfg.select(cands) == [0, 1, 3]
