"""The policy's acceptance model: how often the target takes the draft's tokens.

- per tree width w (w nodes a level), the chance that the step's path goes one level deeper, from the
  acceptances observed (decayed counts, so it follows easy and hard stretches of a run), in two
  parts: a_w at the first level (the target's token among the root's w best children) and b_w at
  each level below (among the w nodes kept there, spread over the level above: a path that left the
  best branch ends at a node without children, a miss); a plan `depth` deep accepts
  a_w (1 + b_w + ... + b_w^(depth - 1)) tokens. A width tried little borrows from the next narrower one;
- k, the realised accepted tokens over what the per-level model predicted on recent drafting steps:
  it corrects the model where levels are not independent (a loose verifier's rules, a draft that
  drifts off the target's path after a few tokens);
- how likely each node is to be accepted, from the draft's own probability q of its token,
  calibrated online: f(q) = the observed acceptance rate of nodes whose draft probability fell in
  q's bin (prior f(q) = q). A node's path value is the product of f(q) along its path.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from ..staged_upload import StagedUpload
from ..types import HostView, Verdict

NUM_BINS = 10  # calibration bins of the draft's probability
TABLE_EVERY = 8  # observed steps between two refreshes of the calibration table's device copy


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


def model_accepted(c: float | tuple[float, float], depth: int) -> float:
    """Accepted tokens the per-level model expects of a plan `depth` levels deep: with c = (a, b),
    a (1 + b + ... + b^(depth - 1)); a single c is (c, c): sum of c^d."""
    a, b = c if isinstance(c, tuple) else (c, c)
    return sum(a * b ** d for d in range(depth))


def path_ranks(view: HostView, path: list[int]) -> tuple[list[int], bool, list[tuple[int, bool]]]:
    """Walk the accepted `path` down the verified tree: the draft rank of each accepted child among
    its siblings (by falling draft score where known), whether the walk stopped short of the tree's
    deepest level (a miss, not the tree's end), and (node, accepted) for every child tried.

    Stopping short is a miss both where the last node reached had children (none was the target's
    token) and where it had none but the tree went deeper elsewhere: a tree of w nodes a level kept
    other nodes at the next level, so the target's token was not among them. (Counting only the
    first kind overstated wide trees' acceptance: in a dynamic tree most paths that leave the kept
    nodes end at a childless node.)"""
    kids = [[] for _ in range(len(view.parents) + 1)]
    depth = [0] * (len(view.parents) + 1)  # by row: the root's row 0 at depth 0
    for i, p in enumerate(view.parents):
        kids[p + 1].append(i)
        depth[i + 1] = depth[p + 1] + 1
    if view.scores is not None:  # siblings by falling draft score: a child's rank
        kids = [sorted(k, key=lambda c: -view.scores[c]) for k in kids]
    ranks, tried, node, tried_last = [], [], -1, False
    for nxt in path + [None]:
        options = kids[node + 1]
        tried_last = bool(options)
        tried += [(c, c == nxt) for c in options]
        if nxt is None or nxt not in options:  # the end (or a loose verifier's shifted jump)
            break
        ranks.append(options.index(nxt))
        node = nxt
    return ranks, tried_last or depth[node + 1] < max(depth), tried


class AcceptanceModel:
    """(a_w, b_w) per width, the realised-over-model correction k, and the calibration f(q)."""

    def __init__(self, widths: list[int], device: torch.device):
        self.widths, self.device = widths, device
        self.accept = {w: Rate(prior=(2.0, 3.0)) for w in widths}  # a_w: the first level
        self.deeper = {w: Rate(prior=(2.0, 3.0)) for w in widths}  # b_w: each level below
        # realised / predicted accepted tokens on recent drafting steps (the per-level model assumes
        # levels are independent; a loose verifier's rules or a draft that drifts make deep paths rarer)
        self.realised = Rate(prior=(1.0, 1.0), decay=0.9)
        self.calibration = Calibration()
        self._upload = StagedUpload(NUM_BINS, device)  # f per bin; its log on the device
        self._table = self._upload.upload(self.calibration.table()).log()
        self._table_age = 0

    def rates(self) -> dict[int, tuple[float, float]]:
        """(a_w, b_w) for every width. A width not tried much borrows from the next narrower one: its
        prior (worth two steps) assumes doubling the width removes 30% of the narrower width's misses."""
        first, deeper = _borrowing(self.widths, self.accept), _borrowing(self.widths, self.deeper)
        return {w: (first[w], deeper[w]) for w in self.widths}

    def optimistic(self) -> dict[int, tuple[float, float]]:
        """(a_w, b_w) as plans are chosen by: with optimism for widths tried little (it fades with
        their trials), so one unlucky step does not rule a width out for the rest of the run."""
        def lift(c: float, rate: Rate) -> float:
            return min(0.99, c + 0.3 / (1.0 + rate.trials))
        return {w: (lift(a, self.accept[w]), b) for w, (a, b) in self.rates().items()}

    def correction(self) -> float:
        """k, the realised accepted tokens over the model's, within [0.1, 1.5]."""
        return min(1.5, max(0.1, self.realised.value))

    def node_value(self, logp: torch.Tensor) -> torch.Tensor:
        """log f(q) of each node's draft probability (on the device; summed along paths)."""
        bins = (logp.exp() * NUM_BINS).long().clamp(0, NUM_BINS - 1)
        return self._table[bins]

    def learn(self, view: HostView, verdict: Verdict, width: int, predicted: float | None) -> None:
        """A drafting step of `width` verified `view`'s tree and accepted `verdict.path`; the model
        had `predicted` that many accepted tokens (None: no prediction to correct)."""
        ranks, short, tried = path_ranks(view, verdict.path)
        if view.probs is not None:
            for node, accepted in tried:
                self.calibration.add(view.probs[node], accepted)
        if predicted:
            self.realised.add(len(verdict.path), predicted)
        # Every narrower width learns from this step too: under width w the path would have
        # stopped at the first accepted child of rank >= w.
        for w in self.widths:
            if w > max(width, 1):
                break
            depth_w = next((i for i, r in enumerate(ranks) if r >= w), len(ranks))
            stopped = depth_w < len(ranks) or short
            self.accept[w].add(min(depth_w, 1), 1 if depth_w or stopped else 0)
            below = max(depth_w - 1, 0)  # levels passed below the first
            self.deeper[w].add(below, below + int(stopped and depth_w > 0))
        self._table_age += 1
        if self._table_age >= TABLE_EVERY:  # refresh the device copy now and then (an asynchronous copy, no sync)
            self._table = self._upload.upload(self.calibration.table()).log()
            self._table_age = 0

    def estimates(self) -> dict:
        rates = self.rates()
        return {"accept_by_width": {str(w): round(a, 4) for w, (a, _) in rates.items()},
                "accept_deeper_by_width": {str(w): round(b, 4) for w, (_, b) in rates.items()},
                "realised_over_model": round(self.correction(), 4),
                "calibration": [round(x, 4) for x in self.calibration.table()]}


