"""Loose verifiers (FLy, LVSpec) on hand-built logits and hidden states: one test per rule.

Conventions: logits row 0 is the target's view after the root, row i + 1 after draft node i.
Visual hidden states are the first 4 unit axes of an 8-dim space; a node whose hidden state is
axis 0 has relevance 1 (lv_topn=1), one on axis 7 has relevance 0.
"""
from __future__ import annotations

import math
import random

import pytest
import torch

from lvspec_eval.decoding import methods, tree
from lvspec_eval.decoding.types import EXACT, LOOSE, PST, TARGET, Draft, Scores
from lvspec_eval.decoding.verifiers import loose
from lvspec_eval.decoding.verifiers.exact import ExactVerifier
from lvspec_eval.decoding.verifiers.fly import FlyVerifier, fly_accept
from lvspec_eval.decoding.verifiers.lvspec import Judged, LVSpecVerifier, lvspec_walk

VOCAB, DIM, LAYER = 32, 8, 3
VISUAL = {LAYER: torch.eye(DIM)[:4]}  # layer -> [4 visual tokens, DIM]
ON_VIDEO, OFF_VIDEO = torch.eye(DIM)[0], torch.eye(DIM)[7]  # relevance 1 and 0 with lv_topn=1


def sure(token: int) -> dict:
    """A confident target: top-3 entropy about 0."""
    return {token: 10.0}


def unsure(token: int, *alternatives: int) -> dict:
    """An uncertain target: three near-equal favourites (top-3 entropy about 1.1 nats)."""
    a, b = alternatives or (30, 31)
    return {token: 2.0, a: 1.9, b: 1.8}


def ratio(token: int, other: int, r: float) -> dict:
    """The target prefers `token`; p(other) / p(token) = r."""
    return {token: 5.0, other: 5.0 + math.log(r)}


def make_logits(rows: list[dict]) -> torch.Tensor:
    out = torch.full((len(rows), VOCAB), -10.0)
    for i, row in enumerate(rows):
        for token, value in row.items():
            out[i, token] = value
    return out


def chain(tokens: list[int]) -> Draft:
    return Draft(tokens=torch.tensor(tokens), parents=tree.chain_parents(len(tokens)))


def scores(rows: list[dict], node_hidden: list[torch.Tensor] | None = None, num_pending: int = 1,
           root: torch.Tensor = ON_VIDEO) -> Scores:
    """Scores with hidden states at LAYER: pending rows, the last of which (the root) is `root`."""
    hidden = {}
    if node_hidden is not None:
        hidden[LAYER] = torch.stack([ON_VIDEO] * (num_pending - 1) + [root] + list(node_hidden))
    return Scores(logits=make_logits(rows), hidden=hidden, num_pending=num_pending)


def lvspec(**options) -> LVSpecVerifier:
    """Relevance read at the node's own row, raw cosines (the hand-made geometry above)."""
    base = {"lv_layer": LAYER, "lv_topn": 1, "lv_threshold": 0.5, "lv_lambda": 0.3, "pst_window": 0,
            "lv_anchor": "node", "lv_center": "none"}
    return LVSpecVerifier(**{**base, **options})


# ---- FLy ----------------------------------------------------------------------------------------

def test_fly_hard_rejects_a_mismatch_where_the_target_is_confident():
    draft = chain([1, 2, 3, 4, 5, 6, 7, 8])
    rows = [sure(1), sure(9), sure(3), sure(4), sure(5), sure(6), sure(7), sure(8), sure(10)]
    verdict = FlyVerifier(fly_window=3).verify(draft, scores(rows))
    assert verdict.tokens == [1, 9] and verdict.kinds == [EXACT, TARGET]
    assert verdict.path == [0] and verdict.num_cached == 1


def test_fly_deferred_window_salvages_an_uncertain_mismatch():
    draft = chain([1, 2, 3, 4, 5, 6, 7, 8])
    rows = [sure(1), unsure(9, 2, 11), sure(3), sure(4), sure(5), sure(6), sure(7), sure(8), sure(10)]
    verdict = FlyVerifier(fly_window=3).verify(draft, scores(rows))
    assert verdict.tokens == [1, 2, 3, 4, 5, 6, 7, 8, 10]  # the draft's 2 is kept
    assert verdict.kinds == [EXACT, LOOSE] + [EXACT] * 6 + [TARGET]
    assert verdict.num_cached == 8 and verdict.num_accepted == 8


