"""A method that does not draft costs what vanilla costs (issue 46.5).

- The draft gate (decoding/policy/gate.py): SAGE's tree and StD's chain draft only where drafting is
  expected to pay, from the run's measured plain step, drafting rate and the answer's expected length:
  no draft (and no draft preparation) where the answer ends with the step's own token.
- A step without draft nodes is a plain step whatever the verifier (decoding/loop.py `PLAIN`): LVSpec's
  relevance machinery and its hidden states are not run for it.
"""
from __future__ import annotations

import pytest
import torch

from lvspec_eval.decoding import loop, methods
from lvspec_eval.decoding.drafters.growth import TreePlanner
from lvspec_eval.decoding.drafters.model import NoDrafter
from lvspec_eval.decoding.policy import DraftGate
from lvspec_eval.decoding.sage_tree import SageShape
from lvspec_eval.decoding.verifiers.lvspec import LVSpecVerifier

EOS = 99


def _plain(gate: DraftGate, seconds: float = 0.01) -> None:
    """A plain one-token step of `seconds` committed a (non-EOS) token."""
    gate.observe(0, [7], 0.0, seconds, 1)


# ---- the gate on hand-fed steps ----------------------------------------------------------------------
def test_the_runs_first_step_is_plain_then_a_probe():
    gate = DraftGate(frozenset({EOS}))
    gate.start_sample(budget=32)
    assert gate.decide(1) == (False, {"depth": 0, "width": 0, "reason": "measure a plain step"})
    _plain(gate)
    drafts, why = gate.decide(2)
    assert drafts and why["reason"] == "probe"  # nothing drafted yet: draft, to measure


def test_no_draft_where_the_answer_ends_with_the_steps_own_token():
    """Multiple choice: a letter and EOS. Once the run knows answers of this budget are that short,
    no step of such a request drafts; a request of another budget (captions) still does."""
    gate = DraftGate(frozenset({EOS}))
    gate.start_sample(budget=16)
    gate.decide(1)
    gate.observe(0, [EOS], 0.0, 0.01, 1)  # the letter came from the prefill, this step's token ends it
    gate.start_sample(budget=16)
    assert gate.decide(1) == (False, {"depth": 0, "width": 0, "reason": "answer ends"})
    gate.start_sample(budget=64)  # another task's budget: its answers' length is not known yet
    assert gate.decide(1)[0]
    gate.start_sample(budget=2)  # the budget itself leaves one token: this step's own
    assert gate.decide(1) == (False, {"depth": 0, "width": 0, "reason": "answer ends"})


def test_drafting_slower_than_plain_backs_off_to_rarer_probes():
    gate = DraftGate()
    gate.start_sample(budget=256)
    gate.decide(1)
    _plain(gate, seconds=0.01)  # plain: 100 tokens/s
    assert gate.decide(2)[0]
    gate.observe(9, [1, 2], 0.03, 0.02, 1)  # drafting: 2 tokens in 0.05 s = 40 tokens/s
    choices = [gate.decide(3 + i)[0] for i in range(12)]
    # the request's first non-paying step probes (a request may suit the draft), then 1, 2, 4 apart
    assert choices[0] and sum(choices) <= 4 and not all(choices[1:3])
    assert gate.estimates()["drafting_rate"] == pytest.approx(40.0, rel=0.2)


def test_drafting_faster_than_plain_drafts_and_caps_tokens_by_what_the_answer_needs():
    gate = DraftGate(frozenset({EOS}))
    gate.start_sample(budget=64)
    gate.decide(1)
    _plain(gate, seconds=0.01)
    gate.decide(2)
    gate.observe(9, [1, 2, 3, 4, 5], 0.01, 0.02, 1)  # 5 tokens in 0.03 s: 167 tokens/s
    drafts, why = gate.decide(7)
    assert drafts and why["est_rate"] > why["vanilla_rate"] and "reason" not in why
    _plain(gate)  # the schedule's plain step after two drafting steps
    gate.answer.mean_lengths[64] = 9.0  # answers of this budget end near 9 tokens: 2.25 left at 7
    assert gate.drafting_rate() == pytest.approx(2.25 / 0.03)  # the 5-token steps count for 2.25
    drafts, why = gate.decide(7)
    assert why["est_rate"] < why["vanilla_rate"]  # below plain's 100 tokens/s: at most a probe


