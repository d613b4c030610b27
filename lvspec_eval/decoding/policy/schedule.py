"""The policy's schedule: when to measure a plain step, when to probe, when to look elsewhere.

- The run's first step decodes without a draft (to measure the plain step); after PLAIN_SPACING and
  then every REFRESH_EVERY drafting steps one plain step keeps that measurement current.
- Where no plan is expected to pay, it probes (drafts anyway) after 1, 2, 4, ... steps without a
  draft, so a run can recover; also at the first such step of every request, since how well a
  draft follows depends on the request.
- Every EXPLORE_EVERY-th drafting step tries a neighbouring width (alternately wider and narrower),
  so the cost of a draft level and of a node can be told apart and every width's acceptance keeps
  being measured, and halfway between two of those one step drafts a level deeper than the best
  plan, so a deeper plan whose first measurement was slow (a new shape's one-time cost) is measured again.
"""
from __future__ import annotations

REFRESH_EVERY = 50  # drafting steps between two plain steps that re-measure the one-token step
PLAIN_SPACING = 8  # the second plain step comes after this many drafting steps, the next ones REFRESH_EVERY apart
EXPLORE_EVERY = 8  # every this many drafting steps, one tries a neighbouring tree width (and one a level deeper)


class Schedule:
    """Counters of plain, skipped and drafting steps, and what they make this step."""

    def __init__(self):
        self.since_single = 0  # drafting steps since the last plain step
        self.num_single = 0  # plain steps measured so far
        self.skipped = 0  # steps decoded without a draft since the last probe
        self.probe_every = 1
        self.drafting_steps = 0

    def plain_due(self) -> bool:
        """Whether this step should be a plain one that re-measures the one-token step: after
        PLAIN_SPACING drafting steps, then every REFRESH_EVERY (a run's first steps carry one-time
        costs; later ones drift). (After 2, 4, 8, 16 and 32, a run of about a hundred steps spent five
        of them plain: with drafting steps committing seven tokens each, 3 % of its rate.)"""
        if self.since_single >= min(REFRESH_EVERY, PLAIN_SPACING ** self.num_single):
            self.since_single = 0
            return True
        return False

    def plain_measured(self) -> None:
        self.num_single += 1
        self.since_single = 0

    def remeasure(self) -> None:
        """The machine changed: the next step is a plain one, and the plain steps' spacing restarts."""
        self.since_single = REFRESH_EVERY
        self.num_single = min(self.num_single, 1)

    def new_request(self) -> None:
        """A new request probes at its first step where no draft is expected to pay: how well a draft
        follows depends on the request (a pruned draft at 4,096 visual tokens hardly ever, at 256
        mostly), and a back-off grown over hard requests would leave short easy ones undrafted."""
        self.skipped = self.probe_every

    def first_probe(self) -> None:
        """The run's first draft (one token: the cheapest look at drafting's costs)."""
        self.since_single += 1

    def drafts(self, pays: bool) -> bool:
        """Whether this step drafts, where a plan is (`pays`) or is not expected to pay: then only as
        a probe, after 1, 2, 4, ... steps without a draft."""
        if not pays:
            self.skipped += 1
            if self.skipped < self.probe_every:
                return False
            self.probe_every *= 2  # probe again, less often each time it does not pay
        else:
            self.probe_every = 1
        self.skipped = 0
        self.since_single += 1
        self.drafting_steps += 1
        return True

    def exploration(self) -> str | None:
        """What this drafting step looks at beside the best plan: 'deeper', 'wider', 'narrower' or None."""
        if self.drafting_steps % EXPLORE_EVERY == EXPLORE_EVERY // 2:
            return "deeper"
        if self.drafting_steps % EXPLORE_EVERY == 0:
            return "wider" if (self.drafting_steps // EXPLORE_EVERY) % 2 else "narrower"
        return None