def test_fly_window_broken_by_a_second_mismatch_rejects():
    draft = chain([1, 2, 3, 4, 5, 6, 7, 8])
    rows = [sure(1), unsure(9), sure(3), unsure(12), sure(5), sure(6), sure(7), sure(8), sure(10)]
    verdict = FlyVerifier(fly_window=3).verify(draft, scores(rows))
    assert verdict.tokens == [1, 9] and verdict.kinds == [EXACT, TARGET]
    assert FlyVerifier(fly_window=2).verify(draft, scores(rows)).num_accepted == 8  # windows of 1 now


def test_fly_cannot_salvage_in_the_last_window():
    draft = chain([1, 2, 3, 4, 5, 6])  # k = 6, W = 3: positions 3, 4, 5 cannot be salvaged
    late = [sure(1), sure(2), sure(3), unsure(9), sure(5), sure(6), sure(10)]
    verdict = FlyVerifier(fly_window=3).verify(draft, scores(late))
    assert verdict.tokens == [1, 2, 3, 9] and verdict.kinds == [EXACT] * 3 + [TARGET]
    early = [sure(1), sure(2), unsure(9), sure(4), sure(5), sure(6), sure(10)]
    verdict = FlyVerifier(fly_window=3).verify(draft, scores(early))
    assert verdict.tokens == [1, 2, 3, 4, 5, 6, 10] and verdict.kinds[2] == LOOSE


def test_fly_accept_rule_on_plain_lists():
    assert fly_accept([True, True], [0.0, 0.0], 0.3, 6) == [EXACT, EXACT]
    assert fly_accept([False, True, True], [1.0, 0.0, 0.0], 0.3, 2) == [LOOSE, EXACT, EXACT]
    assert fly_accept([False, True, True], [0.2, 0.0, 0.0], 0.3, 2) == []


def test_top3_entropy_is_not_renormalised():
    flat = torch.zeros(1, 1000)  # uniform: each p = 0.001, so top-3 sum of -p log p is tiny
    assert loose.topk_entropy(flat).item() == pytest.approx(-3 * 0.001 * math.log(0.001))
    three = make_logits([{1: 5.0, 2: 5.0, 3: 5.0}])  # mass on three tokens: ln 3
    assert loose.topk_entropy(three).item() == pytest.approx(math.log(3), abs=1e-3)