def test_preparing_the_draft_is_refused_where_it_is_not_repaid():
    gate = DraftGate()
    gate.start_sample(budget=64, prompt_tokens=100, prepared=False, prefill_s=0.02)
    gate.decide(1)
    _plain(gate, seconds=0.01)
    assert gate.decide(2)[0]  # the run's first draft: prepared unconditionally, to measure
    gate.observe_preparation(1.0)  # 50x the prefill
    gate.observe(9, [1, 2], 0.001, 0.009, 1)  # 200 tokens/s against plain's 100: drafting pays...
    gate.start_sample(budget=64, prompt_tokens=100, prepared=False, prefill_s=0.02)
    drafts, why = gate.decide(1)  # ...but the ~3 tokens such answers have left save 0.015 s; preparing costs ~1 s
    assert not drafts and why["reason"] == "preparing the draft does not pay"


# ---- the gate in the methods -------------------------------------------------------------------------
def test_sage_and_std_go_through_the_gate_and_prepare_lazily():
    for name in ("sage", "std"):
        options = methods.make_options(methods.resolve(name), {})
        assert options.gated() and not options.eager_draft() and options.tree_config().gated
        always = methods.make_options(methods.resolve(name), {"draft_when": "always"})
        assert not always.gated() and always.eager_draft()  # the paper's reading: every step drafts
    assert not methods.make_options(methods.resolve("specvlm"), {"tree": "static"}).gated()  # fixed trees: as before
    with pytest.raises(ValueError, match="draft_when"):
        methods.make_options(methods.resolve("sd_tree"), {"draft_when": "always"})  # adaptive decides itself
    with pytest.raises(ValueError, match="draft_when"):
        methods.make_options(methods.resolve("sage"), {"draft_when": "sometimes"})


def test_the_sage_planner_asks_the_gate_then_grows_sages_shape():
    options = methods.make_options(methods.resolve("sage"), {})
    planner = TreePlanner(options.tree_config(), torch.device("cpu"), {EOS})
    planner.start_sample(budget=32)
    shape, plan = planner.next_shape(1)
    assert shape is None and plan["reason"] == "measure a plain step"
    planner.gate.observe(0, [3], 0.0, 0.01, 1)
    shape, plan = planner.next_shape(2)
    assert shape == SageShape(6, 6) and plan["alpha"] == 0.5 and plan["reason"] == "probe"


@pytest.mark.parametrize("method", ["sage", "std"])
@pytest.mark.parametrize("family", ["qwen2_5_vl"], indirect=True)
def test_a_short_request_after_a_long_one_drafts_nothing(family, make_case, method):
    """Request 1 (budget 12) probes drafting; request 2 (budget 2: only its last token is left to a
    step) drafts nothing and prepares nothing. With draft_when=always it drafts: the check can fail.
    Both stay token-identical to greedy decoding."""
    case = make_case(4, family.max_side)

    def run(options):
        spec = methods.resolve(method)
        drafter, verifier = methods.build(spec, methods.make_options(spec, options), family.draft, family.target)
        return [loop.generate(family.target, drafter, verifier, case.prompt, case.videos, n) for n in (12, 2)]

    vanilla = [loop.generate(family.target, NoDrafter(), methods.VERIFIERS["exact"](None), case.prompt,
                             case.videos, n) for n in (12, 2)]
    long, short = run({})
    assert sum(s.num_draft_nodes for s in long.stats.steps) > 0  # the gate lets the long request draft
    assert all(s.num_draft_nodes == 0 for s in short.stats.steps)
    assert short.stats.draft_prepared_at is None and short.stats.draft_prepare_s == 0.0
    always = run({"draft_when": "always"})
    assert sum(s.num_draft_nodes for s in always[1].stats.steps) > 0
    assert [long.tokens, short.tokens] == [out.tokens for out in always] == [v.tokens for v in vanilla]


