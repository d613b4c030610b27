"""The attention layout of a verification forward, derived from a draft tree's `parents` alone: which
entry each node may see and at which position offset it sits. Built on the parents' device with no
host round trip. decoding/tree.py re-exports both (the drafters build their own forwards with them).

A tree is a list of nodes hanging off the root (the last committed token); node i's parent is
parents[i] (-1 = the root) and parents come before children. A chain is parents [-1, 0, 1, ...].
"""
from __future__ import annotations

import torch


def ancestor_mask(parents: torch.Tensor, max_depth: int | None = None) -> torch.Tensor:
    """[n, n] bool: row i is True at i and at each of its ancestors (what node i may attend to).

    Built on parents' device with no host round trip: start from "self or parent" and square the
    relation until it covers the deepest path (ceil(log2(depth)) boolean matrix products).
    """
    n, device = parents.numel(), parents.device
    onehot = torch.zeros(n, n + 1, dtype=torch.float32, device=device)
    onehot.scatter_(1, (parents + 1).view(-1, 1), 1.0)  # column 0 is the root
    rel = torch.eye(n, device=device) + onehot[:, 1:]
    for _ in range(max(0, (max(max_depth or n, 1) - 1).bit_length())):
        rel = ((rel @ rel) > 0).float()
    return rel > 0


def pending_and_tree_layout(num_pending: int, parents: torch.Tensor,
                            max_depth: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets [p + n] and visibility [p + n, p + n] for pending tokens followed by a tree.

    Pending tokens form a causal chain; the last one is the tree's root, so every node sees all
    pending tokens plus its own ancestors, at offset (p - 1) + depth. Built on parents' device.
    """
    p, n, device = num_pending, parents.numel(), parents.device
    anc = ancestor_mask(parents, max_depth)
    offsets = torch.cat([torch.arange(p, device=device), p - 1 + anc.sum(-1)])
    visible = torch.zeros(p + n, p + n, dtype=torch.bool, device=device)
    visible[:p, :p] = torch.tril(torch.ones(p, p, dtype=torch.bool, device=device))
    visible[p:, :p] = True
    visible[p:, p:] = anc
    return offsets, visible
