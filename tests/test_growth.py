"""The drafters' tree growth (growth.Grower) against a plain-Python EAGLE-2 on the same draft.

The fake draft's logits after a fed node depend on every token it may see (the `visible` row it is
given), so a wrong visibility, a wrong parent or a node read off the wrong top-k slot changes the tree."""
from __future__ import annotations

import math

import pytest
import torch

from lvspec_eval.decoding.drafters.growth import Grower
from lvspec_eval.decoding.tree import TreeConfig, dynamic_shape

VOCAB = 40


def _logits(path: tuple[tuple[int, int], ...]) -> torch.Tensor:
    """The fake draft's logits after a node whose path from the root is `path` ((token, depth) pairs)."""
    s = sum((t + 1) * 1.618 ** d for t, d in path)
    return torch.cos(torch.arange(VOCAB, dtype=torch.float64) * 0.37 + s).float() * 4


def _reference(shape, root_logits: torch.Tensor, value=None):
    """EAGLE-2 growth node by node on host lists: tokens, parents, cumulative log-probs, kept nodes."""
    nodes = []  # dict(token, parent, lp, score, value, depth, path)
    expanded = [dict(index=-1, score=0.0, value=0.0, path=(), logp=torch.log_softmax(root_logits.float(), -1))]
    for d, level in enumerate(shape.levels, 1):
        first = len(nodes)
        for row, rank in zip(level.rows, level.ranks):
            parent = expanded[row]
            top = parent["logp"].topk(rank + 1)
            token, lp = int(top.indices[rank]), float(top.values[rank])
            gain = lp if value is None else float(value(torch.tensor([lp]))[0])
            nodes.append(dict(token=token, parent=parent["index"], lp=lp, score=parent["score"] + lp,
                              value=parent["value"] + gain, depth=d, path=parent["path"] + ((token, d),)))
        if d == shape.depth:
            break
        below = shape.levels[d]
        level_nodes = list(range(first, len(nodes)))
        if isinstance(below.expand, int):
            pick = sorted(sorted(level_nodes, key=lambda i: -nodes[i]["value"])[:below.expand])
        else:
            pick = [first + i for i in below.expand]
        expanded = [dict(index=i, score=nodes[i]["score"], value=nodes[i]["value"], path=nodes[i]["path"],
                         logp=torch.log_softmax(_logits(nodes[i]["path"]), -1)) for i in pick]
    n = len(nodes)
    keep = list(range(n))
    if shape.total is not None and shape.total < n:
        keep = sorted(sorted(range(n), key=lambda i: -(nodes[i]["value"] - 1e-9 * nodes[i]["depth"]))[:shape.total])
    where = {old: new for new, old in enumerate(keep)}
    return ([nodes[i]["token"] for i in keep], [where.get(nodes[i]["parent"], -1) for i in keep],
            [nodes[i]["score"] for i in keep])


def _feed(calls: list):
    fed: list[tuple[int, int]] = []  # (token, depth) of every fed node, in feed order

    def feed(tokens, visible, parent_rows, depth):
        m = tokens.numel()
        assert visible.shape == (m, len(fed) + m) and parent_rows.shape == (m,)
        fed.extend((int(t), depth) for t in tokens)
        rows = []
        for i in range(m):
            seen = [j for j in range(len(fed)) if visible[i, j]]
            assert seen[-1] == len(fed) - m + i  # itself, and nothing fed after it
            p = int(parent_rows[i])
            assert (p == -1) == (len(seen) == 1) and (p == -1 or p in seen)
            rows.append(_logits(tuple(fed[j] for j in seen)))
        calls.append(m)
        return torch.stack(rows)

    return feed


SHAPES = {
    "chain": TreeConfig("chain", depth=5).shape(),
    "dynamic": dynamic_shape(4, 3, 3, None),
    "dynamic, kept 9": dynamic_shape(4, 3, 4, 9),
    "wide root, narrow below": dynamic_shape(5, 1, 4, 8),
    "static (specvlm26)": TreeConfig("static").shape(),
    "one level": dynamic_shape(1, 1, 5, None),
}


@pytest.mark.parametrize("name", SHAPES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_grown_tree_is_eagle2s_on_the_same_draft(name, seed):
    shape = SHAPES[name]
    root = torch.randn(VOCAB, generator=torch.Generator().manual_seed(seed)) * 3
    calls: list[int] = []
    grower = Grower(torch.device("cpu"))
    for _ in range(2):  # a second step reuses the shape's layout
        draft = grower.grow(shape, root, _feed(calls))
    tokens, parents, scores = _reference(shape, root)
    assert draft.tokens.tolist() == tokens and draft.parents.tolist() == parents
    assert draft.scores.tolist() == pytest.approx(scores, abs=1e-5)
    assert draft.depth == shape.depth and calls[: shape.depth - 1] == [
        lv.expand if isinstance(lv.expand, int) else len(lv.expand) for lv in shape.levels[1:]]


def test_a_value_function_chooses_the_expanded_and_kept_nodes():
    """The adaptive policy's node values (here: a calibration that prefers middling probabilities)
    pick the nodes expanded and kept, not the draft's log-probs."""
    def value(lp):
        return -(lp.exp() - 0.3).abs()

    shape = dynamic_shape(4, 2, 3, 7)
    root = torch.randn(VOCAB, generator=torch.Generator().manual_seed(5)) * 2
    draft = Grower(torch.device("cpu")).grow(shape, root, _feed([]), value=value)
    tokens, parents, _ = _reference(shape, root, value)
    assert draft.tokens.tolist() == tokens and draft.parents.tolist() == parents
    assert tokens != _reference(shape, root)[0]  # the values mattered