# ---- a step without draft nodes is a plain step --------------------------------------------------------
@pytest.mark.parametrize("family", ["qwen2_5_vl"], indirect=True)
def test_a_step_without_drafts_runs_no_relevance_machinery(family, make_case, monkeypatch):
    """NoDrafter + LVSpec's verifier (the A/A check's "drafting off"): no step asks the target for
    LVSpec's hidden layer, nor runs its relevance or its loose rules; the tokens are greedy's."""
    verifier = LVSpecVerifier.from_options({"lv_layer": 1})

    def refuse(*_args, **_kwargs):
        raise AssertionError("a step without drafts ran LVSpec's verification")

    monkeypatch.setattr(verifier, "verify", refuse)
    monkeypatch.setattr(verifier, "relevance", refuse)
    asked = []
    score = family.target.score
    monkeypatch.setattr(family.target, "score",
                        lambda state, draft, hidden_layers=(): asked.append(tuple(hidden_layers)) or
                        score(state, draft, hidden_layers))
    case = make_case(2, family.max_side)
    out = loop.generate(family.target, NoDrafter(), verifier, case.prompt, case.videos, 6)
    monkeypatch.undo()
    vanilla = loop.generate(family.target, NoDrafter(), methods.VERIFIERS["exact"](None), case.prompt, case.videos, 6)
    assert out.tokens == vanilla.tokens and len(asked) == len(out.stats.steps) > 0
    assert all(layers == () for layers in asked)


def test_drafting_is_judged_in_plain_steps_of_its_own_stretch():
    """A drafting step is worth its tokens over its cost in plain steps measured then: two steps
    caught in a spike are outvoted, and a load that slows plain and drafting steps alike changes
    nothing (a rate over raw seconds held against plain steps measured since kept a run backed off)."""
    gate = DraftGate()
    gate.start_sample(budget=256)
    gate.decide(1)
    _plain(gate, seconds=0.01)
    for seconds in (0.02, 0.02, 0.2, 0.02, 0.2):  # 4 tokens per step: worth 2 plain steps' time, or 0.2 in a spike
        gate.observe(9, [1, 2, 3, 4], 0.0, seconds, 1)
    assert gate.worth() == pytest.approx(2.0)
    for _ in range(8):
        _plain(gate, seconds=0.05)  # the machine slows down 5x: plain steps now take 0.05 s
    assert gate.worth() == pytest.approx(2.0) and gate.drafting_rate() == pytest.approx(40.0)
    gate.observe(9, [1, 2, 3, 4], 0.0, 0.1, 1)  # drafting at the new speed: still 2 plain steps
    assert gate.worth() == pytest.approx(2.0) and gate.decide(20)[0]


@pytest.mark.parametrize("method", ["specvlm", "std", "sparrow"])
@pytest.mark.parametrize("family", ["qwen2_5_vl"], indirect=True)
def test_the_request_tensors_go_when_the_request_ends(family, make_case, method, monkeypatch, tmp_path):
    """A drafter that never drafted holds the target's inputs and state for a lazy preparation; it
    lets go of them when the request ends (`finish`), not at the next request's start, where freeing
    them was timed as that request's work. Vanilla's go when the loop returns."""
    import weakref

    from lvspec_eval.decoding.drafters.sparrow import SparrowHead

    options = {}
    if method == "sparrow":
        torch.manual_seed(0)
        SparrowHead.for_target(family.target).save(tmp_path / "head")
        options["sparrow_head"] = str(tmp_path / "head")
    spec = methods.resolve(method)
    drafter, verifier = methods.build(spec, methods.make_options(spec, options), family.draft, family.target)
    states = []
    prefill = family.target.prefill

    def spy(*args, **kwargs):
        out = prefill(*args, **kwargs)
        states.append(weakref.ref(out[0]))
        return out

    monkeypatch.setattr(family.target, "prefill", spy)
    case = make_case(3, family.max_side)
    out = loop.generate(family.target, drafter, verifier, case.prompt, case.videos, 2)
    assert out.stats.draft_prepared_at is None  # the run's first step is plain: nothing drafted
    assert states and all(ref() is None for ref in states)  # the target's state (its KV cache) is gone


