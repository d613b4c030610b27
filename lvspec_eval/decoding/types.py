"""The small values that flow through the decoding loop.

The draft, its scores and the verdict (`Draft`, `Scores`, `HostView`, `Verdict` and the kinds of a
committed token) are what a backend scores and commits: they are defined in backends/types.py (with
the vocabulary: root, pending, draft, verdict) and re-exported here, so that decoding/ reads them
from one place and backends/ needs nothing of decoding/. What only the loop and its stats use is here.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..backends.types import EXACT, LOOSE, PST, TARGET, Draft, HostView, Scores, Verdict

__all__ = ["EXACT", "LOOSE", "PST", "TARGET", "Draft", "HostView", "Preparation", "Scores", "StepStats", "Verdict"]


@dataclass
class StepStats:
    num_draft_nodes: int
    num_accepted: int
    draft_s: float
    verify_s: float
    plan: dict | None = None  # the draft policy's choice and estimates for this step, if any


@dataclass
class Preparation:
    """What getting a drafter ready for its first proposal cost (its draft-side work): selecting the
    kept video tokens (pruned drafts), the draft's input embeddings (its vision tower), and its
    prefill. `at`: how many tokens the request had generated when the draft was prepared (0: before
    the first, as `draft_prepare=eager` does; later: the adaptive policy started drafting there and
    the draft caught up on the committed tokens)."""

    at: int
    prune_s: float = 0.0
    draft_vision_s: float = 0.0
    draft_prefill_s: float = 0.0
    kept_visual_tokens: int | None = None  # None: the drafter keeps no visual tokens of its own choice

    @property
    def total_s(self) -> float:
        return self.prune_s + self.draft_vision_s + self.draft_prefill_s

    def as_dict(self) -> dict:
        return {"prune_s": self.prune_s, "draft_vision_s": self.draft_vision_s,
                "draft_prefill_s": self.draft_prefill_s, "draft_prepare_s": self.total_s,
                "draft_prepared_at": self.at, "kept_visual_tokens": self.kept_visual_tokens}
