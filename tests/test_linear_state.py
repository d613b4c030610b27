"""Gated DeltaNet layers in the cache contract (backends/linear_state.py), on a tiny Qwen3.5.

The reference is transformers' own code: each path of a draft tree decoded alone, one token at a
time, through the model's own forward (its recurrent gated delta rule and in-place convolution
update) on a copy of the committed cache. A tree forward must give every node the logits its path
gives alone, and `keep` of any path must leave the cache in the state that path leaves it in.
"""
from __future__ import annotations

import copy
import random

import bf16_nodes
import pytest
import torch
from bf16_nodes import random_tree
from conftest import build_qwen3_5_checkpoint, random_case
from transformers import DynamicCache, Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5GatedDeltaNet

from lvspec_eval.backends import linear_state
from lvspec_eval.backends.loading import load_backend
from lvspec_eval.decoding import tree
from lvspec_eval.reporting.divergence import tolerance

ATOL = 2e-4  # fp32: a parallel solve against a sequential recurrence
SCALES = (1.0, 4.0, 16.0)  # bf16 checks: a tiny random model's weights, and larger (bf16_nodes.scale_weights)


def _prefilled(family, make_case, seed):
    backend = family.target
    case = make_case(seed, family.max_side, with_video=seed % 3 != 2)
    inputs = backend.prepare(case.prompt, case.videos)
    state, logits = backend.prefill(inputs)
    state.pending = [int(logits.argmax())]
    return backend, state


def _alone(backend, state, tokens: list[int]) -> tuple[list[torch.Tensor], object]:
    """transformers' own forward, one token at a time from a copy of the committed cache: the logits
    after each token and the cache after the last."""
    cache = copy.deepcopy(state.cache)
    logits = []
    for i, token in enumerate(tokens):
        positions = backend.position_ids(state.extra, torch.tensor([state.next_pos + i]))
        out = backend.text_model()(input_ids=torch.tensor([[token]]), position_ids=positions, cache=cache,
                                   use_cache=True)
        logits.append(backend.lm_head(out.last_hidden_state[0, -1]))
    return logits, cache


def _linear_layers(cache):
    return [layer for layer in cache.layers if linear_state.is_linear_layer(layer)]


@pytest.mark.parametrize("seed", range(4))
def test_tree_forward_gives_each_node_its_path_alone(qwen3_5_family, make_case, seed):
    backend, committed = _prefilled(qwen3_5_family, make_case, seed)
    state = copy.deepcopy(committed)
    rng = random.Random(seed)
    tokens, parents = random_tree(rng, 9, backend.model.config.get_text_config().vocab_size)
    offsets, visible = tree.pending_and_tree_layout(1, torch.tensor(parents))
    logits, _ = backend.forward(state, torch.tensor(state.pending + tokens), offsets, visible)
    state = committed  # the references start from the committed cache
    root_alone, _ = _alone(backend, state, state.pending)
    torch.testing.assert_close(logits[0], root_alone[0], atol=ATOL, rtol=0)
    for node in range(len(tokens)):
        path = tree.path_to(node, parents)
        alone, _ = _alone(backend, state, state.pending + [tokens[i] for i in path])
        torch.testing.assert_close(logits[1 + node], alone[-1], atol=ATOL, rtol=0,
                                   msg=lambda m, node=node: f"node {node} (path {path}): {m}")


@pytest.mark.parametrize("seed", range(3))
def test_keep_rolls_back_to_any_path(qwen3_5_family, make_case, seed):
    """After scoring a tree, keep the pending token and one root-to-node path: the linear layers'
    states and the next logits are those of that path decoded alone."""
    backend, committed = _prefilled(qwen3_5_family, make_case, seed)
    rng = random.Random(100 + seed)
    tokens, parents = random_tree(rng, 8, backend.model.config.get_text_config().vocab_size)
    for node in range(len(tokens)):
        state = copy.deepcopy(committed)
        offsets, visible = tree.pending_and_tree_layout(1, torch.tensor(parents))
        backend.forward(state, torch.tensor(state.pending + tokens), offsets, visible)
        path = tree.path_to(node, parents)
        backend.keep(state, [0] + [1 + i for i in path])
        seq = committed.pending + [tokens[i] for i in path]
        _, cache = _alone(backend, committed, seq)
        for ours, theirs in zip(_linear_layers(state.cache), _linear_layers(cache)):
            torch.testing.assert_close(ours.recurrent_states[0], theirs.recurrent_states[0], atol=ATOL, rtol=0)
            torch.testing.assert_close(ours.conv_states[0], theirs.conv_states[0], atol=ATOL, rtol=0)
        nxt = rng.randrange(100)
        logits, _ = backend.forward(state, torch.tensor([nxt]), torch.zeros(1, dtype=torch.long), None)
        alone, _ = _alone(backend, committed, seq + [nxt])
        torch.testing.assert_close(logits[0], alone[-1], atol=ATOL, rtol=0)