# ---- a request that cannot draft prefills as vanilla does -----------------------------------------------
def test_steps_may_draft_only_where_more_than_the_steps_own_token_is_left():
    from lvspec_eval.decoding.policy import AnswerLength

    answer = AnswerLength()
    assert answer.steps_may_draft(16) and answer.steps_may_draft(None)  # nothing known yet
    assert not answer.steps_may_draft(2) and not answer.steps_may_draft(1)  # the steps' own token is all
    answer.start(16)
    answer.generated = 1
    answer.committed([EOS], frozenset({EOS}))  # a letter (the prefill's) and its end: 2 tokens
    assert not answer.steps_may_draft(16)  # asked before the next request folds it in: the same answer
    assert answer.steps_may_draft(64)  # another budget: not known
    answer.start(16)
    assert answer.mean_length == 2 and not answer.steps_may_draft(16)
    answer.generated = 1
    answer.committed([5, 6, EOS], frozenset({EOS}))  # a longer answer moves the mean past 2
    assert answer.steps_may_draft(16)


@pytest.mark.parametrize("method", ["specvlm", "lvspec", "std", "sage", "sparrow"])
@pytest.mark.parametrize("family", ["qwen2_5_vl"], indirect=True)
def test_a_request_that_cannot_draft_captures_nothing_for_a_draft(family, make_case, method, monkeypatch, tmp_path):
    """max_new_tokens=2 (the steps' one token): no text queries for pruning, no hidden states for
    LVSpec's relevance or Sparrow's head, at the prefill or any step; a longer request of the same
    drafter captures them."""
    from lvspec_eval.decoding.drafters.sparrow import SparrowHead

    options = {}
    if method == "sparrow":
        torch.manual_seed(0)
        SparrowHead.for_target(family.target).save(tmp_path / "head")
        options["sparrow_head"] = str(tmp_path / "head")
    spec = methods.resolve(method)
    drafter, verifier = methods.build(spec, methods.make_options(spec, options), family.draft, family.target)
    asked, steps = [], []
    prefill, score = family.target.prefill, family.target.score

    def spy(inputs, hidden_layers=(), keep_visual=None, visual_attention=False):  # the target's prefills
        asked.append((tuple(hidden_layers), visual_attention))  # (the drafts prefill on family.draft)
        return prefill(inputs, hidden_layers, keep_visual, visual_attention)

    monkeypatch.setattr(family.target, "prefill", spy)
    monkeypatch.setattr(family.target, "score", lambda state, draft, hidden_layers=(): steps.append(
        tuple(hidden_layers)) or score(state, draft, hidden_layers))
    case = make_case(5, family.max_side)
    out = loop.generate(family.target, drafter, verifier, case.prompt, case.videos, 2)
    assert asked == [((), False)] and steps == [()] * len(out.stats.steps)
    asked.clear()
    loop.generate(family.target, drafter, verifier, case.prompt, case.videos, 8)
    wanted = tuple(sorted(set(verifier.hidden_layers) | set(drafter.hidden_layers)))
    assert asked[0] == (wanted, drafter.needs_visual_attention) and (wanted or drafter.needs_visual_attention)
