"""UV-Prune's visual-token scores (ParallelVLM, arXiv 2603.19610): how much closer each video token
moves to the text across the target's early layers, from hidden states alone (no attention maps,
so the target's prefill may run FlashAttention; and no attention-score position bias).

    score_j = cos(h_j^(l2), t^(l2)) - cos(h_j^(l1), t^(l1))

h^(l): the prompt's hidden state after decoder layer l (backends.Backend.capture_hidden); t^(l):
the mean hidden state of the text after the video (the question and the assistant prefix; all text
tokens when nothing follows the video). The layers are not published: ours are l1 = 1 and
l2 = max(2, round(L / 4)) of L decoder layers (2 of the demo target's 8, 7 of a 28-layer Qwen2.5-7B),
`prune_uv_layers=l1:l2` to choose others. The scores feed SpecVLM's two-stage selection
(pruning.select_visual_tokens) shifted to be non-negative (its Stage I takes a share of their sum).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def uv_layers(num_layers: int, given: tuple[int, int] | None = None) -> tuple[int, int]:
    """(l1, l2): the early layers UV-Prune compares (1-based, l1 < l2 <= num_layers)."""
    l1, l2 = given if given is not None else (1, max(2, round(num_layers / 4)))
    if not 1 <= l1 < l2 <= num_layers:
        raise ValueError(f"prune_uv_layers={l1}:{l2}: need 1 <= l1 < l2 <= {num_layers} (the target's decoder layers)")
    return l1, l2


def uv_scores(h1: torch.Tensor, h2: torch.Tensor, visual_mask: torch.Tensor, visual_end: int) -> torch.Tensor:
    """[num_visual] scores (>= 0) from the prompt's hidden states [seq, hidden] after layers l1 and l2.

    visual_mask: [seq] bool, the visual tokens' rows; visual_end: the row after the last of them."""
    device = h2.device
    vmask = visual_mask.to(device)
    text = ~vmask
    text[:visual_end] = False  # the text after the video asks the question
    if not text.any():
        text = ~vmask
    growth = _cos_to_text(h2, vmask, text) - _cos_to_text(h1.to(device), vmask, text)
    return growth - growth.min()


def _cos_to_text(h: torch.Tensor, vmask: torch.Tensor, text: torch.Tensor) -> torch.Tensor:
    """[num_visual] cosine similarity of each visual row of h to the mean text row (in fp32)."""
    h = h.float()
    return F.cosine_similarity(h[vmask], h[text].mean(0, keepdim=True), dim=-1)