def test_keep_nothing_leaves_the_committed_state(qwen3_5_family, make_case):
    backend, state = _prefilled(qwen3_5_family, make_case, 0)
    before = [(l.recurrent_states[0].clone(), l.conv_states[0].clone()) for l in _linear_layers(state.cache)]
    backend.forward(state, torch.tensor(state.pending + [5, 6, 7]), torch.arange(4), None)
    backend.keep(state, 0)
    for (rec, conv), layer in zip(before, _linear_layers(state.cache)):
        assert torch.equal(rec, layer.recurrent_states[0]) and torch.equal(conv, layer.conv_states[0])


def test_a_tree_fed_level_by_level_equals_it_fed_at_once(qwen3_5_family, make_case):
    """A drafter feeds its tree one level per forward, each level seeing the earlier ones as
    temporary entries: the linear layers build on those entries' deltas."""
    backend, committed = _prefilled(qwen3_5_family, make_case, 1)
    parents = [-1, -1, 0, 0, 1, 2, 2, 4]
    tokens = [11, 22, 33, 44, 55, 66, 77, 88]
    depth = tree.depths(torch.tensor(parents)).tolist()
    at_once = copy.deepcopy(committed)
    whole, _ = backend.forward(at_once, torch.tensor(tokens), torch.tensor(depth) - 1,
                               tree.ancestor_mask(torch.tensor(parents)))
    levels = copy.deepcopy(committed)
    anc = tree.ancestor_mask(torch.tensor(parents))
    rows = []
    for d in sorted(set(depth)):
        nodes = [i for i in range(len(tokens)) if depth[i] == d]
        fed = [i for i in range(len(tokens)) if depth[i] < d] + nodes
        visible = anc[nodes][:, fed]
        logits, _ = backend.forward(levels, torch.tensor([tokens[i] for i in nodes]),
                                    torch.full((len(nodes),), d - 1), visible)
        rows += list(zip(nodes, logits))
    for node, logits in rows:
        torch.testing.assert_close(logits, whole[node], atol=ATOL, rtol=0)


def test_temporary_forwards_need_their_layout():
    """Outside `temporary`, a wrapped layer runs transformers' own forward (prefills)."""
    assert linear_state._LAYOUT.get() is None
    with linear_state.temporary(torch.ones(1, 1, dtype=torch.bool)):
        assert linear_state._LAYOUT.get() is not None
    assert linear_state._LAYOUT.get() is None


def test_the_policy_times_the_state_bookkeeping_as_part_of_a_step(qwen3_5_family, make_case, monkeypatch):
    """Rolling the linear layers forward to the accepted path happens inside the step the draft
    policy times (verification: score, verify, commit), so its cost is weighed like the forward's."""
    import time

    from lvspec_eval.decoding import loop, methods

    real_keep, pause = linear_state.keep, 0.02

    def slow_keep(layer, kept, num):
        if num:
            time.sleep(pause)
        return real_keep(layer, kept, num)

    monkeypatch.setattr(linear_state, "keep", slow_keep)
    spec = methods.resolve("sd_tree")
    drafter, verifier = methods.build(spec, methods.make_options(spec, {"tree": "chain", "tree_depth": 3}),
                                      qwen3_5_family.draft, qwen3_5_family.target)
    case = make_case(2, qwen3_5_family.max_side)
    out = loop.generate(qwen3_5_family.target, drafter, verifier, case.prompt, case.videos, 6)
    linear = len(_linear_layers(_prefilled(qwen3_5_family, make_case, 2)[1].cache))
    assert out.stats.steps and all(step.verify_s >= linear * pause for step in out.stats.steps)


