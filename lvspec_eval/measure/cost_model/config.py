"""What one cost-model run times: which pairs and drafters, at which visual-token counts and scale,
with which acceptance lengths (tau) and draft tree (CostConfig, checked at construction)."""
from __future__ import annotations

from dataclasses import dataclass, field

from .architectures import PAIRS, Scale

DRAFTERS = ("full", "pruned", "sparrow")
# Assumed when no measurement is given: Sparrow's published tau (3.8); the two model drafts a
# little lower, the pruned one below the full one (SpecVLM reports small losses from pruning).
DEFAULT_TAU = {"full": 3.0, "pruned": 2.8, "sparrow": 3.8}
GPU_VISUAL_TOKENS = (256, 1024, 4096, 8192, 16384, 25000)
CPU_VISUAL_TOKENS = (256, 1024, 4096)


@dataclass
class CostConfig:
    pairs: tuple[str, ...] = tuple(PAIRS)
    drafters: tuple[str, ...] = DRAFTERS
    visual_tokens: tuple[int, ...] = GPU_VISUAL_TOKENS
    scale: Scale = field(default_factory=Scale)
    taus: dict = field(default_factory=lambda: dict(DEFAULT_TAU))
    tau_source: str = "assumed"
    depth: int = 5  # draft tree levels
    level_width: int = 8  # nodes expanded per level: the dynamic tree's top-k (SpecVLM's widest level)
    tree_nodes: int = 25  # draft nodes verified per step (26 with the root)
    prune_ratio: float = 0.9
    new_tokens: int = 256  # generated tokens, for the end-to-end figure
    prompt_tokens: int = 64  # text tokens around the video
    repeats: int = 5
    device: str = "cpu"
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    seed: int = 0

    def __post_init__(self):
        for name, allowed in (("pairs", PAIRS), ("drafters", DRAFTERS)):
            bad = [v for v in getattr(self, name) if v not in allowed]
            if bad:
                raise ValueError(f"{name} {bad}; allowed: {', '.join(allowed)}")
        if not 0 <= self.prune_ratio < 1:
            raise ValueError(f"prune_ratio={self.prune_ratio}; expected 0 <= ratio < 1")
        for name in ("depth", "level_width", "tree_nodes", "new_tokens", "prompt_tokens", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)}; expected a positive integer")
        if any(n < 1 for n in self.visual_tokens):
            raise ValueError(f"visual_tokens {self.visual_tokens}; expected positive counts")
