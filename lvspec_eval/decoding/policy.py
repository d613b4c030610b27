"""Cost-aware adaptive drafting (`tree=adaptive`): choose each step's draft from what the run measures.

Speculation pays when the tokens a step commits outweigh what the step costs against plain
decoding. Both sides depend on the pair and the hardware: on a CPU a 17-node verification costs
2-2.5x a one-token step, on a GPU about the same as one token; a 0.5B draft costs a third of a
1.5B target, the demo's draft an eighth. So the policy measures, per run and on the device in use:

- what a plain one-token target step costs:    step                          (median of the recent ones)
- what a target forward over t >= 2 tokens costs: verify(t) = a + b t         (online least squares;
  kept apart from the one-token step, which often takes another kernel path: on this project's CPU a
  2-token forward can cost 2-5x a 1-token one, on a GPU about the same)
- what drafting costs:                         draft(L, F) = r + c L + e F   (L levels fed, F nodes fed)
- how often the target takes the draft's token: per tree width w, the chance c_w that the step's
  path goes one level deeper (the target's token is among the w children the draft kept), from the
  acceptances it observes (decayed counts, so it follows easy and hard stretches of a run);
- how likely each node is to be accepted, from the draft's own probability q of its token,
  calibrated online: f(q) = the observed acceptance rate of nodes whose draft probability fell in
  q's bin (prior f(q) = q).

Each step it picks the plan (depth D, width w) with the highest expected rate
    rate(D, w) = (1 + k sum_{d=1..D} c_w^d) / (draft(D - 1, w (D - 1)) + verify(1 + w D)),
where k, the realised accepted tokens over what the per-level model predicted on recent drafting
steps, corrects the model where levels are not independent (a loose verifier's rules, a
draft that drifts off the target's path after a few tokens),
or no draft at all when plain decoding, rate 1 / step, is faster (the expected accepted tokens are
capped by what the answer still needs, from the run's mean answer length: after the letter of a
multiple-choice answer nothing is left to draft for) (then it probes again after
1, 2, 4, ... steps, so a run can recover; also at the first such step of every request, since how
well a draft follows depends on the request). The run's first step decodes without a draft (to measure
`step`), its second drafts one token (to measure drafting and a small verification), and every
after 2, 4, ... and then every REFRESH_EVERY drafting steps one plain step keeps `step` current;
every EXPLORE_EVERY-th drafting step tries a neighbouring width, so the cost of a draft level and
of a node can be told apart and every width's acceptance keeps being measured, and halfway between
two of those one step drafts a level deeper than the best plan (within the growth guard below), so
a deeper plan whose first measurement was slow (a new shape's one-time cost) is measured again.
After growing the tree it keeps the n nodes with the highest calibrated path values v (the product
of f(q) along the path: the chance that the path to the node is accepted), n maximising
(1 + sum of the n best v) / (draft so far + verify(1 + n)). Three guards keep it from losing where
its model is wrong (a shared machine, a cost curve it has not seen). It never draws a plan whose
cost it has not measured: a plan verifies at most GROWTH times the most tokens verified so far and
drafts at most one level deeper than before, so trees grow step by step from measured costs
instead of from the fits' extrapolation. A step SURPRISE times slower or faster than its fit predicts, SURPRISES times in a row, means the machine changed
(a neighbour came or went): the next step re-measures the plain step and the fits forget what came
before, so plain decoding and drafting are compared in the same stretch. And the rate drafting
actually realised over the last RECENT_STEPS drafting steps (tokens committed over their time) is
held against the plain step: below it, the policy backs off as when no plan pays.
Preparing the draft (draft_prepare=lazy, the default with this policy): a request's draft (pruning,
its vision tower, its prefill) is prepared only on the first step that drafts, and only if
    (tokens the answer still needs) x (plain step - 1 / rate) > (expected preparation cost),
or when the cost is under CHEAP_SHARE of decoding the answer's rest plainly (then it is as good
as eager, and every request measures its draft again). The cost is the median, over the run's last
RECENT preparations, of their time over the same request's target prefill time, times this
request's prefill time (a ratio, because a shared machine's load slows both alike; it grows with
the video as both do). The run's first preparation
happens unconditionally, to measure it, and after PREPARE_PROBE requests refused one, then 8, 16, ...,
one prepares anyway. The draft then catches up on the committed tokens.
Anchors: transformers' assisted generation (a draft length that grows and shrinks), SpecDec++ (stop
where the predicted rejection probability is high), EAGLE-2 (confidence-ranked dynamic trees).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from .tree import Shape, dynamic_shape
from .types import HostView, StepStats, Verdict

NUM_BINS = 10  # calibration bins of the draft's probability
REFRESH_EVERY = 50  # drafting steps between two plain steps that re-measure the one-token step
EXPLORE_EVERY = 8  # every this many drafting steps, one tries a neighbouring tree width (and one a level deeper)
PREPARE_PROBE = 4  # requests refused a draft preparation before one prepares anyway (then 8, 16, ...)
RECENT = 8  # preparations whose median cost estimates the next one
CHEAP_SHARE = 0.05  # a preparation under this share of the answer's expected plain decoding is always made
GROWTH = 2  # a plan verifies at most GROWTH x the most tokens verified so far, and drafts one level deeper
SURPRISE = 1.5  # a step this many times slower (or faster) than its fit predicts is a surprise
SURPRISES = 2  # surprises in a row that mean the machine changed: re-measure the plain step, forget old costs
RECENT_STEPS = 8  # drafting steps whose realised rate is held against the plain step


class OnlineLinear:
    """Least squares y = theta . x with exponential forgetting and a weak prior (ridge towards
    `prior`, worth about `prior_weight` observations), so a fit exists from the first observation.
    Plain numpy on the host: these are a few numbers per step, never device tensors."""

    def __init__(self, num_features: int, decay: float = 0.98, prior_weight: float = 1.0):
        self.decay, self.prior_weight = decay, prior_weight
        self.xtx = np.zeros((num_features, num_features))
        self.xty = np.zeros(num_features)
        self.prior: np.ndarray | None = None
        self.count = 0
        self._theta: np.ndarray | None = None

    def add(self, x: list[float], y: float) -> None:
        v = np.asarray(x, dtype=np.float64)
        self.xtx = self.decay * self.xtx + np.outer(v, v)
        self.xty = self.decay * self.xty + v * y
        self.count += 1
        self._theta = None

    def reset(self) -> None:
        """Forget every observation and the prior (the machine changed): the next one sets both."""
        self.xtx, self.xty = np.zeros_like(self.xtx), np.zeros_like(self.xty)
        self.prior, self.count, self._theta = None, 0, None

    def theta(self) -> np.ndarray | None:
        if self.prior is None:
            return None
        if self._theta is None:
            # the ridge is scaled to the features' size so the prior counts like a few observations
            scale = np.maximum(np.diagonal(self.xtx) / max(self.count, 1), 1.0)
            reg = self.prior_weight * np.diag(scale)
            a, b = self.xtx + reg, self.xty + reg @ self.prior
            theta = np.linalg.solve(a, b)
            # Costs are not negative. Clipping a negative coefficient to 0 would keep the others
            # fitted beside it (a negative intercept with a steep slope, clipped, predicts every
            # larger forward too dear: a run stayed at one-level drafts for that); instead the
            # others are fitted again with it held at 0.
            free = theta >= 0
            if not free.all():
                theta = np.zeros_like(theta)
                if free.any():
                    theta[free] = np.clip(np.linalg.solve(a[np.ix_(free, free)], b[free]), 0.0, None)
            self._theta = theta
        return self._theta

    def predict(self, x: list[float]) -> float:
        th = self.theta()
        return float(th @ np.asarray(x, dtype=np.float64)) if th is not None else math.nan


@dataclass
class Rate:
    """A decayed success rate with a prior (successes, trials)."""

    prior: tuple[float, float]
    decay: float = 0.97
    hits: float = 0.0
    trials: float = 0.0

    def add(self, hits: int, trials: int) -> None:
        self.hits = self.decay * self.hits + hits
        self.trials = self.decay * self.trials + trials

    @property
    def value(self) -> float:
        return (self.hits + self.prior[0]) / (self.trials + self.prior[1])


@dataclass
class Calibration:
    """f(q): the acceptance rate of draft nodes whose draft probability q fell in each bin."""

    decay: float = 0.995
    hits: list[float] = field(default_factory=lambda: [0.0] * NUM_BINS)
    trials: list[float] = field(default_factory=lambda: [0.0] * NUM_BINS)

    @staticmethod
    def bin(q: float) -> int:
        return min(int(q * NUM_BINS), NUM_BINS - 1)

    def add(self, q: float, accepted: bool) -> None:
        b = self.bin(q)
        self.hits = [h * self.decay for h in self.hits]
        self.trials = [t * self.decay for t in self.trials]
        self.hits[b] += accepted
        self.trials[b] += 1

    def table(self) -> list[float]:
        """f per bin; the prior is the bin's mid probability, worth one observation."""
        return [(h + (b + 0.5) / NUM_BINS) / (t + 1) for b, (h, t) in enumerate(zip(self.hits, self.trials))]


