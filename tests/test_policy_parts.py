"""Each part of the adaptive policy alone (lvspec_eval/decoding/policy/): the cost model, the
acceptance model, the plan search, the schedule, the regime checks, the answer length and the
preparation economics, on hand-made numbers. tests/test_policy.py tests them composed."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lvspec_eval.decoding.policy import (
    CHEAP_SHARE,
    EXPLORE_EVERY,
    GROWTH,
    PLAIN_SPACING,
    PREPARE_PROBE,
    REFRESH_EVERY,
    SURPRISES,
    AcceptanceModel,
    AnswerLength,
    CostModel,
    OnlineLinear,
    Preparation,
    Regime,
    Schedule,
    best_plan,
    choose_total,
    model_accepted,
    neighbour,
)
from lvspec_eval.decoding.policy.acceptance import path_ranks
from lvspec_eval.decoding.types import HostView, Verdict


def _view(parents: list[int], scores: list[float] | None = None, probs: list[float] | None = None) -> HostView:
    n = len(parents)
    return HostView(tokens=list(range(n)), parents=parents, scores=scores, probs=probs,
                    target=[0] * (n + 1), margins=[1.0] * (n + 1))


# ---- fits: the cost model --------------------------------------------------------------------------------
def test_cost_model_plain_step_is_a_median_and_fits_start_from_the_first_drafting_step():
    costs = CostModel()
    for seconds in (1.0, 9.0, 1.2):  # a spike among plain steps moves no median
        costs.observe(1, 0, 0, 0.0, seconds)
    assert costs.single == pytest.approx(1.2) and not costs.drafted
    costs.observe(4, 3, 2, 0.6, 1.5)  # 3 levels drafted in 0.6 s, 4 tokens verified in 1.5 s
    assert costs.drafted and costs.max_tokens == 4 and costs.max_levels == 3
    assert costs.predict(4, 3, 2) == pytest.approx(2.1, rel=0.05)  # verification and drafting
    assert costs.predict(1, 0, 0) == pytest.approx(1.2)


def test_verify_cost_is_read_from_what_each_size_measured_along_log_tokens():
    """The real pair's concave curve (1 token 271 ms, 2 306, 4 351, 8 421, 16 513): a straight line
    through the 8- and 16-token verifications prices a 3-token one 6 % too dear; the table does not."""
    costs = CostModel()
    costs.observe(1, 0, 0, 0.0, 0.271)
    for tokens, seconds in ((2, 0.306), (4, 0.351), (8, 0.421), (16, 0.513)):
        costs.observe(tokens, 1, 0, 0.0, seconds)
    assert costs.verify_cost(4) == pytest.approx(0.351)
    assert costs.verify_cost(3) == pytest.approx(0.306 + 0.045 * math.log(1.5) / math.log(2))
    assert 0.421 < costs.verify_cost(12) < 0.513 and costs.verify_cost(32) > 0.513  # past: the line's slope
    line = OnlineLinear(2, prior_weight=1e-9)
    line.prior = np.array([0.0, 0.0])
    for tokens, seconds in ((8, 0.421), (16, 0.513)):
        line.add([1, tokens], seconds)
    assert line.predict([1, 3]) > 1.05 * costs.verify_cost(3)


def test_cost_model_grows_plans_from_what_was_measured_and_forgets():
    costs = CostModel()
    costs.observe(4, 3, 2, 0.6, 1.5)
    assert costs.deepest(1, 12) == min(GROWTH * 3, GROWTH * 4 - 1)  # GROWTH x the depth measured
    assert costs.deepest(4, 12) == (GROWTH * 4 - 1) // 4  # GROWTH x the tokens verified, spread over 4
    assert costs.verify_cap(64) == GROWTH * 4 - 1
    costs.forget()
    costs.regrow()
    assert not costs.drafted and costs.plain_times == [] and (costs.max_tokens, costs.max_levels) == (2, 1)


# ---- acceptance --------------------------------------------------------------------------------------------
def test_path_ranks_orders_siblings_by_draft_score():
    # root -> 0 (score -1), 1 (score -0.5): node 1 ranks first; 1 -> 2, 3
    view = _view([-1, -1, 1, 1], scores=[-1.0, -0.5, -0.9, -0.7])
    ranks, short, tried = path_ranks(view, [0])
    # node 0 is the second best; it has no children, but the tree went on at level 2 (under node 1):
    # the target's token after node 0 was not among the nodes kept there, a miss
    assert ranks == [1] and short
    assert tried == [(1, False), (0, True)]
    ranks, short, _ = path_ranks(view, [1, 2])
    assert ranks == [0, 1] and not short  # the tree's end: no miss
    ranks, short, _ = path_ranks(view, [1])  # accepted 1, then missed both its children
    assert ranks == [0] and short
    ranks, short, _ = path_ranks(_view([-1, -1, 1]), [0])  # a childless node at the tree's last level but one
    assert short
    assert not path_ranks(_view([-1, -1]), [0])[1]  # one level: ending there is the tree's end


def test_a_wide_step_teaches_the_narrower_widths():
    model = AcceptanceModel([1, 2], torch.device("cpu"))
    before = model.rates()
    # width 2: the path took the second-ranked child at level 1, then the first at level 2
    view = _view([-1, -1, 0, 0, 1, 1], scores=[-0.1, -0.2, -0.3, -0.4, -0.3, -0.4], probs=[0.5] * 6)
    for _ in range(20):
        model.learn(view, Verdict([0, 0, 0], [1, 4], 2, ["exact", "exact", "target"]), 2, None)
    rates = model.rates()  # width -> (first level, each level below)
    assert rates[2][0] > before[2][0] and rates[1][0] < before[1][0]  # width 1 would have stopped at level 1
    assert rates[2][1] > before[2][1]  # width 2 went on at level 2
    assert model.accept[1].trials == pytest.approx(model.accept[2].trials, rel=0.01)  # one first level a step
    assert model.deeper[1].trials == 0 and model.deeper[2].trials > 0  # width 1 never got below it


def test_a_path_that_leaves_the_kept_nodes_is_a_miss_below_the_first_level():
    """A tree of 2 nodes a level whose level 2 grew under the best first node: a path through the
    second-best first node ends at a node without children, a miss at level 2 (counted as none, the
    model overstated wide trees: a real-pair prose prompt drafted 14-node trees for 2.3 tokens)."""
    model = AcceptanceModel([1, 2], torch.device("cpu"))
    view = _view([-1, -1, 0, 0], scores=[-0.1, -0.2, -0.3, -0.4], probs=[0.5] * 4)
    for _ in range(30):
        model.learn(view, Verdict([0, 0], [1], 1, ["exact", "target"]), 2, None)
    first, deeper = model.rates()[2]
    assert first > 0.9 and deeper < 0.1
    assert model_accepted((first, deeper), 2) == pytest.approx(first * (1 + deeper))


def test_correction_is_realised_over_predicted_within_bounds():
    model = AcceptanceModel([1], torch.device("cpu"))
    view = _view([-1, 0, 1])
    for _ in range(40):  # the model predicted 3 accepted tokens each time; 1 came
        model.learn(view, Verdict([0, 0], [0], 1, ["exact", "target"]), 1, 3.0)
    assert model.correction() == pytest.approx(1 / 3, abs=0.03)  # (its prior, one in one, has faded)
    for _ in range(40):
        model.learn(view, Verdict([0], [], 0, ["target"]), 1, 3.0)
    assert model.correction() == 0.1  # never below a tenth
    assert model_accepted(0.5, 3) == pytest.approx(0.5 + 0.25 + 0.125)


def test_node_value_reads_the_calibration_table():
    model = AcceptanceModel([1], torch.device("cpu"))
    values = model.node_value(torch.tensor([0.95, 0.05]).log())
    assert values.exp().tolist() == pytest.approx([0.95, 0.05])  # the prior: f(q) = the bin's middle


# ---- search ----------------------------------------------------------------------------------------------
def test_best_plan_is_the_formula_maximised():
    draft = [0.4, 0.4, 0.0]  # a draft level 40 % of a step; 7 % a verified token
    verify = [1.0 + 0.07 * t for t in range(66)]
    accept, deepest = {1: 0.9, 2: 0.93}, {1: 12, 2: 6}

    def rate(depth, width):
        cost = draft[0] + draft[1] * (depth - 1) + verify[1 + width * depth]
        return (1 + model_accepted(accept[width], depth)) / cost

    want = max((rate(d, w), d, w) for w in accept for d in range(1, deepest[w] + 1))
    got = best_plan(draft, verify, accept, 1.0, math.inf, deepest, 64)
    assert got[1:] == want[1:] and got[0] == pytest.approx(want[0])
    assert got[2] == 1  # on such costs a chain
    assert best_plan(draft, verify, accept, 1.0, 2.0, deepest, 64)[1] <= 3  # 2 tokens needed: short
    assert best_plan(None, verify, accept, 1.0, math.inf, deepest, 64)[0] == 0.0  # nothing measured


def test_choose_total_keeps_the_nodes_that_pay_for_their_verification():
    verify = lambda n: 1.0 + 0.1 * n
    assert choose_total([0.9, 0.8, 0.7, 0.05], 0.5, verify) == 3  # the fourth adds 0.05 for 0.1
    assert choose_total([0.01], 0.5, verify) == 0


def test_neighbour_widths():
    widths = [1, 2, 4]
    assert neighbour(widths, 2, True) == 4 and neighbour(widths, 2, False) == 1
    assert neighbour(widths, 4, True) == 2 and neighbour(widths, 1, False) == 2


# ---- schedule ----------------------------------------------------------------------------------------------
def test_plain_steps_come_after_plain_spacing_then_refresh_every_drafting_steps():
    schedule = Schedule()
    schedule.plain_measured()
    plain_at, step = [], 0
    while step < 200:
        step += 1
        if schedule.plain_due():
            plain_at.append(step)
            schedule.plain_measured()
        else:
            schedule.drafts(True)
    gaps = [b - a - 1 for a, b in zip([0] + plain_at, plain_at)]
    assert gaps[0] == PLAIN_SPACING and set(gaps[1:]) == {REFRESH_EVERY}


def test_probes_back_off_and_each_request_probes_at_once():
    schedule = Schedule()
    drafted = [schedule.drafts(False) for _ in range(15)]
    assert [i for i, d in enumerate(drafted) if d] == [0, 2, 6, 14]  # after 1, 2, 4, 8 skipped steps
    schedule.new_request()
    assert schedule.drafts(False)
    assert schedule.drafts(True) and schedule.probe_every == 1  # a plan that pays resets the back-off


def test_looks_at_other_shapes_every_explore_every_drafting_steps():
    schedule = Schedule()
    looks = {}
    for step in range(1, 4 * EXPLORE_EVERY + 1):
        schedule.drafts(True)
        look = schedule.exploration()
        if look:
            looks[step] = look
    half = EXPLORE_EVERY // 2
    assert looks == {half: "deeper", EXPLORE_EVERY: "wider", EXPLORE_EVERY + half: "deeper",
                     2 * EXPLORE_EVERY: "narrower", 2 * EXPLORE_EVERY + half: "deeper", 3 * EXPLORE_EVERY: "wider",
                     3 * EXPLORE_EVERY + half: "deeper", 4 * EXPLORE_EVERY: "narrower"}


# ---- regime ------------------------------------------------------------------------------------------------
def test_surprises_in_a_row_mean_the_machine_changed():
    regime = Regime()
    assert not any(regime.surprised(1.0, 3.0, True, False) for _ in range(SURPRISES - 1))
    assert regime.surprised(1.0, 3.0, True, False)
    regime.forget()
    assert not regime.surprised(1.0, 3.0, True, False)
    assert not regime.surprised(1.0, 1.1, True, False)  # an ordinary step ends the run of surprises
    assert regime.surprised(1.0, 0.5, True, True)  # one probe far cheaper than predicted is enough
    assert not regime.surprised(None, 5.0, False, False)  # nothing predicted yet


def test_the_realised_rate_guard_holds_until_probes_lift_it():
    regime = Regime()
    assert regime.below_plain(1.0) is None  # fewer than two drafting steps: unknown
    for _ in range(4):
        regime.drafted(2, 4.0)  # half the plain rate
    assert regime.below_plain(1.0) == pytest.approx(0.5)
    assert regime.below_plain(1.0) == pytest.approx(0.5)  # no probe since: the verdict stands
    regime.drafted(2, 4.0)
    assert regime.below_plain(1.0) == pytest.approx(0.5)  # a probe as slow: still backed off
    regime.drafted(10, 2.0)
    assert regime.below_plain(1.0) is None  # the probes since realise 12 tokens in 6 s


# ---- answer length and preparation ----------------------------------------------------------------------
def test_answer_length_per_budget():
    answer = AnswerLength()
    answer.start(4)
    answer.generated = 0
    answer.committed([7, 0, 9], frozenset({0}))  # ends at token 0: 2 tokens
    answer.start(64)
    assert answer.mean_length is None and answer.remaining() == math.inf
    answer.start(4)
    assert answer.mean_length == 2 and answer.remaining() == pytest.approx(2)
    answer.generated = 2
    assert answer.remaining() == pytest.approx(0.5) and answer.left() == pytest.approx(0.5)


def test_preparation_pays_when_the_rest_of_the_answer_repays_it():
    prep = Preparation()
    prep.start(100, prepared=False, prefill_s=2.0)
    assert prep.cost() is None and prep.pays(2.0, 50, 1.0)  # never measured: prepare, to measure
    prep.observe(4.0)  # twice the prefill
    prep.start(100, prepared=False, prefill_s=3.0)
    assert prep.cost() == pytest.approx(6.0)
    assert prep.pays(2.0, 50, 1.0)  # 50 tokens x (1 - 0.5) s saved > 6 s
    assert not prep.pays(2.0, 10, 1.0)  # 5 s saved < 6 s
    assert prep.pays(2.0, 6.0 / (CHEAP_SHARE * 1.0), 1.0)  # cheap next to the answer's plain decoding
    refusals = 0
    while not prep.pays(0.5, 10, 1.0):  # drafting slower than plain: refused ...
        refusals += 1
        prep.start(100, prepared=False, prefill_s=3.0)
    assert refusals == PREPARE_PROBE  # ... until a probe prepares anyway