def test_bfloat16_tree_verification_agrees_with_plain_steps(qwen3_5_family, make_case):
    """In bf16 (a GPU's dtype) the linear layers' temporary entries keep float32 keys, deltas and
    decays, and their short convolution rounds once as transformers' does: a verification forward
    over a tree gives each node the logits of its path decoded by plain steps (transformers' own
    kernel) within the report's near-tie tolerance (reporting/divergence.py), and a tree of width 2
    decodes. Where the top two logits are closer than that, bf16 decodes may still part: the
    attention layers' kernel rounds otherwise with masked keys present (as on the attention
    families); the Gated DeltaNet layers add no rounding of their own (the bf16 tests below).
    Exactness is tested in float32."""
    from lvspec_eval.backends.loading import load_backend
    from lvspec_eval.decoding import loop, methods

    backend = load_backend(str(qwen3_5_family.target.model.name_or_path), dtype="bfloat16")
    case = make_case(3, qwen3_5_family.max_side)
    inputs = backend.prepare(case.prompt, case.videos)
    committed, logits = backend.prefill(inputs)
    committed.pending = [int(logits.argmax())]
    tokens, parents = [11, 22, 33, 44], [-1, 0, -1, 2]
    state = copy.deepcopy(committed)
    offsets, visible = tree.pending_and_tree_layout(1, torch.tensor(parents))
    tree_logits, _ = backend.forward(state, torch.tensor(committed.pending + tokens), offsets, visible)
    for node in range(len(tokens)):
        alone, _ = _alone(backend, committed, committed.pending + [tokens[i] for i in tree.path_to(node, parents)])
        near_tie = tolerance("bfloat16", float(alone[-1].abs().max()))
        assert (tree_logits[1 + node] - alone[-1]).abs().max() <= near_tie, node
    spec = methods.resolve("sd_tree")
    options = {"tree": "dynamic", "tree_depth": 3, "tree_topk": 2, "tree_total": 6}
    drafter, verifier = methods.build(spec, methods.make_options(spec, options), None, backend)
    assert len(loop.generate(backend, drafter, verifier, case.prompt, case.videos, 12).tokens) == 12


@pytest.fixture(scope="module")
def released_layout(tmp_path_factory):
    """A tiny Qwen3.5 laid out as the released models: 3 Gated DeltaNet layers, then 1 attention layer
    (so what the attention kernel rounds with masked keys present comes after them)."""
    return build_qwen3_5_checkpoint(tmp_path_factory.mktemp("qwen3_5_3to1") / "target", 64, 4, seed=11, full_every=4)


@pytest.mark.parametrize("scale", SCALES)
def test_bfloat16_tree_nodes_part_from_one_token_decoding_no_more_than_transformers_does(released_layout, scale):
    """bf16, node by node (tests/bf16_nodes.py): the engine's verification row picks another token
    than one-token decoding of the node's path at no more nodes than transformers' own forward over
    the whole path does (0 extra), and lies within the report's near-tie tolerance of that forward.
    A convolution that rounded each bf16 product (before the fix) put 6-13 of 220 nodes on another
    token at these scales (scripts/bf16_partings.py), and rows up to 37 tolerances away."""
    backend = load_backend(str(released_layout), dtype="bfloat16")
    bf16_nodes.scale_weights(backend.model, scale)
    extra, worst = 0, 0.0  # worst: the largest row difference, in near-tie tolerances
    for seed in range(10):
        case = random_case(seed, 64)
        state = bf16_nodes.committed_state(backend, case.prompt, case.videos)
        tokens, parents = random_tree(random.Random(seed), 10, backend.model.config.get_text_config().vocab_size)
        rows = bf16_nodes.NodeRows(bf16_nodes.engine_rows(backend, state, tokens, parents),
                                   bf16_nodes.one_token_rows(backend, state, tokens, parents),
                                   bf16_nodes.whole_path_rows(backend, state, tokens, parents), None)
        extra += rows.argmax_differences(rows.engine) - rows.argmax_differences(rows.whole_path)
        for ours, theirs in zip(rows.engine, rows.whole_path):
            worst = max(worst, float((ours - theirs).abs().max()) / tolerance("bfloat16", float(theirs.abs().max())))
    assert extra <= 0
    assert worst <= 1


