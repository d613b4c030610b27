"""Sparse-to-Dense's view of the target's cache (backends/sparse_view.py, drafters/sparse_view.py)."""
import pytest
import torch

from lvspec_eval.backends import sparse_view
from lvspec_eval.decoding import methods
from lvspec_eval.decoding.drafters.sparse_view import SparseViewDrafter
from lvspec_eval.decoding.tree import TreeConfig


def test_head_scores_sum_each_groups_attention_over_heads_and_text_rows():
    torch.manual_seed(0)
    heads, kv_heads, keys, start, d = 4, 2, 7, 4, 8
    query, key = torch.randn(1, heads, keys - start, d), torch.randn(1, kv_heads, keys, d)
    got = sparse_view.head_scores(query, key, 0.5, start)
    want = torch.zeros(kv_heads, keys)
    for h in range(heads):
        for r in range(keys - start):  # text row r sits at sequence index start + r: it sees keys 0..start + r
            seen = start + r + 1
            w = torch.softmax(query[0, h, r] @ key[0, h // 2, :seen].T * 0.5, dim=-1)
            want[h // 2, :seen] += w
    assert torch.allclose(got, want, atol=1e-6)


def test_kept_entries_are_all_text_and_each_heads_best_video():
    video = torch.tensor([False, True, True, True, True, False])
    scores = torch.tensor([[9.0, 0.1, 0.5, 0.2, 0.4, 9.0],
                           [0.0, 0.3, 0.0, 0.0, 0.2, 0.0]])
    assert sparse_view.kept_entries(scores, video, 2).tolist() == [[0, 2, 4, 5], [0, 1, 4, 5]]


def test_k_from_share_count_or_budget():
    tree = TreeConfig("chain", depth=9)
    assert SparseViewDrafter(tree).num_kept(200, 30) == 20
    assert SparseViewDrafter(tree, keep=1.0).num_kept(200, 30) == 200
    assert SparseViewDrafter(tree, keep=64).num_kept(200, 30) == 64
    assert SparseViewDrafter(tree, budget=100).num_kept(200, 30) == 70  # StD's K + m_t = budget
    with pytest.raises(ValueError, match="std_keep"):
        SparseViewDrafter(tree, keep=0)
    for bad in ({"std_keep": 0}, {"std_budget": 0}):  # refused with the model_args, before any model loads
        with pytest.raises(ValueError, match="std_"):
            methods.make_options(methods.resolve("std"), bad)


@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_5"], indirect=True)
def test_the_view_holds_text_and_k_video_entries_and_shares_linear_layers(family, make_case):
    target = family.target
    spec = methods.resolve("std")
    options = methods.make_options(spec, {"std_keep": 0.25, "draft_prepare": "eager"})  # the view at start
    assert (options.tree, options.tree_depth) == ("chain", 9)
    drafter, _ = methods.build(spec, options, None, target)
    case = make_case(3, family.max_side)
    inputs = target.prepare(case.prompt, case.videos)
    state, _ = target.prefill(inputs, visual_attention=True)
    drafter.start(target, inputs, state, lambda: 0.0)
    n_video, n = inputs.num_visual_tokens, int(inputs.input_ids.shape[1])
    k = max(1, int(n_video * 0.25))
    assert drafter.state.cache_len == n - n_video + k
    for mine, theirs in zip(drafter.state.cache.layers, state.cache.layers):
        if getattr(theirs, "keys", None) is None:
            assert mine is theirs  # a linear-attention layer: the target's own
        else:
            assert mine.keys.shape[-2] == n - n_video + k and theirs.keys.shape[-2] == n
    text = (~inputs.visual_mask).nonzero().flatten()
    first = next(i for i, layer in enumerate(state.cache.layers) if getattr(layer, "keys", None) is not None)
    kept = drafter.state.cache.layers[first].keys[0, 0]
    assert torch.equal(kept[0], state.cache.layers[first].keys[0, 0, int(text[0])])  # text entries as cached
