"""The adaptive policy: the parts of this package composed into one per-run object, whose
methods the drafters call (plan, choose_total, node_value, observe, start_sample,
observe_preparation, estimates). What each part knows and decides is in its own module."""
from __future__ import annotations

import math

import torch

from ..tree import Shape, dynamic_shape
from ..types import HostView, StepStats, Verdict
from .acceptance import AcceptanceModel, KeptLevels, model_accepted, tree_levels
from .answer import AnswerLength
from .fits import CostModel
from .preparation import Preparation
from .regime import Regime
from .schedule import Schedule
from .search import best_plan, choose_total, neighbour


class _Part:
    """An attribute of one of the policy's parts, read and written through the policy (the names
    its callers and tests have used since the policy was one class)."""

    def __init__(self, part: str):
        self.part = part

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, objtype=None):
        return self if obj is None else getattr(getattr(obj, self.part), self.name)

    def __set__(self, obj, value) -> None:
        setattr(getattr(obj, self.part), self.name, value)


class AdaptivePolicy:
    """Per-run estimates and the per-step choice of draft shape (see the package docstring)."""

    single, verify, draft, max_tokens = _Part("costs"), _Part("costs"), _Part("costs"), _Part("costs")
    accept = _Part("acceptance")
    since_single = _Part("schedule")
    generated, mean_lengths, mean_length = _Part("answer"), _Part("answer"), _Part("answer")
    prepare_ratios, prefill_s, is_prepared = _Part("preparation"), _Part("preparation"), _Part("preparation")

    def __init__(self, max_depth: int, max_width: int, max_nodes: int, device: torch.device,
                 eos_token_ids: frozenset[int] = frozenset()):
        self.eos_token_ids = eos_token_ids  # an answer's length counts up to its end token
        self.max_depth, self.max_nodes, self.device = max_depth, max_nodes, device
        self.widths = [w for w in (1, 2, 4, 8, 16) if w <= max_width] or [1]
        self.costs, self.acceptance, self.answer = CostModel(), AcceptanceModel(self.widths, device), AnswerLength()
        self.schedule, self.regime, self.preparation = Schedule(), Regime(), Preparation()
        self.kept_levels = KeptLevels()

    # ---- a request ---------------------------------------------------------------------------------
    def start_sample(self, budget: int | None = None, prompt_tokens: int = 0, prepared: bool = True,
                     prefill_s: float | None = None) -> None:
        """A new request with `budget` max_new_tokens, `prompt_tokens` prompt tokens and a target
        prefill of `prefill_s` seconds, its draft `prepared` or not yet."""
        self.answer.start(budget)
        self.preparation.start(prompt_tokens, prepared, prefill_s)
        self.schedule.new_request()

    def observe_preparation(self, seconds: float) -> None:
        """The current request's draft was prepared in `seconds`: learn what preparing costs."""
        self.preparation.observe(seconds)

    def prepare_cost(self) -> float | None:
        return self.preparation.cost()

    def preparation_pays(self, rate: float | None) -> bool:
        """Whether preparing the draft now is repaid by drafting at `rate` (preparation.Preparation.pays)."""
        return self.preparation.pays(rate, self.answer.left(), self.costs.single)

    def remaining(self) -> float:
        return self.answer.remaining()

    # ---- choosing ------------------------------------------------------------------------------------
    def plan(self, num_generated: int = 0) -> tuple[Shape | None, dict]:
        """This step's shape (None: no draft) and the estimates behind the choice."""
        self.answer.generated = num_generated
        if self.costs.single is None or self.schedule.plain_due():
            return None, {"depth": 0, "width": 0, "reason": "measure a plain step"}
        if self.answer.left() <= 1.0:  # the answer is expected to end (or must: its budget) with this step's token
            return None, {"depth": 0, "width": 0, "reason": "answer ends"}
        if not self.costs.drafted:  # nothing drafted yet: a one-token probe (cheapest draft)
            self.schedule.first_probe()
            return dynamic_shape(1, 1, 1, None), {"depth": 1, "width": 1, "reason": "probe"}
        vanilla = 1.0 / self.costs.single
        rate, depth, width = self._best_plan()
        accept = self.accept_rate(width)
        info = {"depth": depth, "width": width, "est_rate": rate, "vanilla_rate": vanilla,
                "est_accept": accept, "model_accepted": model_accepted(accept, depth)}
        if not self.preparation.is_prepared:
            info["prepare_est_s"] = self.prepare_cost()
            if not self.preparation_pays(rate):
                return None, {**info, "depth": 0, "width": 0, "reason": "preparing the draft does not pay"}
        if rate >= vanilla and (realised := self.regime.below_plain(vanilla)) is not None:
            info["reason"], info["realised_rate"] = "realised rate below plain", realised
            rate = 0.0
        if not self.schedule.drafts(rate >= vanilla):
            return None, {**info, "depth": 0, "width": 0, "reason": "no draft pays"}
        if rate < vanilla:
            info["reason"] = "probe"
        depth, width = self._explore(depth, width, info)
        return dynamic_shape(depth, width, width, None), info

    def _explore(self, depth: int, width: int, info: dict) -> tuple[int, int]:
        """The plan, or now and then a level deeper or a neighbouring width (schedule.Schedule)."""
        if info.get("reason") == "probe":  # a probe is the cheapest look at drafting, not a larger one
            return depth, width
        look = self.schedule.exploration()
        if look == "deeper" and depth < self._deepest(width):
            depth += 1
            info.update(depth=depth, reason="explore depth", model_accepted=model_accepted(info["est_accept"], depth))
        elif look in ("wider", "narrower") and len(self.widths) > 1:
            width = neighbour(self.widths, width, look == "wider")
            depth = max(1, min(depth, self._deepest(width)))  # a wider tree stays within what was measured
            info.update(width=width, depth=depth, reason="explore width", est_accept=self.accept_rate(width),
                        model_accepted=model_accepted(self.accept_rate(width), depth))
        return depth, width

    def _deepest(self, width: int) -> int:
        """Near what was measured (fits), and no deeper than one level past what the node choice
        keeps where it cuts most trees (acceptance.KeptLevels)."""
        deepest, cap = self.costs.deepest(width, self.max_depth), self.kept_levels.cap()
        return deepest if cap is None else min(deepest, cap)

    def accept_rates(self) -> dict[int, float]:
        return self.acceptance.rates()

    def accept_rate(self, width: int) -> float:
        return self.acceptance.rates()[width]

    def _correction(self) -> float:
        return self.acceptance.correction()

    _model_accepted = staticmethod(model_accepted)

    def _best_plan(self) -> tuple[float, int, int]:
        """(rate, depth, width) of the best plan near what was measured (search.best_plan)."""
        draft = self.costs.draft.theta()
        verify = None if self.costs.verify.theta() is None else \
            [self.costs.verify_cost(t) for t in range(self.max_nodes + 2)]
        return best_plan(None if draft is None else draft.tolist(), verify,
                         self.acceptance.optimistic(), self.acceptance.correction(),
                         # the tokens still needed (within the budget: a token past it is thrown away)
                         max(self.answer.left() - 1.0, 0.0),  # the step's own (bonus) token is the first of them
                         {w: self._deepest(w) for w in self.widths}, self.max_nodes)

    def node_value(self, logp: torch.Tensor) -> torch.Tensor:
        """log f(q) of each node's draft probability (on the device; summed along paths)."""
        return self.acceptance.node_value(logp)

    def choose_total(self, values: torch.Tensor, levels_fed: int, nodes_fed: int) -> int:
        """How many nodes to verify, from the grown tree's calibrated path values (one transfer)."""
        cap = self.costs.verify_cap(self.max_nodes)
        v = sorted((math.exp(x) for x in values.tolist()), reverse=True)[:cap]
        if not self.costs.drafted or self.costs.draft.prior is None:  # the probe: verify what was drafted
            return len(v)
        single = self.costs.single
        return choose_total(v, self.costs.draft.predict([1, levels_fed, nodes_fed]),
                            lambda n: single if n == 0 and single is not None else self.costs.verify_cost(1 + n))

    # ---- learning --------------------------------------------------------------------------------------
    def observe(self, step: StepStats, view: HostView | None, verdict: Verdict, num_pending: int) -> None:
        plan = step.plan or {}
        depth, width, nodes_fed = plan.get("depth", 0), plan.get("width", 0), plan.get("nodes_fed", 0)
        tokens = num_pending + step.num_draft_nodes
        self.answer.committed(verdict.tokens, self.eos_token_ids)
        # against the fits before this step
        actual = step.verify_s + (step.draft_s if depth and tokens > 1 else 0.0)
        surprise = self.regime.surprised(self.costs.predict(tokens, depth, nodes_fed), actual, tokens > 1,
                                         plan.get("reason") == "probe")
        if surprise:  # the machine changed: what was measured before goes, this step's cost is the first kept
            self.regime.forget()
            self.schedule.remeasure()
            self.costs.forget()
        self.costs.observe(tokens, depth, nodes_fed, step.draft_s, step.verify_s)
        if tokens == 1:
            self.schedule.plain_measured()
        if depth:
            self.regime.drafted(len(verdict.tokens), step.draft_s + step.verify_s)
        if surprise:
            self.costs.regrow()
        if view is not None and step.num_draft_nodes:
            self.acceptance.learn(view, verdict, width, self._predicted(plan, view))
            if depth:
                self.kept_levels.observe(depth, tree_levels(view))

    @staticmethod
    def _predicted(plan: dict, view: HostView) -> float | None:
        """The accepted tokens the per-level model predicted for the tree verified: choose_total may
        have cut the grown tree short, and levels that were not verified could not be accepted (held
        against the grown depth, the shortfall read as the model's optimism: k fell to 0.7 and the
        policy drafted shallower than the best fixed chain)."""
        if not plan.get("model_accepted"):
            return None
        return model_accepted(plan["est_accept"], min(plan["depth"], tree_levels(view)))

    def estimates(self) -> dict:
        """The current estimates, for the stats record (so a user can see why it drafted as it did)."""
        mean = self.mean_length
        return {**self.costs.estimates(), "mean_answer_tokens": None if mean is None else round(mean, 2),
                **self.acceptance.estimates(), **self.preparation.estimates(), "kept_levels_cap": self.kept_levels.cap()}
