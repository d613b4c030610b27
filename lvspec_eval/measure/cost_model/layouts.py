"""The shape of one speculative step, as the timings feed it: the verified tree's layout (SpecVLM's
shape, cut or grown to `tree_nodes`), the nodes a commit keeps, one draft level, the draft's tree
config. Pure functions of the settings: no model, no clock."""
from __future__ import annotations

import torch

from ...decoding import tree
from .config import CostConfig


def verify_paths(num_nodes: int) -> list[tuple[int, ...]]:
    """The verified tree's nodes as rank paths, parents first (SpecVLM's shape, cut or grown)."""
    paths = sorted(tree.SPECVLM_26, key=lambda p: (len(p), p))[:num_nodes]
    while len(paths) < num_nodes:  # deeper along rank 0 when more nodes are asked for
        paths.append(paths[-1] + (0,))
    return paths


def verify_layout(num_nodes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Offsets and visibility of the root plus a tree of num_nodes."""
    paths = verify_paths(num_nodes)
    index = {p: i for i, p in enumerate(paths)}
    parents = torch.tensor([index.get(p[:-1], -1) for p in paths], dtype=torch.long)
    return tree.pending_and_tree_layout(1, parents)


def accepted_length(tau: float) -> int:
    """Draft tokens accepted in a typical step."""
    return max(0, round(tau))


def commit_indices(num_nodes: int, num_accepted: int) -> list[int]:
    """Temporary cache indices a commit keeps after verify_layout's forward: the root (0) and the
    rank-0 path of num_accepted nodes (node i sits at 1 + i; the path is not contiguous, so the
    commit gathers and copies, as after a real step)."""
    index = {p: i for i, p in enumerate(verify_paths(num_nodes))}
    path = [index[(0,) * d] for d in range(1, num_accepted + 1) if (0,) * d in index]
    return [0] + [1 + i for i in path]


def draft_tree_config(cfg: CostConfig) -> tree.TreeConfig:
    """The tree the model drafter grows: EAGLE-2 dynamic, level_width nodes fed per level."""
    return tree.TreeConfig(kind="dynamic", depth=cfg.depth, topk=cfg.level_width, total=cfg.tree_nodes)


def level_layout(width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """One draft tree level: `width` sibling nodes, each seeing the committed cache and itself."""
    return torch.zeros(width, dtype=torch.long), torch.eye(width, dtype=torch.bool)
