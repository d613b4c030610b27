"""The small values that flow through the decoding loop.

Vocabulary (used everywhere in `decoding/`):
- root: the last committed token. Its target KV entry may not exist yet: committed tokens whose
  KV has not been computed are "pending" and are fed at the front of the next target forward.
- draft: a tree of proposed tokens hanging off the root. A chain is a tree whose parents are
  [-1, 0, 1, ...]. Node i's parent is `parents[i]` (-1 = the root); parents come before children.
- verdict: what a verifier decided: the committed tokens (draft tokens accepted along one
  root-to-leaf path, then one token chosen by the target: the "bonus"), and how many of the
  accepted nodes keep their KV entries (a prefix of the path whose context is exactly what was
  committed). The rest of the committed tokens become pending.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

# How a committed token got there (per-token records in stats):
EXACT, LOOSE, PST, TARGET = "exact", "loose", "pst", "target"


@dataclass(frozen=True)
class Draft:
    tokens: torch.Tensor  # [num_nodes] long
    parents: torch.Tensor  # [num_nodes] long; -1 = the root; parents[i] < i
    scores: torch.Tensor | None = None  # [num_nodes] draft cumulative log-prob, if known

    @property
    def num_nodes(self) -> int:
        return int(self.tokens.numel())

    @staticmethod
    def empty(device: torch.device | str = "cpu") -> "Draft":
        z = torch.zeros(0, dtype=torch.long, device=device)
        return Draft(tokens=z, parents=z.clone())


@dataclass(frozen=True)
class Scores:
    """The target's verification forward over [pending..., root, nodes...]."""

    logits: torch.Tensor  # [num_nodes + 1, vocab]: row 0 predicts after the root, row i+1 after node i
    hidden: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [num_pending + num_nodes, hidden]
    num_pending: int = 1  # rows of `hidden` before the nodes; the root is row num_pending - 1


@dataclass(frozen=True)
class Verdict:
    tokens: list[int]  # committed this step, in order; the last one is the target's (bonus)
    path: list[int]  # draft node indices whose tokens are committed (in commit order)
    num_cached: int  # the first num_cached nodes of `path` keep their target KV entries
    kinds: list[str]  # per committed token: EXACT, LOOSE, PST or TARGET
    relevance: list[float | None] | None = None  # per committed token, when the verifier computes it

    @property
    def num_accepted(self) -> int:
        """Draft tokens accepted this step (the bonus is not counted, as in the papers)."""
        return len(self.tokens) - 1


@dataclass
class StepStats:
    num_draft_nodes: int
    num_accepted: int
    draft_s: float
    verify_s: float
