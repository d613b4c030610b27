"""The policy's cost model: what the run's forwards cost, measured on the device in use.

- a plain one-token target step:                  `single` (the median of the last PLAIN_STEPS)
- a target forward over t >= 2 tokens:            verify(t), the decayed mean measured at t, read
  between measured counts along log t (CostTable: the cost is concave in t), and past the largest
  measured along the slope of verify(t) = a + b t (online least squares). A 2-token forward can take
  another kernel path than the 1-token step (on this project's CPU 2-5x it, on a GPU about the same)
- drafting:                                       draft(L, F) = r + c L + e F   (L levels fed, F nodes fed)

and the largest verification and draft depth measured so far: a plan verifies at most GROWTH times
the most tokens verified so far and drafts at most GROWTH times as deep as before, so trees grow
step by step from measured costs instead of from the fits' extrapolation.
"""
from __future__ import annotations

import math
import statistics

import numpy as np

GROWTH = 2  # a plan verifies at most GROWTH x the most tokens verified so far, and drafts GROWTH x as deep
PLAIN_STEPS = 8  # plain steps whose median is the plain step's cost (a spike moves no median)


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
            theta, free = np.linalg.solve(a, b), np.ones(len(b), dtype=bool)
            # Costs are not negative. Clipping a negative coefficient to 0 would keep the others
            # fitted beside it (a negative intercept with a steep slope, clipped, predicts every
            # larger forward too dear: a run stayed at one-level drafts for that); instead the
            # others are fitted again with it held at 0, until none is negative (a refit can turn
            # another one negative; each round holds at least one more at 0, so it ends).
            while (theta < 0).any():
                free &= theta >= 0
                theta = np.zeros_like(theta)
                if free.any():
                    theta[free] = np.linalg.solve(a[np.ix_(free, free)], b[free])
            self._theta = theta
        return self._theta

    def predict(self, x: list[float]) -> float:
        th = self.theta()
        return float(th @ np.asarray(x, dtype=np.float64)) if th is not None else math.nan


class CostTable:
    """Seconds of a target forward per token count measured: a decayed mean per count, read between
    counts along log t. A forward's cost is concave in its tokens on a CPU (the real pair: 2 tokens
    306 ms, 4 351, 8 421, 16 513): one straight line through it, fitted where the run drafted,
    overprices small verifications next to large ones (fitted on 8-16 tokens it put a 3-token
    verification 6 % above its cost, so a wide or deep tree looked better than a short chain)."""

    def __init__(self, decay: float = 0.9):
        self.decay = decay
        self.sums: dict[int, tuple[float, float]] = {}  # tokens -> (decayed seconds, decayed weight)

    def add(self, tokens: int, seconds: float) -> None:
        total, weight = self.sums.get(tokens, (0.0, 0.0))
        self.sums[tokens] = (self.decay * total + seconds, self.decay * weight + 1.0)

    def reset(self) -> None:
        self.sums = {}

    def predict(self, tokens: int, single: float | None, line: OnlineLinear) -> float:
        """The mean at `tokens` where measured; between two measured counts (the plain step `single`
        counts as t = 1) along log t; past the largest measured along `line`'s slope."""
        points = sorted((t, s / w) for t, (s, w) in self.sums.items())
        if single is not None:
            points = [(1, single)] + [p for p in points if p[0] > 1]
        if not points:
            return line.predict([1, tokens])
        below = [p for p in points if p[0] <= tokens]
        above = [p for p in points if p[0] >= tokens]
        if below and above:
            (t0, s0), (t1, s1) = below[-1], above[0]
            if t0 == t1:
                return s0
            return s0 + (s1 - s0) * (math.log(tokens) - math.log(t0)) / (math.log(t1) - math.log(t0))
        (t0, s0) = below[-1] if below else above[0]
        slope = line.theta()[1] if line.theta() is not None else 0.0
        return s0 + slope * (tokens - t0)


