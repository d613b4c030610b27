"""The policy's acceptance model: how often the target takes the draft's tokens.

- per tree width w, the chance c_w that the step's path goes one level deeper (the target's token is
  among the w children the draft kept), from the acceptances observed (decayed counts, so it follows
  easy and hard stretches of a run); a width tried little borrows from the next narrower one;
- k, the realised accepted tokens over what the per-level model predicted on recent drafting steps:
  it corrects the model where levels are not independent (a loose verifier's rules, a draft that
  drifts off the target's path after a few tokens);
- how likely each node is to be accepted, from the draft's own probability q of its token,
  calibrated online: f(q) = the observed acceptance rate of nodes whose draft probability fell in
  q's bin (prior f(q) = q). A node's path value is the product of f(q) along its path.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

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


def model_accepted(c: float, depth: int) -> float:
    """Accepted tokens the per-level model expects of a plan `depth` levels deep: sum of c^d."""
    return sum(c ** d for d in range(1, depth + 1))


def path_ranks(view: HostView, path: list[int]) -> tuple[list[int], bool, list[tuple[int, bool]]]:
    """Walk the accepted `path` down the verified tree: the draft rank of each accepted child among
    its siblings (by falling draft score where known), whether the last node reached had children
    (the walk stopped at a miss, not at the tree's end), and (node, accepted) for every child tried."""
    kids = [[] for _ in range(len(view.parents) + 1)]
    for i, p in enumerate(view.parents):
        kids[p + 1].append(i)
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
    return ranks, tried_last, tried


class AcceptanceModel:
    """c_w per width, the realised-over-model correction k, and the calibration f(q)."""

    def __init__(self, widths: list[int], device: torch.device):
        self.widths, self.device = widths, device
        self.accept = {w: Rate(prior=(2.0, 3.0)) for w in widths}
        # realised / predicted accepted tokens on recent drafting steps (the per-level model assumes
        # levels are independent; a loose verifier's rules or a draft that drifts make deep paths rarer)
        self.realised = Rate(prior=(1.0, 1.0), decay=0.9)
        self.calibration = Calibration()
        self._table = torch.tensor(self.calibration.table(), device=device).log()
        self._table_age = 0

    def rates(self) -> dict[int, float]:
        """c_w for every width. A width not tried much borrows from the next narrower one: its prior
        (worth two steps) assumes doubling the width removes 30% of the narrower width's misses."""
        rates, base = {}, None
        for width in self.widths:
            r = self.accept[width]
            prior = None if base is None else 1 - 0.7 * (1 - base)  # 30 % fewer misses than the narrower width
            rates[width] = r.value if base is None else max(base, (r.hits + 2 * prior) / (r.trials + 2))
            base = rates[width]
        return rates

    def optimistic(self) -> dict[int, float]:
        """c_w as plans are chosen by: with optimism for widths tried little (it fades with their
        trials), so one unlucky step does not rule a width out for the rest of the run."""
        return {w: min(0.99, c + 0.3 / (1.0 + self.accept[w].trials)) for w, c in self.rates().items()}

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
        ranks, tried_last, tried = path_ranks(view, verdict.path)
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
            stopped = depth_w < len(ranks) or tried_last
            self.accept[w].add(depth_w, depth_w + int(stopped))
        self._table_age += 1
        if self._table_age >= TABLE_EVERY:  # refresh the device copy now and then (one small host-to-device copy)
            self._table = torch.tensor(self.calibration.table(), device=self.device).log()
            self._table_age = 0

    def estimates(self) -> dict:
        return {"accept_by_width": {str(w): round(c, 4) for w, c in self.rates().items()},
                "realised_over_model": round(self.correction(), 4),
                "calibration": [round(x, 4) for x in self.calibration.table()]}
