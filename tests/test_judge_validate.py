"""judge-check's captions, perturbations and statistics, checked against known values."""
from __future__ import annotations

import random

import pytest

from judges import oracle, validate
from lvspec_eval.demo import world


def test_quadratic_kappa_known_values():
    assert validate.quadratic_kappa([0, 1, 2, 3], [0, 1, 2, 3]) == pytest.approx(1.0)
    assert validate.quadratic_kappa([0, 1], [1, 0], num_classes=2) == pytest.approx(-1.0)
    # Hand-computed: O=[[1,1],[0,2]] -> E=[[0.5,1.5],[0.5,1.5]], w=[[0,1],[1,0]]: 1 - 1/2 = 0.5
    assert validate.quadratic_kappa([0, 0, 1, 1], [0, 1, 1, 1], num_classes=2) == pytest.approx(0.5)
    assert validate.quadratic_kappa([3, 3], [3, 3]) is None
    with pytest.raises(ValueError, match="differ in length"):
        validate.quadratic_kappa([1], [1, 2])


def test_quadratic_kappa_matches_sklearn():
    metrics = pytest.importorskip("sklearn.metrics")
    rng = random.Random(0)
    a = [rng.randrange(6) for _ in range(50)]
    b = [min(5, max(0, x + rng.choice([-2, -1, 0, 0, 1]))) for x in a]
    expected = metrics.cohen_kappa_score(a, b, weights="quadratic", labels=list(range(6)))
    assert validate.quadratic_kappa(a, b) == pytest.approx(expected)


@pytest.mark.parametrize("kind", validate.PERTURB_KINDS)
def test_a_swap_changes_exactly_that_fact(kind):
    scene = world.make_scene(4)
    wrong = validate.perturb_scene(scene, [(0, kind)], random.Random(1))
    assert getattr(wrong.objects[0], kind) != getattr(scene.objects[0], kind)
    others = [a for a in ("colour", "shape", "size", "motion") if a != kind]
    assert all(getattr(wrong.objects[0], a) == getattr(scene.objects[0], a) for a in others)
    assert wrong.objects[1:] == scene.objects[1:]


def test_perturbed_caption_keeps_the_wording_and_loses_oracle_score():
    scene = world.make_scene(11)
    plain = world.make_caption(scene, seed=5)
    swapped = validate.perturbed_caption(scene, [(0, "colour")], 5, random.Random(2))
    changed = [(a, b) for a, b in zip(plain.split(), swapped.split()) if a != b]
    assert len(plain.split()) == len(swapped.split()) and len(changed) == 1
    assert changed[0][0] == scene.objects[0].colour and changed[0][1] in world.COLOURS
    assert oracle.score_caption(swapped, scene)["f1"] < oracle.score_caption(plain, scene)["f1"] == 1.0


def test_candidates_per_scene_and_their_oracle_scores():
    cands = validate.make_candidates(3)
    assert len(cands) == 3 * 7
    kinds = [c.kind for c in cands[:7]]
    assert kinds == ["identity", "paraphrase"] + ["perturbed-1"] * 3 + ["perturbed-2", "perturbed-3"]
    assert all(c.oracle_f1 == 1.0 for c in cands if c.kind in ("identity", "paraphrase"))
    assert all(c.oracle_f1 < 1.0 for c in cands if c.kind.startswith("perturbed"))
    assert cands[0].caption == cands[0].reference and cands[0].qa


def test_oracle_as_judge_is_the_perfect_ceiling():
    report = validate.run_check(validate.make_candidates(4), validate.oracle_scores)
    assert report["rank"]["spearman"] == pytest.approx(1.0) and report["rank"]["kendall"] == pytest.approx(1.0)
    assert report["kappa_quadratic"] == pytest.approx(1.0)
    assert report["identity"]["top_share"] == 1.0 and report["perturbation"]["lower_share"] == 1.0
    assert len(report["rows"]) == 28


def test_constant_judge_with_missing_scores():
    cands = validate.make_candidates(2)
    scores = [None if n % 7 == 3 else 5 for n in range(len(cands))]
    report = validate.summarise(cands, scores)
    assert report["num_missing"] == 2 and report["rank"]["spearman"] is None
    assert report["identity"]["top_share"] == 1.0
    assert report["perturbation"]["lower_share"] == 0.0 and report["perturbation"]["tie_share"] == 1.0
    assert report["perturbation"]["n"] == 8


def test_vdc_question_subset_is_drawn_by_the_scene_not_by_the_perturbation():
    full = validate.make_candidates(3)
    few = validate.make_candidates(3, max_questions=4)
    for seed in {c.scene_seed for c in full}:
        mine = [c.qa for c in few if c.scene_seed == seed]
        assert len(set(mine)) == 1 and len(mine[0]) == 4  # every caption of a scene gets the same questions
        all_qa = next(c.qa for c in full if c.scene_seed == seed)
        assert [all_qa.index(q) for q in mine[0]] == sorted(all_qa.index(q) for q in mine[0])
    assert validate.pick_questions(full[0].qa, None, 1) == full[0].qa
    with pytest.raises(ValueError, match="max_questions=0"):
        validate.pick_questions(full[0].qa, 0, 1)
