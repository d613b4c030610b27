"""The adaptive policy against the best fixed shape in hindsight (issue 53).

Recordings say, per output position, the draft's rank of the target's token and the draft's best
probabilities (measure/policy_replay.py). Replayed under the real pair's measured cost curve (target
1 token 271 ms, 2 306, 4 351, 8 421, 16 513; the int8 draft about 35 ms a level), every fixed shape's
rate is known in hindsight; the policy, run once over a set's prompts as in one bench run, must
reach at least 0.97 of the best of them. The sets are synthetic draft/target agreement processes
(seeded): one built to favour chains (high, steady acceptance), one in between (good top-2), and
one built to favour wide trees (low top-1 acceptance, good top-2/3); and the recorded sets of
tests/fixtures/policy_recordings.json (scripts/record_draft_ranks.py: the real pair on the builtin
prompts, the set the policy is tuned on; never the held-out set).
"""
from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from lvspec_eval.decoding.policy import AdaptivePolicy
from lvspec_eval.decoding.tree import dynamic_shape
from lvspec_eval.measure.policy_replay import (
    NUM_RANKS,
    CostCurve,
    Recording,
    ReplayDraft,
    accepted_path,
    best_fixed,
    fixed_step,
    grow,
    load_recordings,
    policy_rate,
)

CURVE = CostCurve(((1, .271), (2, .306), (4, .351), (8, .421), (16, .513)), draft_level=0.035, draft_node=0.002)


def _confident(rng: random.Random, rank: int) -> list[float]:
    q0 = rng.uniform(0.7, 0.99) if rank == 0 else rng.uniform(0.3, 0.7)
    rest = 1 - q0
    return [q0, min(q0, rest * 0.6), rest * 0.2, rest * 0.1]


def _broad(rng: random.Random, rank: int) -> list[float]:
    q0 = rng.uniform(0.25, 0.6)
    rest = 1 - q0
    return sorted([q0, rest * 0.45, rest * 0.25, rest * 0.12], reverse=True)


def synthetic(seed: int, ranks_dist: list[float], probs, num_prompts: int = 6, num_tokens: int = 65):
    """Answers whose target token has draft rank r with chance ranks_dist[r] (else beyond the recorded ranks)."""
    rng, out = random.Random(seed), []
    for _ in range(num_prompts):
        ranks = [next((r for r, c in enumerate(_cumulative(ranks_dist)) if u < c), NUM_RANKS)
                 for u in (rng.random() for _ in range(num_tokens))]
        out.append(Recording(tuple(ranks), tuple(tuple(probs(rng, r)) for r in ranks)))
    return out


def _cumulative(dist: list[float]) -> list[float]:
    out, total = [], 0.0
    for p in dist:
        total += p
        out.append(total)
    return out


SETS = {
    "chains": lambda: synthetic(1, [0.92, 0.04, 0.01], _confident),
    "between": lambda: synthetic(3, [0.75, 0.1, 0.04], _confident),
    "wide": lambda: synthetic(4, [0.5, 0.3, 0.1], _broad),
}


RECORDED = Path(__file__).parent / "fixtures" / "policy_recordings.json"
for _name, _recs in (load_recordings(RECORDED) if RECORDED.is_file() else {}).items():
    SETS[_name] = lambda recs=_recs: recs


def _policy() -> AdaptivePolicy:
    return AdaptivePolicy(8, 4, 60, torch.device("cpu"))


@pytest.mark.parametrize("name", list(SETS))
def test_policy_reaches_the_best_fixed_shape_in_hindsight(name):
    recordings = SETS[name]()
    best, shape = best_fixed(recordings, CURVE)
    got = policy_rate(recordings, CURVE, _policy)
    assert got >= 0.97 * best, f"{name}: policy {got:.3f} tokens/s, best fixed {shape} {best:.3f}"


def test_the_sets_favour_what_they_were_built_for():
    """The chain set's best shape is a chain; the wide set's best is wider than a chain."""
    assert best_fixed(SETS["chains"](), CURVE)[1][1] == 1
    assert best_fixed(SETS["wide"](), CURVE)[1][1] > 1


@pytest.mark.parametrize("depth,width,total", [(4, 1, None), (3, 2, None), (3, 2, 6), (2, 4, 8)])
def test_fixed_step_is_what_the_grower_grows(depth, width, total):
    """The hindsight search's float replica of a step equals the drafters' Grower on the same draft."""
    rec = SETS["wide"]()[0]
    draft = ReplayDraft(rec)
    for start in range(1, 40, 3):
        tree = grow(draft, start, dynamic_shape(depth, width, width, total))
        assert fixed_step(draft, start, depth, width, total) == (len(accepted_path(draft, start, tree)),
                                                                 tree.num_nodes)


def test_cost_curve_and_recording_reject_bad_input():
    with pytest.raises(ValueError, match="rising token counts"):
        CostCurve(((2, 0.3), (1, 0.2)), 0.0, 0.0)
    with pytest.raises(ValueError, match="must fall"):
        Recording((0,), ((0.2, 0.5),))
    assert CURVE.verify(4) == pytest.approx(0.351) and 0.421 < CURVE.verify(12) < 0.513
