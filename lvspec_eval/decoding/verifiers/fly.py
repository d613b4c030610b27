"""FLy: training-free loose verification driven by the target's own uncertainty (SPEC.md section 5).

On a chain of k draft tokens, with m_i = [draft_i == target argmax at position i]:
  1. entropy gate: a mismatch where H_i < fly_entropy is a hard rejection, H_i being the entropy
     of the target's top-3 full-softmax probabilities at i (not renormalised: loose.topk_entropy);
  2. deferred window W = fly_window: a mismatch that passes the gate is accepted when the next
     W - 1 positions all match exactly (the target "comes back" to the draft); a mismatch in the
     last W positions of the chain cannot be salvaged (too little evidence after it);
  3. commit the draft up to the first position not accepted, then the target's token there (or
     the bonus after a fully accepted chain).
An accepted mismatch keeps the draft's token (kind LOOSE). Every later target prediction was made
with that token in context, so all accepted nodes keep their KV (num_cached = len(path)).
FLy reads no visual signal. With fly_entropy = inf every mismatch is hard-rejected: exact
verification. On a tree draft it runs along loose.draft_chain (exact child first, else the
draft's favourite), which for a chain is the chain itself.
"""
from __future__ import annotations

from typing import ClassVar

from ..types import EXACT, LOOSE, TARGET, Draft, Scores, Verdict
from . import loose

RULES = {
    "fly_entropy": loose.Option(0.3, float, "hard-reject a mismatch when the target's top-3 entropy (nats) is "
                                "below this; inf = exact verification", low=0.0),
    "fly_window": loose.Option(6, int, "deferred window W: a mismatch needs the next W-1 tokens to match", low=1),
    "fly_k": loose.Option(15, int, "draft chain length (sets tree_depth; the method drafts a chain)", low=1),
}


def fly_accept(match: list[bool], entropy: list[float], theta: float, window: int) -> list[str]:
    """Kinds (EXACT / LOOSE) of the accepted prefix of a chain of len(match) draft tokens.

    >>> fly_accept([True, False, True, True], [0.0, 0.9, 0.0, 0.0], theta=0.3, window=3)
    ['exact']
    >>> fly_accept([True, False, True, True, True], [0.0, 0.9, 0.0, 0.0, 0.0], theta=0.3, window=3)
    ['exact', 'loose', 'exact', 'exact', 'exact']
    """
    k, kinds = len(match), []
    for i, ok in enumerate(match):
        if ok:
            kinds.append(EXACT)
            continue
        if entropy[i] < theta or i >= k - window or not all(match[i + 1: i + window]):
            break
        kinds.append(LOOSE)
    return kinds


class FlyVerifier:
    name = "fly"
    hidden_layers: tuple[int, ...] = ()
    OPTIONS: ClassVar[dict] = {name: rule.default for name, rule in RULES.items()}  # name -> default

    def __init__(self, fly_entropy: float = 0.3, fly_window: int = 6, fly_k: int = 15):
        values = loose.parse_options({"fly_entropy": fly_entropy, "fly_window": fly_window, "fly_k": fly_k},
                                     RULES, ("fly_",), "FLy")
        self.entropy, self.window, self.k = values["fly_entropy"], values["fly_window"], values["fly_k"]

    @classmethod
    def from_options(cls, extra: dict) -> FlyVerifier:
        """From DecodeOptions.extra; unknown fly_* keys raise ValueError listing the known ones."""
        return cls(**loose.parse_options(extra, RULES, ("fly_",), "FLy"))

    def __repr__(self) -> str:
        return f"FlyVerifier(entropy={self.entropy}, window={self.window}, k={self.k})"

    def verify(self, draft: Draft, scores: Scores, visual_hidden: dict | None = None) -> Verdict:
        # the entropy of every row travels with the step's one transfer (rows are few)
        view = scores.host_view(draft, extra=(loose.topk_entropy(scores.logits),))
        chain = loose.draft_chain(view)
        rows = [parent + 1 for parent in [-1] + chain[:-1]][: len(chain)]  # logits row judging each node
        proposed = [view.tokens[c] for c in chain]
        match = [t == view.target[r] for t, r in zip(proposed, rows)]
        entropy = [view.extra[0][r] for r in rows]
        kinds = fly_accept(match, entropy, self.entropy, self.window)
        path = chain[: len(kinds)]
        last = path[-1] if path else -1
        tokens = proposed[: len(kinds)] + [view.target[last + 1]]
        return Verdict(tokens=tokens, path=path, num_cached=len(path), kinds=kinds + [TARGET])