def random_case(rng: random.Random, num_nodes: int, as_chain: bool):
    parents = [(i - 1 if as_chain else rng.randrange(-1, i)) for i in range(num_nodes)]
    kids: dict[int, set] = {}
    tokens = []
    for p in parents:  # siblings carry distinct tokens, as a drafter's top-k does
        token = rng.choice(sorted(set(range(10)) - kids.setdefault(p, set())))
        kids[p].add(token)
        tokens.append(token)
    logits = torch.randn(num_nodes + 1, VOCAB, generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
    logits[:, :10] += 3.0  # make the draft's tokens competitive so that some match
    draft = Draft(tokens=torch.tensor(tokens, dtype=torch.long), parents=torch.tensor(parents, dtype=torch.long))
    hidden = {LAYER: torch.randn(1 + num_nodes, DIM)}
    return draft, Scores(logits=logits, hidden=hidden, num_pending=1)


@pytest.mark.parametrize("as_chain", [True, False])
def test_fly_with_infinite_entropy_threshold_is_exact(as_chain):
    rng = random.Random(0)
    fly = FlyVerifier(fly_entropy=float("inf"), fly_window=2)
    for _ in range(200):
        draft, sc = random_case(rng, rng.randrange(0, 9), as_chain)
        assert fly.verify(draft, sc) == ExactVerifier().verify(draft, sc)


# ---- LVSpec -------------------------------------------------------------------------------------

def test_lvspec_is_strict_on_visually_relevant_tokens():
    rows = [ratio(9, 1, 0.9), sure(2), sure(10)]  # the draft's 1 is very plausible ...
    strict = lvspec().verify(chain([1, 2]), scores(rows, [ON_VIDEO, OFF_VIDEO]), VISUAL)
    assert strict.tokens == [9] and strict.kinds == [TARGET]  # ... but visual: rejected
    assert strict.relevance == [pytest.approx(1.0)]  # the target's token carries the rejected token's relevance
    lenient = lvspec().verify(chain([1, 2]), scores(rows, [OFF_VIDEO, OFF_VIDEO]), VISUAL)
    assert lenient.tokens == [1, 2, 10] and lenient.kinds == [LOOSE, EXACT, TARGET]
    assert lenient.relevance == [pytest.approx(0.0), pytest.approx(0.0), None]


def test_lvspec_parent_anchor_judges_the_slot_not_the_token():
    rows = [ratio(9, 1, 0.9), ratio(10, 2, 0.9), sure(11)]  # both draft tokens are plausible mismatches
    sc = scores(rows, [OFF_VIDEO, OFF_VIDEO], root=ON_VIDEO)  # the root's state looks at the video
    assert lvspec(lv_anchor="node").verify(chain([1, 2]), sc, VISUAL).kinds == [LOOSE, LOOSE, TARGET]
    verdict = lvspec(lv_anchor="parent").verify(chain([1, 2]), sc, VISUAL)
    assert verdict.tokens == [9] and verdict.kinds == [TARGET]  # the slot after the root is visual
    sc = scores(rows, [OFF_VIDEO, ON_VIDEO], root=OFF_VIDEO)
    verdict = lvspec(lv_anchor="parent").verify(chain([1, 2]), sc, VISUAL)
    assert verdict.tokens == [1, 2, 11] and verdict.relevance == [0.0, 0.0, None]  # n1's own row is unused
    sc = scores(rows, [ON_VIDEO, OFF_VIDEO], root=OFF_VIDEO)
    assert lvspec(lv_anchor="parent").verify(chain([1, 2]), sc, VISUAL).tokens == [1, 10]  # n0 predicts n1


def test_centring_removes_the_common_direction():
    common = 10 * torch.eye(DIM)[7]
    visual = torch.stack([torch.eye(DIM)[0] + common, torch.eye(DIM)[1] + common])
    query = torch.stack([torch.eye(DIM)[2] + common, torch.eye(DIM)[0] + common])
    raw = loose.VisualIndex.build(visual, centred=False).relevance(query, 1)
    centred = loose.VisualIndex.build(visual, centred=True).relevance(query, 1)
    assert raw[0] > 0.98  # everything looks alike before centring
    assert centred.tolist() == pytest.approx([0.0, 1.0], abs=1e-6)
    assert loose.VisualIndex.build(torch.zeros(0, DIM), centred=True).relevance(query, 4).tolist() == [0.0, 0.0]


def test_lvspec_relevance_reads_node_rows_after_the_pending_tokens():
    rows = [ratio(9, 1, 0.9), sure(10)]
    verdict = lvspec().verify(chain([1]), scores(rows, [OFF_VIDEO], num_pending=3), VISUAL)
    assert verdict.kinds == [LOOSE, TARGET] and verdict.relevance[0] == pytest.approx(0.0)


@pytest.mark.parametrize("r, accepted", [(0.5, True), (0.31, True), (0.2, False)])
def test_lvspec_loose_accepts_by_probability_ratio(r, accepted):
    rows = [ratio(9, 1, r), sure(10)]
    verdict = lvspec(lv_lambda=0.3).verify(chain([1]), scores(rows, [OFF_VIDEO]), VISUAL)
    assert verdict.tokens == ([1, 10] if accepted else [9])


@pytest.mark.parametrize("k, accepted", [(1, False), (2, False), (3, True)])
def test_lvspec_loose_accepts_by_target_top_k(k, accepted):
    rows = [{9: 5.0, 8: 4.0, 1: 3.0}, sure(10)]  # the draft's 1 is the target's third choice
    verdict = lvspec(lv_loose="topk", lv_topk=k).verify(chain([1]), scores(rows, [OFF_VIDEO]), VISUAL)
    assert verdict.tokens == ([1, 10] if accepted else [9])


def test_lvspec_pst_realigns_and_keeps_kv_only_before_the_shift():
    draft = chain([1, 2, 3, 4, 5, 6])  # the draft inserted 3 before 4
    rows = [sure(1), sure(2), sure(4), sure(11), sure(5), sure(6), sure(7)]
    hidden = [OFF_VIDEO, OFF_VIDEO, ON_VIDEO, OFF_VIDEO, OFF_VIDEO, OFF_VIDEO]
    verdict = lvspec(pst_window=2).verify(draft, scores(rows, hidden), VISUAL)
    assert verdict.tokens == [1, 2, 4, 5, 6, 7]
    assert verdict.path == [0, 1, 3, 4, 5]
    assert verdict.kinds == [EXACT, EXACT, PST, EXACT, EXACT, TARGET]
    assert verdict.num_cached == 2  # nodes after the shift were scored with the 3 in context
    off = lvspec(pst="off", pst_window=2).verify(draft, scores(rows, hidden), VISUAL)
    assert off.tokens == [1, 2, 4] and off.num_cached == 2


def test_lvspec_pst_window_bounds_the_shift():
    draft = chain([1, 2, 3, 4, 5])  # the target's 4 sits three levels below the mismatch
    rows = [sure(4), sure(12), sure(13), sure(14), sure(5), sure(6)]
    hidden = [ON_VIDEO] * 5
    assert lvspec(pst_window=2).verify(draft, scores(rows, hidden), VISUAL).tokens == [4]
    three = lvspec(pst_window=3).verify(draft, scores(rows, hidden), VISUAL)
    assert three.tokens == [4, 5, 6] and three.num_cached == 0 and three.kinds == [PST, EXACT, TARGET]


def test_lvspec_walks_trees_greedily():
    # root -> n0 (1), n1 (2); n0 -> n2 (3); n1 -> n3 (4), n4 (5); n3 -> n5 (6)
    draft = Draft(tokens=torch.tensor([1, 2, 3, 4, 5, 6]), parents=torch.tensor([-1, -1, 0, 1, 1, 3]))
    rows = [{9: 5.0, 1: 4.0, 2: 4.5},  # neither child matches 9; both plausible, the target prefers 2
            sure(3), sure(5), sure(20), sure(4), sure(21), sure(22)]
    hidden = [OFF_VIDEO] * 6
    verdict = lvspec().verify(draft, scores(rows, hidden), VISUAL)
    assert verdict.path == [1, 4] and verdict.tokens == [2, 5, 21]  # then exact child 5 (n4), bonus
    assert verdict.kinds == [LOOSE, EXACT, TARGET] and verdict.num_cached == 2
    # PST in a tree: the target's 6 sits under n1 -> n3 (two inserted tokens), with no draft after it
    rows[0] = sure(6)
    strict = scores(rows, [ON_VIDEO] * 6)
    assert lvspec(pst_window=1, pst_confirm=0).verify(draft, strict, VISUAL).path == []
    assert lvspec(pst_window=2, pst_confirm=1).verify(draft, strict, VISUAL).path == []  # unconfirmed
    shifted = lvspec(pst_window=2, pst_confirm=0).verify(draft, strict, VISUAL)
    assert shifted.path == [5] and shifted.tokens == [6, 22] and shifted.num_cached == 0


def test_lvspec_pst_follows_the_drafts_favourite_chain():
    # root -> n0 (1) -> n1 (2), n2 (4); the target wants 4 after the root, then 5 after n2
    draft = Draft(tokens=torch.tensor([1, 2, 4, 5]), parents=torch.tensor([-1, 0, 0, 2]),
                  scores=torch.tensor([-0.1, -0.5, -0.9, -1.0]))
    rows = [sure(4), sure(20), sure(21), sure(5), sure(22)]
    sc = scores(rows, [ON_VIDEO] * 4)
    assert lvspec(pst_window=1).verify(draft, sc, VISUAL).path == []  # n2 is not n0's favourite
    favourite = Draft(tokens=draft.tokens, parents=draft.parents, scores=torch.tensor([-0.1, -0.9, -0.5, -1.0]))
    verdict = lvspec(pst_window=1).verify(favourite, sc, VISUAL)
    assert verdict.path == [2, 3] and verdict.tokens == [4, 5, 22] and verdict.kinds == [PST, EXACT, TARGET]


@pytest.mark.parametrize("anchor, center", [("node", "none"), ("parent", "visual")])
def test_lvspec_loose_tokens_never_exceed_the_threshold(anchor, center):
    rng = random.Random(1)
    for threshold in (-0.2, 0.0, 0.2, 0.5):
        verifier = lvspec(lv_threshold=threshold, lv_topn=2, lv_lambda=0.05, pst_window=2, lv_anchor=anchor,
                          lv_center=center)
        for _ in range(100):
            draft, sc = random_case(rng, rng.randrange(1, 9), as_chain=rng.random() < 0.5)
            verdict = verifier.verify(draft, sc, {LAYER: torch.randn(5, DIM)})
            loose_rel = [r for r, k in zip(verdict.relevance, verdict.kinds) if k == LOOSE]
            assert all(r < threshold for r in loose_rel)


@pytest.mark.parametrize("as_chain", [True, False])
def test_lvspec_strict_everywhere_without_pst_is_exact(as_chain):
    rng = random.Random(2)
    verifier = lvspec(lv_threshold=-1.0, pst="off", lv_lambda=0.0)
    for _ in range(200):
        draft, sc = random_case(rng, rng.randrange(0, 9), as_chain)
        verdict = verifier.verify(draft, sc, {LAYER: torch.randn(5, DIM)})
        exact = ExactVerifier().verify(draft, sc)
        assert (verdict.tokens, verdict.path, verdict.num_cached, verdict.kinds) == \
            (exact.tokens, exact.path, exact.num_cached, exact.kinds)


def test_lvspec_without_video_verifies_everything_loosely():
    rows = [ratio(9, 1, 0.9), sure(10)]
    verdict = lvspec().verify(chain([1]), scores(rows, [ON_VIDEO]), {LAYER: torch.zeros(0, DIM)})
    assert verdict.kinds == [LOOSE, TARGET] and verdict.relevance == [0.0, None]


def test_lvspec_relevance_off_is_visually_blind():
    verifier = lvspec(lv_relevance="off")
    assert verifier.hidden_layers == ()
    verdict = verifier.verify(chain([1]), scores([ratio(9, 1, 0.9), sure(10)]), None)
    assert verdict.kinds == [LOOSE, TARGET] and verdict.relevance is None


def test_lvspec_asks_for_its_layer_and_fails_clearly_without_it():
    assert lvspec().hidden_layers == (LAYER,)
    with pytest.raises(ValueError, match="lv_layer=3"):
        lvspec().verify(chain([1]), scores([sure(1), sure(2)]), {})


def test_walk_on_plain_lists_matches_docstring_example():
    judged = Judged(tokens=[5, 9, 7], target=[9, 0, 7, 8], lenient=[False] * 3, preference=[0.0] * 3,
                    kids=tree.children(tree.chain_parents(3)))
    walk = lvspec_walk(judged, pst_window=1)
    assert (walk.path, walk.kinds, walk.num_cached) == ([1, 2], [PST, EXACT], 0)


# ---- options ------------------------------------------------------------------------------------

def test_options_are_listed_with_defaults():
    assert FlyVerifier.OPTIONS == {"fly_entropy": 0.3, "fly_window": 6, "fly_k": 15}
    assert {"lv_layer", "lv_anchor", "lv_center", "lv_topn", "lv_threshold", "lv_lambda", "lv_loose", "lv_topk", "lv_relevance", "pst",
            "pst_window", "pst_confirm"} == set(LVSpecVerifier.OPTIONS)


@pytest.mark.parametrize("user, message", [
    ({"lv_treshold": 0.4}, "unknown LVSpec option.*lv_threshold"),
    ({"fly_windw": 3}, "unknown FLy option.*fly_window"),
    ({"pst_windows": 3}, "unknown LVSpec option"),
    ({"fly_window": 0}, "fly_window=0"),
    ({"lv_threshold": 2}, "lv_threshold=2.*<= 1.0"),
    ({"lv_loose": "soft"}, "lv_loose='soft'.*ratio, topk"),
    ({"pst_window": 1.5}, "pst_window=1.5"),
    ({"lv_lambda": "much"}, "lv_lambda='much'"),
    ({"lv_topn": True}, "lv_topn=True"),
])
def test_bad_options_fail_when_options_are_made(user, message):
    with pytest.raises(ValueError, match=message):
        methods.make_options(methods.resolve("lvspec"), user)


def test_options_reach_the_verifiers_through_methods():
    spec = methods.resolve("fly")
    options = methods.make_options(spec, {"fly_k": 7, "fly_entropy": "inf"})
    assert options.tree == "adaptive" and options.tree_depth == 7  # fly_k caps the adaptive draft depth
    _, verifier = methods.build(spec, options)
    assert verifier.entropy == float("inf") and verifier.k == 7
    with pytest.raises(ValueError, match="fly_k=7 and tree_depth=5"):
        methods.make_options(spec, {"fly_k": 7, "tree_depth": 5})
    spec = methods.resolve("lvspec")
    _, verifier = methods.build(spec, methods.make_options(spec, {"lv_relevance": "false", "pst": "off"}))
    assert not verifier.use_relevance and verifier.pst_window == 0


def test_any_verifier_pairs_with_any_drafter():
    for verifier in ("exact", "fly", "lvspec"):
        for drafter in ("none", "model", "pruned"):
            assert methods.resolve("custom", drafter, verifier).verifier == verifier
