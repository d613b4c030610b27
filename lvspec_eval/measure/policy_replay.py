"""Replays of recorded drafting, for judging a policy in hindsight (tests/test_policy_hindsight.py).

A recording is what a draft says along the target's own answer, read once with teacher forcing:
for every output position s, the draft's rank of the target's greedy token there (`ranks[s]`;
NUM_RANKS: not among the draft's NUM_RANKS best) and the draft's probabilities of its best tokens
(`probs[s]`, falling). An exact method commits the target's tokens whatever it drafts, so a step
that starts with t tokens committed drafts its path along positions t, t+1, ...: the recording
answers every shape's acceptance at every step.

The replayed draft (ReplayDraft) answers each position with the recorded probabilities (every node at
a position reads the same row: what the draft says off the target's path is not recorded), and the
drafters' own Grower grows the tree of a shape from it, so the policy's node values and node choice
run as in a real step; the target's path through it is accepted. A fixed shape's steps are replayed
on plain floats (`fixed_step`, held equal to the Grower by the test). Steps cost what a `CostCurve`
says. The rate of a run is tokens committed over seconds spent, over all its answers (decode only:
prefill is the same for every shape).
"""
from __future__ import annotations

import bisect
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..decoding.drafters.growth import Grower
from ..decoding.tree import Shape
from ..decoding.types import Draft, HostView, StepStats, Verdict

NUM_RANKS = 8  # ranks recorded per position; a target token beyond them is recorded as NUM_RANKS


@dataclass(frozen=True)
class Recording:
    """One answer: per output position, the draft's rank of the target's token and its best probabilities."""

    ranks: tuple[int, ...]  # [num_tokens]; NUM_RANKS = beyond the recorded ranks
    probs: tuple[tuple[float, ...], ...]  # [num_tokens][<= NUM_RANKS], falling

    def __post_init__(self):
        if len(self.ranks) != len(self.probs):
            raise ValueError(f"Recording: {len(self.ranks)} ranks but {len(self.probs)} probability rows")
        if any(not 0 <= r <= NUM_RANKS for r in self.ranks):
            raise ValueError(f"Recording: ranks must lie in 0..{NUM_RANKS}, got {sorted(set(self.ranks))}")
        if any(list(row) != sorted(row, reverse=True) or len(row) > NUM_RANKS for row in self.probs):
            raise ValueError(f"Recording: each probability row must fall and hold at most {NUM_RANKS} values")

    def prob(self, position: int, rank: int) -> float:
        row = self.probs[position]
        return row[rank] if rank < len(row) else 0.0


@dataclass(frozen=True)
class CostCurve:
    """Seconds of a target forward over t tokens (measured points, interpolated in log t; past the
    last point along the last segment) and of drafting: `draft_level` per level plus `draft_node`
    per node fed after the first level."""

    verify_points: tuple[tuple[int, float], ...]  # ((tokens, seconds), ...), tokens rising, from 1
    draft_level: float
    draft_node: float

    def __post_init__(self):
        tokens = [t for t, _ in self.verify_points]
        if len(tokens) < 2 or tokens[0] != 1 or tokens != sorted(set(tokens)):
            raise ValueError(f"CostCurve: verify_points need rising token counts from 1, got {tokens}")

    def verify(self, tokens: int) -> float:
        xs = [math.log(t) for t, _ in self.verify_points]
        ys = [s for _, s in self.verify_points]
        i = min(max(bisect.bisect_right(xs, math.log(tokens)) - 1, 0), len(xs) - 2)
        slope = (ys[i + 1] - ys[i]) / (xs[i + 1] - xs[i])
        return ys[i] + slope * (math.log(tokens) - xs[i])

    def draft(self, depth: int, nodes_fed: int) -> float:
        return self.draft_level * depth + self.draft_node * nodes_fed


VOCAB = 64  # the replayed draft's vocabulary: token r is its rank-r guess; the rest share what is left