class CostModel:
    """The plain step's cost, the verification and drafting fits, and how far plans have grown."""

    def __init__(self):
        # weak priors (a tenth of an observation): the first step of a run can carry one-time costs
        self.verify = OnlineLinear(2, prior_weight=0.1)  # [1, tokens]: the slope past what was measured
        self.verify_table = CostTable()  # what each verification size measured
        self.draft = OnlineLinear(3, prior_weight=0.1)  # [1, levels fed, nodes fed]
        self.single: float | None = None  # cost of a plain one-token step: the median of the recent ones
        self.plain_times: list[float] = []  # the last PLAIN_STEPS plain steps' seconds
        self.max_tokens, self.max_levels = 1, 0  # the largest verification and draft depth measured
        self._memo_key, self._memo = None, {}  # verify_cost's answers while nothing new was observed

    @property
    def drafted(self) -> bool:
        """Whether a drafting step was measured (before: nothing to compare plans by)."""
        return self.verify.prior is not None

    def observe(self, tokens: int, depth: int, nodes_fed: int, draft_s: float, verify_s: float) -> None:
        """A step verified `tokens` tokens (1: a plain step) in `verify_s` after drafting `depth`
        levels (`nodes_fed` nodes fed after the first level) in `draft_s`."""
        if tokens == 1:
            self.plain_times = (self.plain_times + [verify_s])[-PLAIN_STEPS:]
            self.single = statistics.median(self.plain_times)  # a few floats: no numpy call
        else:
            self.max_tokens = max(self.max_tokens, tokens)
            self.verify.add([1, tokens], verify_s)
            self.verify_table.add(tokens, verify_s)
            if self.verify.prior is None:
                self.verify.prior = np.array([verify_s, 0.05 * verify_s])
        if depth:
            self.max_levels = max(self.max_levels, depth)
            self.draft.add([1, depth - 1, nodes_fed], draft_s)
            if self.draft.prior is None:
                unit = draft_s / depth
                self.draft.prior = np.array([unit, unit, 0.05 * unit])

    def predict(self, tokens: int, depth: int, nodes_fed: int) -> float | None:
        """What the fits say such a step costs (its drafting included when known; None: no fit yet)."""
        if tokens == 1:
            return self.single
        if self.verify.prior is None:
            return None
        predicted = self.verify_cost(tokens)
        if depth and self.draft.prior is not None:
            predicted += self.draft.predict([1, depth - 1, nodes_fed])
        return predicted

    def verify_cost(self, tokens: int) -> float:
        """Seconds to verify `tokens` tokens (with the root): the cost table where it reaches. Kept
        until the next observation: a step's plan search asks for the same few sizes ~100 times."""
        key = (self.single, self.verify.count, self.verify.prior is None)
        if self._memo_key != key:
            self._memo_key, self._memo = key, {}
        cost = self._memo.get(tokens)
        if cost is None:
            cost = self._memo[tokens] = self.verify_table.predict(tokens, self.single, self.verify)
        return cost

    def forget(self) -> None:
        """The machine changed: the plain step's median restarts, the fits start afresh."""
        self.plain_times = []
        self._memo_key = None
        self.verify_table.reset()
        for fit in (self.verify, self.draft):
            fit.reset()

    def regrow(self) -> None:
        """Plans grow again from a one-token draft: larger ones are not measured in this regime."""
        self.max_tokens, self.max_levels = 2, 1

    def deepest(self, width: int, max_depth: int) -> int:
        """The deepest plan of `width` whose cost is known well enough: at most GROWTH x the most
        tokens verified so far, and GROWTH x the deepest draft so far (at least one level deeper).
        (One level a step, a run of about a hundred steps spent a tenth of them growing to the
        depth a high-acceptance draft pays at: 0.93 of the best fixed chain in the hindsight replay.)"""
        by_tokens = (GROWTH * max(self.max_tokens, 2) - 1) // width
        return min(max_depth, max(GROWTH * self.max_levels, self.max_levels + 1), by_tokens)

    def verify_cap(self, max_nodes: int) -> int:
        """The most nodes a step may verify: never far past what was measured."""
        return min(max_nodes, GROWTH * max(self.max_tokens, 2) - 1)

    def estimates(self) -> dict:
        def fit(model: OnlineLinear) -> list[float] | None:
            th = model.theta()  # seconds: [intercept, per token] / [intercept, per level, per node]
            return None if th is None else [round(float(x), 6) for x in th]

        return {"step_cost": None if self.single is None else round(self.single, 6),
                "verify_cost_fit": fit(self.verify), "draft_cost_fit": fit(self.draft)}