class KeptLevels:
    """How deep the node choice (choose_total) keeps the trees it is given. It cuts the levels whose
    calibrated values do not pay for their verification; where it does so on most recent steps, a
    level drafted more than one past what it keeps is drafting thrown away (a prose prompt of the
    real pair: 7-11 levels drafted a step, 3-5 nodes verified, twice a chain's drafting time).
    Decayed over drafting steps; `cap()` is None where the recent trees were mostly verified whole."""

    decay = 0.8

    def __init__(self):
        self.cut_share, self.kept = 0.0, None  # share of recent steps cut; levels kept where cut

    def observe(self, grown: int, verified: int) -> None:
        cut = verified < grown
        self.cut_share = self.decay * self.cut_share + (1 - self.decay) * cut
        if cut:
            self.kept = verified if self.kept is None else self.decay * self.kept + (1 - self.decay) * verified

    def cap(self) -> int | None:
        """The deepest plan worth drafting: one level past what is kept, where most steps are cut."""
        if self.kept is None or self.cut_share <= 0.5:
            return None
        return max(1, math.ceil(self.kept)) + 1


def tree_levels(view: HostView) -> int:
    """The depth of a verified tree (parents come before their children)."""
    levels: list[int] = []
    for p in view.parents:
        levels.append(1 if p < 0 else levels[p] + 1)
    return max(levels, default=0)


def _borrowing(widths: list[int], observed: dict[int, Rate]) -> dict[int, float]:
    """Each width's rate; one tried little leans on the next narrower one's: that one's rate, 30 %
    fewer misses, is its prior, and it is never below that one where that one was seen as often
    (a narrower width seen less is mostly its own prior: no floor)."""
    rates, narrower = {}, None
    for width in widths:
        r = observed[width]
        if narrower is None:
            rates[width] = r.value
        else:
            base = rates[narrower]
            prior = 1 - 0.7 * (1 - base)
            own = (r.hits + 2 * prior) / (r.trials + 2)
            rates[width] = max(base, own) if observed[narrower].trials >= r.trials else own
        narrower = width
    return rates
