"""The draft gate: whether a step drafts at all, for a drafter whose tree shape is its own (SAGE's
entropy-driven tree, StD's chain of 9; `draft_when=pays`). The adaptive policy (adaptive.py) decides
the shape and whether to draft in one search; this is the same decision of whether, from the same
parts, with the shape left to the drafter:

- the plain step's cost: the median of the recent plain steps (fits.CostModel.single); the run's first
  step and then one after 2, 4, ... (at most REFRESH_EVERY) drafting steps are plain, to measure it
  (schedule.Schedule);
- the tokens the answer still needs (answer.AnswerLength): where the answer is expected to end with
  this step's own token (a multiple-choice letter), nothing is drafted;
- what drafting this shape is worth: per recent drafting step, the tokens it committed over its
  cost in plain steps (its seconds drafting and verifying over the plain step's median then), with
  the tokens capped by what the answer still needs (a 9-token chain commits at most the 2 tokens a
  short answer has left); the median over the last RECENT_STEPS such steps. Held against 1 (a plain
  step's one token per plain step): a load that slows both alike changes nothing, and a drafting
  step caught in a spike is outvoted (a rate over raw seconds, held against plain steps measured
  since, kept a run backed off long after a spike had passed);
- whether preparing the draft is repaid (preparation.Preparation, draft_prepare=lazy: a request whose
  steps never draft costs no draft-side work);
- where drafting does not pay, a probe now and then (1, 2, 4, ... steps apart, and at the first such
  step of a request), so that a run can find out that it pays again (schedule.Schedule).

The run's first drafting step is a probe (nothing is known yet), as the adaptive policy's is.
"""
from __future__ import annotations

import statistics

from .answer import AnswerLength
from .fits import CostModel
from .preparation import Preparation
from .regime import RECENT_STEPS
from .schedule import Schedule


class DraftGate:
    """Per-run estimates and the per-step yes/no of drafting (see the module docstring)."""

    def __init__(self, eos_token_ids: frozenset[int] = frozenset()):
        self.eos_token_ids = frozenset(eos_token_ids)
        self.costs, self.answer, self.preparation, self.schedule = CostModel(), AnswerLength(), Preparation(), Schedule()
        self.recent: list[tuple[int, float]] = []  # (tokens committed, cost in plain steps) of recent drafting steps

    # ---- a request ---------------------------------------------------------------------------------
    def start_sample(self, budget: int | None = None, prompt_tokens: int = 0, prepared: bool = True,
                     prefill_s: float | None = None) -> None:
        """As AdaptivePolicy.start_sample: a request of `budget` new tokens, its draft `prepared` or not."""
        self.answer.start(budget)
        self.preparation.start(prompt_tokens, prepared, prefill_s)
        self.schedule.new_request()

    def observe_preparation(self, seconds: float) -> None:
        self.preparation.observe(seconds)

    # ---- choosing ------------------------------------------------------------------------------------
    def worth(self) -> float | None:
        """Tokens per plain step's time the recent drafting steps would commit on this answer: the
        median over them of min(tokens, tokens the answer needs) / cost in plain steps (None: none yet;
        above 1: drafting pays)."""
        if not self.recent:
            return None
        need = max(self.answer.left(), 1.0)
        return statistics.median(min(tokens, need) / max(cost, 1e-9) for tokens, cost in self.recent)

    def drafting_rate(self) -> float | None:
        """Tokens per second drafting is expected to commit now (None: nothing drafted yet)."""
        worth = self.worth()
        return None if worth is None or not self.costs.single else worth / self.costs.single

    def decide(self, num_generated: int = 0) -> tuple[bool, dict]:
        """Whether this step drafts, and why (the record's plan when it does not)."""
        self.answer.generated = num_generated
        if self.costs.single is None or self.schedule.plain_due():
            return False, {"depth": 0, "width": 0, "reason": "measure a plain step"}
        if self.answer.left() <= 1.0:  # the answer is expected to end (or must: its budget) with this step's token
            return False, {"depth": 0, "width": 0, "reason": "answer ends"}
        rate, vanilla = self.drafting_rate(), 1.0 / self.costs.single
        if rate is None:  # nothing drafted yet in this run: draft, to measure
            self.schedule.drafts(True)
            return True, {"reason": "probe"}
        info = {"est_rate": rate, "vanilla_rate": vanilla}
        if not self.preparation.is_prepared:
            info["prepare_est_s"] = self.preparation.cost()
            if not self.preparation.pays(rate, self.answer.left(), self.costs.single):
                return False, {**info, "depth": 0, "width": 0, "reason": "preparing the draft does not pay"}
        if not self.schedule.drafts(rate >= vanilla):
            return False, {**info, "depth": 0, "width": 0, "reason": "no draft pays"}
        if rate < vanilla:
            info["reason"] = "probe"
        return True, info

    # ---- learning --------------------------------------------------------------------------------------
    def observe(self, num_draft_nodes: int, tokens: list[int], draft_s: float, verify_s: float,
                num_pending: int) -> None:
        """A step drafted `num_draft_nodes` nodes (0: a plain step) and committed `tokens`."""
        self.answer.committed(tokens, self.eos_token_ids)
        if num_draft_nodes and self.costs.single:
            cost = (draft_s + verify_s) / self.costs.single  # in plain steps of the same stretch
            self.recent = (self.recent + [(len(tokens), cost)])[-RECENT_STEPS:]
        elif not num_draft_nodes and num_pending == 1:  # a plain one-token step: what drafting is held against
            self.costs.observe(1, 0, 0, 0.0, verify_s)
            self.schedule.plain_measured()

    def estimates(self) -> dict:
        rate = self.drafting_rate()
        mean = self.answer.mean_length
        return {"step_cost": None if self.costs.single is None else round(self.costs.single, 6),
                "drafting_rate": None if rate is None else round(rate, 3),
                "mean_answer_tokens": None if mean is None else round(mean, 2), **self.preparation.estimates()}
