"""The policy's regime detection: has the machine changed, and does drafting really pay?

Its model can be wrong (a shared machine, a cost curve it has not seen). Two checks catch that:
- a step SURPRISE times slower or faster than the fits predict, SURPRISES times in a row of its kind
  (plain or drafting), means the machine changed (a neighbour came or went): the caller re-measures
  the plain step and forgets the fits, so plain decoding and drafting are compared in the same
  stretch. One probe after a back-off that is cheaper than predicted is enough, as probes are rare.
- the rate drafting actually realised over the last RECENT_STEPS drafting steps (tokens committed
  over their time) is held against the plain step: below it, the policy backs off as when no plan
  pays (it drafts only as probes, ever rarer), and the verdict stands until the probes made since
  realise a rate above the plain step's.
"""
from __future__ import annotations

import math

SURPRISE = 1.5  # a step this many times slower (or faster) than its fit predicts is a surprise
SURPRISES = 2  # surprises in a row that mean the machine changed: re-measure the plain step, forget old costs
RECENT_STEPS = 8  # drafting steps whose realised rate is held against the plain step


class Regime:
    """Surprises in a row per kind of step, and the recent drafting steps' realised rate."""

    def __init__(self):
        self.surprises = {False: 0, True: 0}  # per kind (plain, drafting): steps in a row SURPRISE x off
        self.recent: list[tuple[int, float]] = []  # (tokens committed, seconds) of recent drafting steps
        self.backed_off = False  # the realised rate fell below plain: only the probes since can lift that
        self.held = math.inf  # the realised rate that keeps it backed off

    def surprised(self, predicted: float | None, actual: float, drafting: bool, probe: bool) -> bool:
        """Whether this step (`actual` seconds where the fits `predicted` that many) ends a run of
        surprises of its kind: the machine changed."""
        if not predicted or not math.isfinite(predicted) or predicted <= 0:
            return False
        off = actual / predicted
        self.surprises[drafting] = self.surprises[drafting] + 1 if off > SURPRISE or off < 1 / SURPRISE else 0
        cheaper_probe = probe and off < 1 / SURPRISE
        return self.surprises[drafting] >= (1 if cheaper_probe else SURPRISES)

    def forget(self) -> None:
        """The machine changed: count surprises afresh, and judge drafting by the steps to come."""
        self.surprises = {False: 0, True: 0}
        self.recent, self.backed_off = [], False

    def drafted(self, tokens: int, seconds: float) -> None:
        """A drafting step committed `tokens` tokens in `seconds` (drafting and verification)."""
        self.recent = (self.recent + [(tokens, seconds)])[-RECENT_STEPS:]

    def realised_rate(self) -> float:
        """Tokens per second the recent drafting steps committed (inf until two of them)."""
        if len(self.recent) < 2:
            return math.inf
        tokens, seconds = (sum(x) for x in zip(*self.recent))
        return tokens / seconds if seconds > 0 else math.inf

    def below_plain(self, plain_rate: float) -> float | None:
        """The realised rate where it is below `plain_rate` (the model says drafting pays; the steps
        say not), else None. Once below, it stays so (the caller backs off: probes only, ever rarer)
        until the drafting steps made since, the probes, realise at least `plain_rate` together;
        then those steps are the recent ones. (Without that memory the guard switched itself off:
        the steps it dropped left fewer than two, whose rate counts as unknown.)"""
        if not self.backed_off:
            realised = self.realised_rate()
            if realised >= plain_rate:
                return None
            self.backed_off, self.recent, self.held = True, [], realised  # judged by the steps to come
            return realised
        if self.recent:  # the probes since the back-off
            tokens, seconds = (sum(x) for x in zip(*self.recent))
            self.held = tokens / seconds if seconds > 0 else math.inf
            if self.held >= plain_rate:
                self.backed_off = False
                return None
        return self.held
