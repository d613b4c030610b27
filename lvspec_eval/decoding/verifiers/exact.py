"""Exact verification: accept the longest root-to-leaf path on which every draft token equals the
target's greedy choice at its parent, then append the target's token after it (the bonus).
Output is token-identical to greedy decoding of the target (Leviathan et al. 2023 at T=0; the
tree form is SpecInfer / EAGLE's)."""
from __future__ import annotations

from .. import tree
from ..types import EXACT, TARGET, Draft, Scores, Verdict


def greedy_path(tokens: list[int], parents: list[int], target_tokens: list[int]) -> list[int]:
    """Follow the tree from the root while a child carries the target's token at its parent.

    tokens, parents: the draft's nodes (host lists). target_tokens: [num_nodes + 1]; entry 0 is the
    target's choice after the root, entry i + 1 its choice after node i. Siblings carry distinct
    tokens, so the path is unique.
    """
    kids = tree.children(parents)
    path, node = [], -1
    while True:
        nxt = next((c for c in kids[node + 1] if tokens[c] == target_tokens[node + 1]), None)
        if nxt is None:
            return path
        path.append(nxt)
        node = nxt


class ExactVerifier:
    name = "exact"
    hidden_layers: tuple[int, ...] = ()

    def verify(self, draft: Draft, scores: Scores, visual_hidden: dict | None = None) -> Verdict:
        view = scores.host_view(draft)  # the step's one device-to-host transfer
        path = greedy_path(view.tokens, view.parents, view.target)
        last = path[-1] if path else -1
        tokens = [view.tokens[i] for i in path] + [view.target[last + 1]]
        return Verdict(tokens=tokens, path=path, num_cached=len(path), kinds=[EXACT] * len(path) + [TARGET])
