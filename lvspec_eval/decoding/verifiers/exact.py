"""Exact verification: accept the longest root-to-leaf path on which every draft token equals the
target's greedy choice at its parent, then append the target's token after it (the bonus).
Output is token-identical to greedy decoding of the target (Leviathan et al. 2023 at T=0; the
tree form is SpecInfer / EAGLE's)."""
from __future__ import annotations

import torch

from .. import tree
from ..types import EXACT, TARGET, Draft, Scores, Verdict


def greedy_path(draft: Draft, target_tokens: torch.Tensor) -> list[int]:
    """Follow the tree from the root while a child carries the target's token at its parent.

    target_tokens: [num_nodes + 1]; entry 0 is the target's choice after the root, entry i + 1
    its choice after node i. Siblings carry distinct tokens, so the path is unique.
    """
    kids = tree.children(draft.parents)
    tokens = draft.tokens.tolist()
    want = target_tokens.tolist()
    path, node = [], -1
    while True:
        nxt = next((c for c in kids[node + 1] if tokens[c] == want[node + 1]), None)
        if nxt is None:
            return path
        path.append(nxt)
        node = nxt


class ExactVerifier:
    name = "exact"
    hidden_layers: tuple[int, ...] = ()

    def verify(self, draft: Draft, scores: Scores, visual_hidden: dict | None = None) -> Verdict:
        target = scores.logits.argmax(-1)
        path = greedy_path(draft, target)
        last = path[-1] if path else -1
        tokens = [int(draft.tokens[i]) for i in path] + [int(target[last + 1])]
        return Verdict(tokens=tokens, path=path, num_cached=len(path), kinds=[EXACT] * len(path) + [TARGET])