class ReplayDraft:
    """A draft that says what the recording says: at output position p, token r (r < NUM_RANKS) has
    the recorded probability of the rank-r guess, the other tokens share the rest. Every node at
    the same position reads the same row (what the draft would say off the target's path is not
    recorded); the target's token at p is token ranks[p] (none where beyond the recorded ranks)."""

    def __init__(self, recording: Recording):
        rows = []
        for row in recording.probs:
            rest = max(1.0 - sum(row), 1e-6) / (VOCAB - len(row))
            rows.append(list(row) + [rest] * (VOCAB - len(row)))
        self.logp = torch.tensor(rows).clamp_min(1e-9).log()  # [num_tokens, VOCAB]
        self.rows = self.logp.tolist()
        self.ranks = recording.ranks

    def logits(self, position: int) -> torch.Tensor:
        return self.logp[min(position, len(self.ranks) - 1)]

    def target(self, position: int) -> int:
        return self.ranks[position] if position < len(self.ranks) and self.ranks[position] < NUM_RANKS else -1


def grow(draft: ReplayDraft, start: int, shape: Shape, value=None, total=None, plan=None) -> Draft:
    """The tree the drafters' Grower grows for `shape` with `start` tokens committed."""
    def feed(tokens, visible, parent_rows, depth):  # nodes of level `depth` predict position start + depth
        return draft.logits(start + depth).expand(tokens.numel(), VOCAB)

    grower = Grower(torch.device("cpu"))
    return grower.grow(shape, draft.logits(start), feed, value=value, total=total, plan=plan)


def accepted_path(draft: ReplayDraft, start: int, tree: Draft) -> list[int]:
    """The nodes an exact verifier accepts: from the root, the child holding the target's token."""
    tokens, parents = tree.tokens.tolist(), tree.parents.tolist()
    path, node = [], -1
    while True:
        want = draft.target(start + len(path))
        nxt = next((i for i, (t, p) in enumerate(zip(tokens, parents)) if p == node and t == want), None)
        if nxt is None:
            return path
        path.append(nxt)
        node = nxt


def fixed_step(draft: ReplayDraft, start: int, depth: int, width: int, total: int | None) -> tuple[int, int]:
    """(accepted tokens, nodes verified) of `dynamic_shape(depth, width, width, total)` grown with
    `start` tokens committed: what `grow` and `accepted_path` give, on plain floats (the hindsight
    search replays dozens of shapes; tests/test_policy_hindsight.py holds the two equal)."""
    level, nodes = [(0.0, True)], []  # (cumulative draft log-prob, on the target's path)
    for d in range(1, depth + 1):
        row, want = draft.rows[min(start + d - 1, len(draft.rows) - 1)], draft.target(start + d - 1)
        if d > 1:  # the `width` best of the level above grow children (topk: ties to the first)
            level = sorted(level, key=lambda node: -node[0])[:width]
        level = [(v + row[r], on and r == want) for v, on in level for r in range(width)]
        nodes += [(v - 1e-9 * d, on) for v, on in level]
    if total is not None and total < len(nodes):
        nodes = sorted(nodes, key=lambda node: -node[0])[:total]
    return sum(on for _, on in nodes), len(nodes)


def fixed_rate(recordings: Sequence[Recording], curve: CostCurve, depth: int, width: int,
               total: int | None = None) -> float:
    """Tokens per second of drafting `dynamic_shape(depth, width, width, total)` every step (EAGLE-2's
    ranking by draft log-probability)."""
    tokens, seconds, fed = 0, 0.0, width * (depth - 1)
    for rec in recordings:
        draft, done = ReplayDraft(rec), 1  # the prefill's token is the first
        while done < len(rec.ranks):
            accepted, nodes = fixed_step(draft, done, depth, width, total)
            done += min(accepted + 1, len(rec.ranks) - done)
            seconds += curve.draft(depth, fed) + curve.verify(1 + nodes)
        tokens += len(rec.ranks) - 1
    return tokens / seconds


