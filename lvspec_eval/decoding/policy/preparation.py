"""Preparation economics (draft_prepare=lazy, the default with the adaptive policy): a request's
draft (pruning, its vision tower, its prefill) is prepared only on the first step that drafts, and
only if
    (tokens the answer still needs) x (plain step - 1 / rate) > (expected preparation cost),
or when the cost is under CHEAP_SHARE of decoding the answer's rest plainly (then it is as good as
eager, and every request measures its draft again). The cost is the median, over the run's last
RECENT preparations, of their time over the same request's target prefill time, times this
request's prefill time (a ratio, because a shared machine's load slows both alike; it grows with the
video as both do). The run's first preparation happens unconditionally, to measure it, and after
PREPARE_PROBE requests refused one, then 8, 16, ..., one prepares anyway. The draft then catches up
on the committed tokens.
"""
from __future__ import annotations

import math
import statistics

PREPARE_PROBE = 4  # requests refused a draft preparation before one prepares anyway (then 8, 16, ...)
RECENT = 8  # preparations whose median cost estimates the next one
CHEAP_SHARE = 0.05  # a preparation under this share of the answer's expected plain decoding is always made


class Preparation:
    """What recent preparations cost relative to the same request's target prefill (or, where the
    prefill time is not known, per prompt token); whether this request's draft is ready; and the
    requests refused a preparation since the last one (every PREPARE_PROBE-th, then twice as
    rarely, prepares anyway, so one preparation timed in a load spike cannot rule it out)."""

    def __init__(self):
        self.prepare_ratios: list[float] = []
        self.prepare_per_token_seen: list[float] = []
        self.prompt_tokens = 0
        self.prefill_s: float | None = None
        self.is_prepared = True
        self.refused, self.refused_this_request = 0, False
        self.probe_every = PREPARE_PROBE

    def start(self, prompt_tokens: int, prepared: bool, prefill_s: float | None) -> None:
        """A new request of `prompt_tokens` prompt tokens, a target prefill of `prefill_s` seconds,
        its draft `prepared` or not yet."""
        self.prompt_tokens, self.is_prepared, self.prefill_s = prompt_tokens, prepared, prefill_s
        self.refused += self.refused_this_request
        self.refused_this_request = False

    def observe(self, seconds: float) -> None:
        """The current request's draft was prepared in `seconds`."""
        self.is_prepared = True
        if self.prefill_s:
            self.prepare_ratios = (self.prepare_ratios + [seconds / self.prefill_s])[-RECENT:]
        self.prepare_per_token_seen = (self.prepare_per_token_seen + [seconds / max(self.prompt_tokens, 1)])[-RECENT:]

    def cost(self) -> float | None:
        """Expected seconds to prepare this request's draft (None: never prepared in this run)."""
        if self.prefill_s and self.prepare_ratios:
            return statistics.median(self.prepare_ratios) * self.prefill_s
        if self.prepare_per_token_seen:
            return statistics.median(self.prepare_per_token_seen) * self.prompt_tokens
        return None

    def pays(self, rate: float | None, left: float, single: float | None) -> bool:
        """Whether preparing the draft now is repaid by drafting at `rate` tokens/s instead of
        decoding the answer's `left` tokens plainly at `single` seconds each:
        left x (single - 1 / rate) > `cost()`. Yes when the run has not prepared a draft yet or
        drafted nothing yet (`rate` None): to measure; and when preparing costs under CHEAP_SHARE of
        decoding those tokens plainly (a Sparrow head, a draft on a short video): then it is as good
        as eager, and the drafting steps keep measuring how well the draft does on this request (a
        rate measured in a bad stretch must not rule drafting out). Refused, every PREPARE_PROBE-th
        request refused in a row (then 8, 16, ...) prepares anyway: the costs and the rate are
        estimates too, and only a prepared draft measures them again."""
        cost = self.cost()
        if cost is None or rate is None:
            return True
        if single is not None and cost <= CHEAP_SHARE * left * single:
            return True  # cheap next to the answer's plain decoding: prepare, and measure drafting again
        saving = -math.inf  # drafting does not pay even once prepared
        if single is not None and rate > 1.0 / single:
            saving = left * (single - 1.0 / rate)
        if saving > cost:
            self.refused, self.probe_every = 0, PREPARE_PROBE
            return True
        if self.refused >= self.probe_every:  # a probe; the next one twice as far away
            self.refused, self.probe_every = 0, 2 * self.probe_every
            return True
        self.refused_this_request = True
        return False

    def estimates(self) -> dict:
        return {"prepare_over_prefill": (None if not self.prepare_ratios
                                         else round(statistics.median(self.prepare_ratios), 4))}