def _one_layer(scale: float, seed: int):
    """A bf16 Gated DeltaNet layer (its input projection scaled) and a cache its own prefill filled."""
    torch.manual_seed(seed)
    config = Qwen3_5TextConfig(num_hidden_layers=1, layer_types=["linear_attention"], hidden_size=128,
                               linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32,
                               linear_value_head_dim=32)
    layer = Qwen3_5GatedDeltaNet(config, 0).eval().to(torch.bfloat16)
    with torch.no_grad():
        layer.in_proj_qkv.weight.mul_(scale)
        cache = DynamicCache(config=config)
        layer(torch.randn(1, 9, config.hidden_size, dtype=torch.bfloat16), cache=cache)
    return layer, cache


@pytest.mark.parametrize("scale", SCALES)
@torch.no_grad()
def test_bfloat16_one_layer_tree_output_is_the_one_token_output_bit_for_bit(scale):
    """One Gated DeltaNet layer in bf16: tree_forward gives each node, bit for bit, the output of its
    path fed one token at a time (transformers' recurrent kernel and convolution update) wherever
    transformers' own two paths (that, and the whole path in one chunked call) agree. A convolution
    rounding each bf16 product agreed on about 30% of the values."""
    for seed in range(3):
        layer, cache = _one_layer(scale, seed)
        rng = random.Random(seed)
        parents = [-1] + [rng.randint(-1, i - 1) for i in range(1, 12)]
        x = torch.randn(1, 1 + len(parents), layer.hidden_size, dtype=torch.bfloat16)  # the root, then the nodes
        _, visible = tree.pending_and_tree_layout(1, torch.tensor(parents))
        ours = linear_state.tree_forward(layer, x, copy.deepcopy(cache).layers[0], visible)[0]
        agreed = 0
        for row, node in enumerate([-1, *range(len(parents))]):
            path = x[:, [0] + [1 + i for i in tree.path_to(node, parents)]]
            steps = copy.deepcopy(cache)
            one_token = [layer(path[:, i:i + 1], cache=steps)[0, -1] for i in range(path.shape[1])][-1]
            whole = layer(path, cache=copy.deepcopy(cache))[0, -1]
            same = whole == one_token
            assert torch.equal(ours[row][same], one_token[same]), (seed, node)
            agreed += int(same.sum())
        assert agreed > 0.9 * ours.numel()  # transformers' paths agree almost everywhere: the check bites


def test_a_pruned_draft_keeps_its_own_recurrent_state(qwen3_5_family):
    """SpecVLM's pruned draft prefills only the kept video rows: its linear layers never read the
    dropped ones, and verification stays exact."""
    import numpy as np

    from lvspec_eval.decoding import loop, methods

    videos = [(np.random.default_rng(3).integers(0, 256, size=(4, 64, 96, 3), dtype=np.uint8), 2.0)]
    outs = {}
    for method, options in (("vanilla", {}), ("specvlm", {"prune_ratio": 0.5, "tree": "chain", "tree_depth": 3})):
        spec = methods.resolve(method)
        drafter, verifier = methods.build(spec, methods.make_options(spec, options), qwen3_5_family.draft,
                                          qwen3_5_family.target)
        outs[method] = loop.generate(qwen3_5_family.target, drafter, verifier, "describe the video", videos, 12)
    assert outs["specvlm"].stats.kept_visual_tokens < outs["specvlm"].stats.visual_tokens
    assert outs["specvlm"].tokens == outs["vanilla"].tokens


def test_a_plain_step_runs_transformers_own_kernel_and_must_be_kept(qwen3_5_family, make_case):
    """Vanilla's one-token steps go through the model's own recurrent kernel (exactly what
    generate() and lmms-eval's classes compute, in any dtype); dropping such a step is refused."""
    backend, committed = _prefilled(qwen3_5_family, make_case, 0)
    state = copy.deepcopy(committed)
    logits, _ = backend.forward(state, torch.tensor(state.pending), torch.zeros(1, dtype=torch.long), None)
    alone, cache = _alone(backend, committed, committed.pending)
    assert torch.equal(logits[0], alone[0])  # the same code: bit for bit
    backend.keep(state, 1)
    for ours, theirs in zip(_linear_layers(state.cache), _linear_layers(cache)):
        assert torch.equal(ours.recurrent_states[0], theirs.recurrent_states[0])
    state = copy.deepcopy(committed)
    backend.forward(state, torch.tensor(state.pending), torch.zeros(1, dtype=torch.long), None)
    with pytest.raises(ValueError, match="plain step must be kept"):
        backend.keep(state, 0)