def fixed_shapes(max_depth: int = 8, widths: Sequence[int] = (1, 2, 4)) -> list[tuple[int, int, int | None]]:
    """The fixed shapes (depth, width, total) held against the policy: chains of 1..max_depth, and
    per width and depth the dynamic tree with all its nodes and cut to width x depth nodes."""
    shapes = [(d, 1, None) for d in range(1, max_depth + 1)]
    for width in (w for w in widths if w > 1):
        shapes += [(1, width, None)] + [(d, width, t) for d in range(2, max_depth + 1) for t in (None, width * d)]
    return shapes


def best_fixed(recordings: Sequence[Recording], curve: CostCurve,
               shapes: Sequence[tuple[int, int, int | None]] | None = None) -> tuple[float, tuple]:
    """(rate, (depth, width, total)) of the best fixed shape in hindsight."""
    return max((fixed_rate(recordings, curve, *shape), shape) for shape in (shapes or fixed_shapes()))


def _nodes_fed(shape: Shape) -> int:
    return sum(lv.expand if isinstance(lv.expand, int) else len(lv.expand) for lv in shape.levels[1:])


def _view(tree: Draft) -> HostView:
    n = tree.num_nodes
    return HostView(tokens=tree.tokens.tolist(), parents=tree.parents.tolist(), scores=tree.scores.tolist(),
                    probs=tree.probs.tolist(), target=[0] * (n + 1), margins=[1.0] * (n + 1))


def _policy_step(policy, draft: ReplayDraft, done: int, curve: CostCurve) -> tuple[int, float]:
    """One step of the policy with `done` tokens committed: (tokens committed, seconds)."""
    shape, plan = policy.plan(done)
    if shape is None:
        policy.observe(StepStats(0, 0, 0.0, curve.verify(1), plan), None, Verdict([0], [], 0, ["target"]), 1)
        return 1, curve.verify(1)
    plan["nodes_fed"] = _nodes_fed(shape)

    def total(values: torch.Tensor) -> int:  # as TreePlanner.grow
        plan["nodes"] = policy.choose_total(values, shape.depth - 1, plan["nodes_fed"])
        return plan["nodes"]

    tree = grow(draft, done, shape, policy.node_value, total, plan)
    path = accepted_path(draft, done, tree)
    draft_s, verify_s = curve.draft(shape.depth, plan["nodes_fed"]), curve.verify(1 + tree.num_nodes)
    verdict = Verdict([0] * (len(path) + 1), path, len(path), ["exact"] * len(path) + ["target"])
    step = StepStats(tree.num_nodes, len(path), draft_s, verify_s, plan)
    policy.observe(step, _view(tree) if tree.num_nodes else None, verdict, 1)
    return min(len(path) + 1, len(draft.ranks) - done), draft_s + verify_s


def policy_rate(recordings: Sequence[Recording], curve: CostCurve, make_policy: Callable[[], object]) -> float:
    """Tokens per second of one policy run over `recordings` in order (one policy, as in one bench run)."""
    policy, tokens, seconds = make_policy(), 0, 0.0
    for rec in recordings:
        policy.start_sample(len(rec.ranks) - 1, 0, True, None)
        draft, done = ReplayDraft(rec), 1
        while done < len(rec.ranks):
            committed, spent = _policy_step(policy, draft, done, curve)
            done, seconds = done + committed, seconds + spent
        tokens += len(rec.ranks) - 1
    return tokens / seconds


def load_recordings(path: str | Path) -> dict[str, list[Recording]]:
    """Recordings per prompt set from a JSON file {set: [{"ranks": [...], "probs": [[...], ...]}, ...]}."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return {name: [Recording(tuple(r["ranks"]), tuple(tuple(p) for p in r["probs"])) for r in recs]
            for name, recs in data.items()}


def save_recordings(path: str | Path, sets: dict[str, list[Recording]], digits: int = 3) -> None:
    data = {name: [{"ranks": list(r.ranks), "probs": [[round(p, digits) for p in row] for row in r.probs]}
                   for r in recs] for name, recs in sets.items()}
    Path(path).write_text(json.dumps(data, separators=(",", ":")) + "\n", encoding="utf-8")