class AdaptivePolicy:
    """Per-run estimates and the per-step choice of draft shape (see the module docstring)."""

    def __init__(self, max_depth: int, max_width: int, max_nodes: int, device: torch.device,
                 eos_token_ids: frozenset[int] = frozenset()):
        self.eos_token_ids = eos_token_ids  # an answer's length counts up to its end token
        self.max_depth, self.max_nodes, self.device = max_depth, max_nodes, device
        self.widths = [w for w in (1, 2, 4, 8, 16) if w <= max_width] or [1]
        # weak priors (a tenth of an observation): the first step of a run can carry one-time costs
        self.verify = OnlineLinear(2, prior_weight=0.1)  # [1, tokens]
        self.draft = OnlineLinear(3, prior_weight=0.1)  # [1, levels fed, nodes fed]
        self.accept = {w: Rate(prior=(2.0, 3.0)) for w in self.widths}
        # realised / predicted accepted tokens on recent drafting steps (the per-level model assumes
        # levels are independent; a loose verifier's rules or a draft that drifts make deep paths rarer)
        self.realised = Rate(prior=(1.0, 1.0), decay=0.9)
        self.calibration = Calibration()
        self._table = torch.tensor(self.calibration.table(), device=device).log()
        self._table_age = 0
        self.single: float | None = None  # cost of a plain one-token step: the median of the recent ones
        self.plain_times: list[float] = []  # the last RECENT_STEPS plain steps' seconds (a spike moves no median)
        # decayed mean answer length (tokens) per request budget (max_new_tokens, which lmms-eval sets
        # per task): a run of multiple-choice and caption tasks keeps one mean for each
        self.mean_lengths: dict[int | None, float] = {}
        self.budget: int | None = None  # the current request's max_new_tokens
        # Preparing the draft (draft_prepare=lazy): what recent preparations cost relative to the same
        # request's target prefill (a ratio: a shared machine's load slows both alike) or, where the
        # prefill time is not known, per prompt token; whether this request's draft is ready; and
        # the requests refused a preparation since the last one (every PREPARE_PROBE-th, then twice
        # as rarely, prepares anyway, so one preparation timed in a load spike cannot rule it out)
        self.prepare_ratios: list[float] = []
        self.prepare_per_token_seen: list[float] = []
        self.prompt_tokens = 0
        self.prefill_s: float | None = None
        self.is_prepared = True
        self.refused, self.refused_this_request = 0, False
        self.prepare_probe_every = PREPARE_PROBE
        self.sample_tokens = 0  # tokens committed so far in the current sample
        self.generated = 0  # tokens the current sample had when this step was planned
        self.skipped = 0  # steps decoded without a draft since the last probe
        self.probe_every = 1
        self.since_single = 0  # drafting steps since the last plain step
        self.num_single = 0  # plain steps measured so far
        self.drafting_steps = 0
        self.max_tokens, self.max_levels = 1, 0  # the largest verification and draft depth measured
        self.surprises = {False: 0, True: 0}  # per kind (plain, drafting): steps in a row SURPRISE x off
        self.recent: list[tuple[int, float]] = []  # (tokens committed, seconds) of recent drafting steps

    # ---- choosing ---------------------------------------------------------------------------------
    def start_sample(self, budget: int | None = None, prompt_tokens: int = 0, prepared: bool = True,
                     prefill_s: float | None = None) -> None:
        """A new request with `budget` max_new_tokens, `prompt_tokens` prompt tokens and a target
        prefill of `prefill_s` seconds, its draft `prepared` or not yet: fold the last one's length
        into the mean answer length of the last one's budget. Requests are told apart by budget because lmms-eval sets it
        per task and runs one task's requests after another's: with one mean for the run, ten
        one-letter answers of a multiple-choice task made the next task's captions undrafted."""
        if self.sample_tokens:
            n, mean = self.sample_tokens, self.mean_lengths.get(self.budget)
            self.mean_lengths[self.budget] = n if mean is None else 0.8 * mean + 0.2 * n
        self.sample_tokens = 0
        self.budget = budget
        self.prompt_tokens, self.is_prepared, self.prefill_s = prompt_tokens, prepared, prefill_s
        self.refused += self.refused_this_request
        self.refused_this_request = False
        # A new request probes at its first step where no draft is expected to pay: how well a draft
        # follows depends on the request (a pruned draft at 4,096 visual tokens hardly ever, at 256
        # mostly), and a back-off grown over hard requests would leave short easy ones undrafted.
        self.skipped = self.probe_every

    def observe_preparation(self, seconds: float) -> None:
        """The current request's draft was prepared in `seconds`: learn what preparing costs."""
        self.is_prepared = True
        if self.prefill_s:
            self.prepare_ratios = (self.prepare_ratios + [seconds / self.prefill_s])[-RECENT:]
        self.prepare_per_token_seen = (self.prepare_per_token_seen + [seconds / max(self.prompt_tokens, 1)])[-RECENT:]

    def prepare_cost(self) -> float | None:
        """Expected seconds to prepare this request's draft (None: never prepared in this run)."""
        if self.prefill_s and self.prepare_ratios:
            return float(np.median(self.prepare_ratios)) * self.prefill_s
        if self.prepare_per_token_seen:
            return float(np.median(self.prepare_per_token_seen)) * self.prompt_tokens
        return None

    def preparation_pays(self, rate: float | None) -> bool:
        """Whether preparing the draft now (pruning, its vision tower, its prefill) is repaid by
        drafting at `rate` tokens/s instead of decoding plainly for the rest of the answer:
        (tokens left) x (plain step - 1 / rate) > `prepare_cost()`. The tokens left are what the answer
        is expected to need (`remaining`), within the request's budget. Yes when the run has not
        prepared a draft yet or drafted nothing yet (`rate` None): to measure; and when preparing
        costs under CHEAP_SHARE of decoding those tokens plainly (a Sparrow head, a draft on a short
        video): then it is as good as eager, and the drafting steps keep measuring how well the draft
        does on this request (a rate measured in a bad stretch must not rule drafting out). Refused, every
        PREPARE_PROBE-th request refused in a row (then 8, 16, ...) prepares anyway: the costs and
        the rate are estimates too, and only a prepared draft measures them again."""
        cost = self.prepare_cost()
        if cost is None or rate is None:
            return True
        left = self.remaining()
        if self.budget:
            left = min(left, self.budget - self.generated)
        if self.single is not None and cost <= CHEAP_SHARE * left * self.single:
            return True  # cheap next to the answer's plain decoding: prepare, and measure drafting again
        saving = -math.inf  # drafting does not pay even once prepared
        if self.single is not None and rate > 1.0 / self.single:
            saving = left * (self.single - 1.0 / rate)
        if saving > cost:
            self.refused, self.prepare_probe_every = 0, PREPARE_PROBE
            return True
        # The estimates behind the refusal (drafting's rate too) were measured on earlier requests;
        # a prepared draft is what re-measures them, so now and then one is prepared anyway.
        if self.refused >= self.prepare_probe_every:  # a probe; the next one twice as far away
            self.refused, self.prepare_probe_every = 0, 2 * self.prepare_probe_every
            return True
        self.refused_this_request = True
        return False

    @property
    def mean_length(self) -> float | None:
        """The mean answer length of requests with the current one's budget (None: none seen yet)."""
        return self.mean_lengths.get(self.budget)

    def remaining(self) -> float:
        """Tokens the answer is still expected to need: the run's mean length minus what this one
        has, but never under a quarter of the mean (an answer longer than most goes on). A one-token
        answer (multiple choice) leaves nothing to draft for: no step pays for a draft there."""
        if self.mean_length is None:
            return math.inf
        return max(self.mean_length - self.generated, self.mean_length / 4)

    def plan(self, num_generated: int = 0) -> tuple[Shape | None, dict]:
        """This step's shape (None: no draft) and the estimates behind the choice."""
        self.generated = num_generated
        # measure the plain step: first thing, then after 2, 4, 8, ... drafting steps, at most
        # REFRESH_EVERY apart (a run's first steps carry one-time costs; later ones drift)
        if self.single is None or self.since_single >= min(REFRESH_EVERY, 2 ** self.num_single):
            self.since_single = 0
            return None, {"depth": 0, "width": 0, "reason": "measure a plain step"}
        if self.remaining() <= 1.0:  # the answer is expected to end with this step's own token
            return None, {"depth": 0, "width": 0, "reason": "answer ends"}
        if self.verify.prior is None:  # nothing drafted yet: a one-token probe (cheapest draft)
            self.since_single += 1
            return dynamic_shape(1, 1, 1, None), {"depth": 1, "width": 1, "reason": "probe"}
        vanilla = 1.0 / self.single
        rate, depth, width = self._best_plan()
        accept = self.accept_rate(width)
        info = {"depth": depth, "width": width, "est_rate": rate, "vanilla_rate": vanilla,
                "est_accept": accept, "model_accepted": self._model_accepted(accept, depth)}
        if not self.is_prepared:
            info["prepare_est_s"] = self.prepare_cost()
            if not self.preparation_pays(rate):
                return None, {**info, "depth": 0, "width": 0, "reason": "preparing the draft does not pay"}
        if rate >= vanilla and self._realised_rate() < vanilla:  # the model says it pays; the steps say not
            info["reason"], info["realised_rate"] = "realised rate below plain", self._realised_rate()
            self.recent = self.recent[len(self.recent) // 2:]  # the next probes decide afresh
            rate = 0.0
        if rate < vanilla:
            self.skipped += 1
            if self.skipped < self.probe_every:
                return None, {**info, "depth": 0, "width": 0, "reason": "no draft pays"}
            self.probe_every *= 2  # probe again, less often each time it does not pay
            info["reason"] = "probe"
        else:
            self.probe_every = 1
        self.skipped = 0
        self.since_single += 1
        self.drafting_steps += 1
        if self.drafting_steps % EXPLORE_EVERY == EXPLORE_EVERY // 2 and depth < self._deepest(width) \
                and info.get("reason") != "probe":  # (a probe is the cheapest look, not a deeper one)
            # one level deeper now and then: a level's cost is known only from plans of several levels,
            # and one slow first measurement (a new shape's one-time cost) must not rule depth out
            depth += 1
            info.update(depth=depth, reason="explore depth", model_accepted=self._model_accepted(accept, depth))
        elif self.drafting_steps % EXPLORE_EVERY == 0 and len(self.widths) > 1:
            # a neighbouring width now and then: the draft-cost fit can only tell what a level costs
            # from what a node costs when both vary, and acceptance per width needs trials
            i = self.widths.index(width)
            width = self.widths[i + 1] if (self.drafting_steps // EXPLORE_EVERY) % 2 and i + 1 < len(self.widths) \
                else self.widths[max(i - 1, 0)] if i else self.widths[1]
            depth = max(1, min(depth, self._deepest(width)))  # a wider tree stays within what was measured
            info.update(width=width, depth=depth, reason="explore width", model_accepted=self._model_accepted(
                self.accept_rate(width), depth))
        return dynamic_shape(depth, width, width, None), info

    def _deepest(self, width: int) -> int:
        """The deepest plan of `width` whose cost is known well enough: at most GROWTH x the most
        tokens verified so far, and one level deeper than the deepest draft so far."""
        by_tokens = (GROWTH * max(self.max_tokens, 2) - 1) // width
        return min(self.max_depth, self.max_levels + 1, by_tokens)

    def _realised_rate(self) -> float:
        """Tokens per second the recent drafting steps committed (inf until two of them)."""
        if len(self.recent) < 2:
            return math.inf
        tokens, seconds = (sum(x) for x in zip(*self.recent))
        return tokens / seconds if seconds > 0 else math.inf

    def accept_rates(self) -> dict[int, float]:
        """c_w for every width. A width not tried much borrows from the next narrower one: its prior
        (worth two steps) assumes doubling the width removes 30% of the narrower width's misses."""
        rates, base = {}, None
        for width in self.widths:
            r = self.accept[width]
            rates[width] = r.value if base is None else max(base, (r.hits + 2 * (1 - 0.7 * (1 - base))) / (r.trials + 2))
            base = rates[width]
        return rates

    def accept_rate(self, width: int) -> float:
        return self.accept_rates()[width]

    def _best_plan(self) -> tuple[float, int, int]:
        """(rate, depth, width) of the plan with the highest expected rate (ties: the deeper, then
        the wider). Runs every step, so what does not depend on the depth (the fits, each width's
        acceptance, the correction) is read once and the loop is plain float arithmetic."""
        draft, verify = self.draft.theta(), self.verify.theta()
        if draft is None or verify is None:  # no cost measured yet: nothing to compare
            return 0.0, self.max_depth, self.widths[-1]
        (r, per_level, per_node), (a, per_token) = draft.tolist(), verify.tolist()
        useful = max(self.remaining() - 1.0, 0.0)  # the step's own (bonus) token is the first of them
        k = self._correction()
        best = (-math.inf, 0, 0)
        for width, rate in self.accept_rates().items():
            # optimism for widths tried little (it fades with their trials), so one unlucky step
            # does not rule a width out for the rest of the run
            c = min(0.99, rate + 0.3 / (1.0 + self.accept[width].trials))
            accepted, c_d = 0.0, 1.0  # sum of c^d' for d' <= depth, as _model_accepted(c, depth)
            for depth in range(1, self._deepest(width) + 1):  # only plans near what was measured
                c_d *= c
                accepted += c_d
                expected = 1.0 + min(useful, k * accepted)
                cost = r + a + per_token * (1 + min(width * depth, self.max_nodes)) \
                    + (per_level + per_node * width) * (depth - 1)
                candidate = (expected / cost if cost > 0 else 0.0, depth, width)
                if candidate > best:
                    best = candidate
        return best

    @staticmethod
    def _model_accepted(c: float, depth: int) -> float:
        return sum(c ** d for d in range(1, depth + 1))

    def _correction(self) -> float:
        return min(1.5, max(0.1, self.realised.value))

    def node_value(self, logp: torch.Tensor) -> torch.Tensor:
        """log f(q) of each node's draft probability (on the device; summed along paths)."""
        bins = (logp.exp() * NUM_BINS).long().clamp(0, NUM_BINS - 1)
        return self._table[bins]

    def choose_total(self, values: torch.Tensor, levels_fed: int, nodes_fed: int) -> int:
        """How many nodes to verify, from the grown tree's calibrated path values (one transfer)."""
        cap = min(self.max_nodes, GROWTH * max(self.max_tokens, 2) - 1)  # never verify far past what was measured
        v = sorted(math.exp(x) for x in values.tolist())[::-1][:cap]
        if self.verify.prior is None or self.draft.prior is None:  # the probe: verify what was drafted
            return len(v)
        spent = self.draft.predict([1, levels_fed, nodes_fed])
        best_n, best, gain = 0, -1.0, 1.0
        for n in range(len(v) + 1):
            gain += v[n - 1] if n else 0.0
            verify = self.single if n == 0 and self.single is not None else self.verify.predict([1, 1 + n])
            rate = gain / (spent + verify)
            if rate > best:
                best_n, best = n, rate
        return best_n

    # ---- learning ---------------------------------------------------------------------------------
    def observe(self, step: StepStats, view: HostView | None, verdict: Verdict, num_pending: int) -> None:
        plan = step.plan or {}
        depth, width = plan.get("depth", 0), plan.get("width", 0)
        tokens = num_pending + step.num_draft_nodes
        ends = [i for i, t in enumerate(verdict.tokens) if t in self.eos_token_ids]
        self.sample_tokens = self.generated + (ends[0] + 1 if ends else len(verdict.tokens))
        surprise = self._surprise(step, tokens, depth, plan.get("nodes_fed", 0))  # against the fits before this step
        if surprise:  # the machine changed: what was measured before goes, this step's cost is the first kept
            self._forget_costs()
        if tokens == 1:  # a plain one-token step
            self.num_single += 1
            self.plain_times = (self.plain_times + [step.verify_s])[-RECENT_STEPS:]
            self.single = float(np.median(self.plain_times))
            self.since_single = 0
        else:
            self.max_tokens = max(self.max_tokens, tokens)
            self.verify.add([1, tokens], step.verify_s)
            if self.verify.prior is None:
                t = step.verify_s
                self.verify.prior = np.array([t, 0.05 * t])
        if depth:
            self.max_levels = max(self.max_levels, depth)
            self.recent = (self.recent + [(len(verdict.tokens), step.draft_s + step.verify_s)])[-RECENT_STEPS:]
            self.draft.add([1, depth - 1, plan.get("nodes_fed", 0)], step.draft_s)
        if self.draft.prior is None and depth:
            unit = step.draft_s / depth
            self.draft.prior = np.array([unit, unit, 0.05 * unit])
        if surprise:  # plans grow again from a one-token draft: larger ones are not measured in this regime
            self.max_tokens, self.max_levels = 2, 1
        if view is None or not step.num_draft_nodes:
            return
        kids = [[] for _ in range(len(view.parents) + 1)]
        for i, p in enumerate(view.parents):
            kids[p + 1].append(i)
        if view.scores is not None:  # siblings by falling draft score: a child's rank
            kids = [sorted(k, key=lambda c: -view.scores[c]) for k in kids]
        ranks, node, tried_last = [], -1, False
        for nxt in verdict.path + [None]:
            options = kids[node + 1]
            tried_last = bool(options)
            for c in options:
                if view.probs is not None:
                    self.calibration.add(view.probs[c], c == nxt)
            if nxt is None or nxt not in options:  # the end (or a loose verifier's shifted jump)
                break
            ranks.append(options.index(nxt))
            node = nxt
        if plan.get("model_accepted"):
            self.realised.add(len(verdict.path), plan["model_accepted"])
        # Every narrower width learns from this step too: under width w the path would have
        # stopped at the first accepted child of rank >= w.
        for w in self.widths:
            if w > max(width, 1):
                break
            depth_w = next((i for i, r in enumerate(ranks) if r >= w), len(ranks))
            stopped = depth_w < len(ranks) or tried_last
            self.accept[w].add(depth_w, depth_w + int(stopped))
        self._table_age += 1
        if self._table_age >= 8:  # refresh the device copy now and then (one small host-to-device copy)
            self._table = torch.tensor(self.calibration.table(), device=self.device).log()
            self._table_age = 0

    def _surprise(self, step: StepStats, tokens: int, depth: int, nodes_fed: int) -> bool:
        """Whether this step ends a run of steps whose cost was SURPRISE x off what the fits predicted
        (SURPRISES in a row of its kind, plain or drafting: one slow step is noise; one probe after a
        back-off that is cheaper than predicted is enough, as probes are rare): the machine changed."""
        if tokens == 1:
            predicted, actual = self.single, step.verify_s
        else:
            predicted = self.verify.predict([1, tokens]) if self.verify.prior is not None else None
            if depth and self.draft.prior is not None and predicted is not None:
                predicted += self.draft.predict([1, depth - 1, nodes_fed])
            actual = step.verify_s + (step.draft_s if depth else 0.0)
        if not predicted or not math.isfinite(predicted) or predicted <= 0:
            return False
        off, kind = actual / predicted, tokens > 1
        self.surprises[kind] = self.surprises[kind] + 1 if off > SURPRISE or off < 1 / SURPRISE else 0
        cheaper_probe = (step.plan or {}).get("reason") == "probe" and off < 1 / SURPRISE
        return self.surprises[kind] >= (1 if cheaper_probe else SURPRISES)

    def _forget_costs(self) -> None:
        """A neighbour came or went: measure the plain step next (its median restarts from the steps
        after this), and drop the measured costs: this step's sets the fits' priors anew, as a run's
        first one does."""
        self.surprises = {False: 0, True: 0}
        self.since_single = REFRESH_EVERY  # the next step is a plain one
        self.num_single, self.plain_times = min(self.num_single, 1), []
        for fit in (self.verify, self.draft):
            fit.reset()
        self.recent = []

    def estimates(self) -> dict:
        """The current estimates, for the stats record (so a user can see why it drafted as it did)."""
        def fit(model: OnlineLinear) -> list[float] | None:
            th = model.theta()  # seconds: [intercept, per token] / [intercept, per level, per node]
            return None if th is None else [round(float(x), 6) for x in th]

        return {"step_cost": None if self.single is None else round(self.single, 6),
                "mean_answer_tokens": None if self.mean_length is None else round(self.mean_length, 2),
                "verify_cost_fit": fit(self.verify), "draft_cost_fit": fit(self.draft),
                "accept_by_width": {str(w): round(c, 4) for w, c in self.accept_rates().items()},
                "realised_over_model": round(self._correction(), 4),
                "prepare_over_prefill": (None if not self.prepare_ratios
                                         else round(float(np.median(self.prepare_ratios)), 4)),
                "calibration": [round(x, 4) for x in self.calibration.table()]}
