"""Backends of both families against the model's own forward (tiny random models, CPU fp32).

What the decoding loop relies on: prefill equals the HF forward, cached decoding equals a full
recompute at every step, a tree-masked forward equals decoding each root-to-leaf path on its own,
`keep` compacts exactly the chosen entries, a pruned prefill keeps the kept tokens' positions,
and collecting visual attention changes nothing but adds the scores.
"""
from __future__ import annotations

import contextlib
import copy
import random

import bf16_nodes
import numpy as np
import pytest
import torch
from transformers.models.llava_onevision.image_processing_pil_llava_onevision import LlavaOnevisionImageProcessorPil

from lvspec_eval.backends import linear_state
from lvspec_eval.backends.base import additive_mask
from lvspec_eval.backends.llava_onevision import LlavaOnevisionBackend
from lvspec_eval.backends.loading import load_backend
from lvspec_eval.backends.siglip_vision import SiglipPreprocessConfig, num_video_tokens, preprocess_video
from lvspec_eval.decoding import tree
from lvspec_eval.decoding.types import Draft
from lvspec_eval.reporting.divergence import tolerance

ATOL = 1e-4
NUM_STEPS = 6


def _case(family, make_case, seed=0):
    case = make_case(seed, family.max_side, max_frames=3)
    return case, family.target.prepare(case.prompt, case.videos)


def _full_logits(family, inputs, generated: list[int]) -> torch.Tensor:
    """Logits [vocab] after prompt + generated, from the HF model's own forward without a cache."""
    ids = torch.cat([inputs.input_ids, torch.tensor([generated], dtype=torch.long)], dim=1)
    with torch.no_grad():
        return family.target.model(**family.hf_kwargs(family.target, inputs, ids)).logits[0, -1].float()


def _step(backend, state, token: int) -> torch.Tensor:
    """Append one committed token through the cache; logits [vocab] after it."""
    logits, _ = backend.forward(state, torch.tensor([token]), torch.tensor([0]), torch.ones(1, 1, dtype=torch.bool))
    backend.keep(state, [0])
    return logits[0]


def test_prefill_matches_model_forward(family, make_case):
    _, inputs = _case(family, make_case)
    _, logits = family.target.prefill(inputs)
    torch.testing.assert_close(logits, _full_logits(family, inputs, []), atol=ATOL, rtol=0)


def test_cached_decoding_matches_full_recompute(family, make_case):
    """DESIGN.md: cached decoding must equal a full recompute, at every step."""
    backend = family.target
    _, inputs = _case(family, make_case, seed=1)
    state, logits = backend.prefill(inputs)
    generated = []
    for _ in range(NUM_STEPS):
        generated.append(int(logits.argmax()))
        logits = _step(backend, state, generated[-1])
        torch.testing.assert_close(logits, _full_logits(family, inputs, generated), atol=ATOL, rtol=0)
    assert state.next_pos == inputs.input_ids.shape[1] + NUM_STEPS


# A hand-made tree: two root children, a branch of depth 4 and siblings at depths 2 and 3.
PARENTS = [-1, -1, 0, 0, 1, 3, 3, 5]
TOKENS = [11, 12, 13, 14, 15, 16, 17, 18]


@pytest.mark.parametrize("num_pending", [1, 2])
def test_tree_forward_matches_sequential_paths(family, make_case, num_pending):
    backend = family.target
    _, inputs = _case(family, make_case, seed=2)
    state, _ = backend.prefill(inputs)
    pending = [21, 22][:num_pending]
    fresh = copy.deepcopy(state)
    state.pending = list(pending)
    parents = torch.tensor(PARENTS)
    scores = backend.score(state, Draft(torch.tensor(TOKENS), parents))
    assert scores.logits.shape[0] == len(TOKENS) + 1
    for node in [-1, *range(len(TOKENS))]:
        seq = copy.deepcopy(fresh)
        for tok in pending + [TOKENS[i] for i in tree.path_to(node, parents)]:
            logits = _step(backend, seq, tok)
        torch.testing.assert_close(scores.logits[node + 1], logits, atol=ATOL, rtol=0)


def test_keep_compacts_selected_entries(family, make_case):
    backend = family.target
    _, inputs = _case(family, make_case, seed=3)
    state, _ = backend.prefill(inputs)
    base, pos = state.cache_len, state.next_pos
    n = 5
    backend.forward(state, torch.arange(30, 30 + n), torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril())
    kv_layers = [layer for layer in state.cache.layers if getattr(layer, "keys", None) is not None]
    before = [(layer.keys.clone(), layer.values.clone()) for layer in kv_layers]
    chosen = [1, 3, 4]  # not one path: KV layers only (a linear-attention layer keeps a path: test_linear_state)
    backend.keep(state, chosen)
    idx = torch.tensor([base + i for i in chosen])
    for (keys, values), layer in zip(before, kv_layers):
        assert layer.keys.shape[-2] == base + len(chosen)
        torch.testing.assert_close(layer.keys[:, :, :base], keys[:, :, :base], atol=0, rtol=0)
        torch.testing.assert_close(layer.keys[:, :, base:], keys.index_select(2, idx), atol=0, rtol=0)
        torch.testing.assert_close(layer.values[:, :, base:], values.index_select(2, idx), atol=0, rtol=0)
    assert (state.cache_len, state.next_pos, state.temp_len) == (base + 3, pos + 3, 0)


def test_commit_of_a_branch_continues_like_sequential_decoding(family, make_case):
    """Keeping a non-contiguous tree path (nodes 0, 3, 5) leaves the cache of that sequence."""
    backend = family.target
    _, inputs = _case(family, make_case, seed=4)
    state, first = backend.prefill(inputs)
    root = int(first.argmax())
    fresh = copy.deepcopy(state)
    state.pending = [root]
    backend.score(state, Draft(torch.tensor(TOKENS), torch.tensor(PARENTS)))
    path = tree.path_to(5, torch.tensor(PARENTS))
    backend.keep(state, [0] + [1 + i for i in path])
    after = _step(backend, state, 40)
    for tok in [root] + [TOKENS[i] for i in path] + [40]:
        want = _step(backend, fresh, tok)
    torch.testing.assert_close(after, want, atol=ATOL, rtol=0)
    assert (state.cache_len, state.next_pos) == (fresh.cache_len, fresh.next_pos)


def test_bfloat16_verification_rows_are_transformers_own_forward_of_the_tree(family, make_case):
    """bf16, where a rounding of the engine's own would show (tests/bf16_nodes.py): the verification
    rows (backend.score over a draft tree) equal, bit for bit, transformers' own forward (its sdpa,
    not the engine's dispatcher) over the same flattened tree with the engine's 4-D additive mask and
    positions. Where they part from one-token decoding (docs/GPU.md, "What exact match means in
    bf16"), the cause is therefore the attention kernel, not the engine.

    Qwen3.5: its Gated DeltaNet layers read a flattened tree as one sequence (no mask reaches them),
    so each node's row is compared with transformers' forward over the node's whole path in one call
    instead: within the report's near-tie tolerance, and on another token than one-token decoding at
    no more nodes than that forward (more, with larger weights and one layer bit for bit:
    tests/test_linear_state.py)."""
    backend = load_backend(str(family.target.model.name_or_path), dtype="bfloat16")
    vocab = backend.model.config.get_text_config().vocab_size
    for seed in range(3):
        case = make_case(seed, family.max_side)
        state = bf16_nodes.committed_state(backend, case.prompt, case.videos)
        tokens, parents = bf16_nodes.random_tree(random.Random(seed), 10, vocab)
        engine = bf16_nodes.engine_rows(backend, state, tokens, parents)
        flat = bf16_nodes.flat_tree_rows(backend, state, tokens, parents)
        if flat is not None:
            assert torch.equal(engine, flat), seed
            continue
        rows = bf16_nodes.NodeRows(engine, bf16_nodes.one_token_rows(backend, state, tokens, parents),
                                   bf16_nodes.whole_path_rows(backend, state, tokens, parents), None)
        assert rows.argmax_differences(engine) <= rows.argmax_differences(rows.whole_path), seed
        for node, (ours, theirs) in enumerate(zip(engine, rows.whole_path)):
            diff, near_tie = float((ours - theirs).abs().max()), tolerance("bfloat16", float(theirs.abs().max()))
            assert diff <= near_tie, (seed, node, diff, near_tie)


@contextlib.contextmanager
def _record_positions(backend):
    """Collect the position_ids every text-model call receives."""
    seen = []
    handle = backend.text_model().register_forward_pre_hook(
        lambda _mod, _args, kwargs: seen.append(kwargs["position_ids"].clone()), with_kwargs=True)
    try:
        yield seen
    finally:
        handle.remove()


def _hf_deepstack(backend, inputs, length: int) -> dict:
    """What transformers' own Qwen3VLModel.forward hands its text model for a full prompt (+ text
    after it): DeepStack features from its own get_video_features, on the video pad rows. Other
    families: nothing."""
    if getattr(backend.model.config, "model_type", "") not in ("qwen3_vl", "qwen3_vl_moe") or not inputs.model_kwargs:
        return {}
    kw = inputs.model_kwargs
    with torch.no_grad():
        out = backend.model.model.get_video_features(kw["pixel_values_videos"], kw["video_grid_thw"], return_dict=True)
    rows = torch.zeros(1, length, dtype=torch.bool)
    rows[0, : inputs.input_ids.shape[1]] = inputs.input_ids[0] == backend.model.config.video_token_id
    return {"visual_pos_masks": rows, "deepstack_visual_embeds": [torch.cat(f) for f in out.deepstack_features]}


def _masked_full_logits(backend, inputs, dropped: torch.Tensor, extra: list[int]) -> torch.Tensor:
    """Reference for a pruned prefill: the full sequence, dropped positions hidden from all later
    queries (each still sees itself so its row stays finite), original positions everywhere, and
    (Qwen3-VL) transformers' own DeepStack features on every video row. A recurrent (linear-attention)
    layer cannot hide a token it has read: for a hybrid model (Qwen3.5) the dropped rows are left
    out of the sequence instead, the others keeping their original positions."""
    embeds = backend.input_embeds(inputs)
    positions = backend.prefill_positions(inputs)
    if extra:
        n = inputs.input_ids.shape[1]
        embeds = torch.cat([embeds, backend.text_model().get_input_embeddings()(torch.tensor([extra]))], dim=1)
        positions = torch.cat([positions, backend.position_ids(backend.init_extra(inputs),
                                                               torch.arange(n, n + len(extra)))], dim=-1)
    length = embeds.shape[1]
    if any(linear_state.is_gated_deltanet(m) for m in backend.text_model().modules()):
        kept = torch.ones(length, dtype=torch.bool)
        kept[dropped] = False
        with torch.no_grad():
            out = backend.text_model()(inputs_embeds=embeds[:, kept], position_ids=positions[..., kept])
        return backend.lm_head(out.last_hidden_state[:, -1])[0]
    visible = torch.ones(length, length, dtype=torch.bool).tril()
    visible[:, dropped] = False
    visible |= torch.eye(length, dtype=torch.bool)
    mask = additive_mask(0, visible, embeds.dtype, backend.device)
    with torch.no_grad():
        out = backend.text_model()(inputs_embeds=embeds, position_ids=positions, attention_mask=mask,
                                   **_hf_deepstack(backend, inputs, length))
    return backend.lm_head(out.last_hidden_state[:, -1])[0]


def test_pruned_prefill_keeps_original_positions(family, make_case):
    backend = family.target
    _, inputs = _case(family, make_case, seed=5)
    n_vis, seq_len = inputs.num_visual_tokens, inputs.input_ids.shape[1]
    if n_vis < 2:
        pytest.skip("needs at least two visual tokens")
    keep = torch.arange(0, n_vis, 2)
    vis_idx = inputs.visual_mask.nonzero().flatten()
    kept_mask = ~inputs.visual_mask
    kept_mask[vis_idx[keep]] = True
    with _record_positions(backend) as seen:
        state, logits = backend.prefill(inputs, keep_visual=keep)
    torch.testing.assert_close(seen[0], backend.prefill_positions(inputs)[..., kept_mask])
    assert (state.cache_len, state.next_pos) == (int(kept_mask.sum()), seq_len)
    dropped = (~kept_mask).nonzero().flatten()
    torch.testing.assert_close(logits, _masked_full_logits(backend, inputs, dropped, []), atol=ATOL, rtol=0)
    # The next token goes to sequence index seq_len, as if nothing had been dropped.
    after = _step(backend, state, 40)
    torch.testing.assert_close(after, _masked_full_logits(backend, inputs, dropped, [40]), atol=ATOL, rtol=0)


def _eager_visual_attention(backend, inputs) -> torch.Tensor:
    """Reference scores: full eager attention maps, rows after the video, averaged."""
    config = backend.text_model().config
    original = config._attn_implementation
    config._attn_implementation = "eager"
    try:
        with torch.no_grad():
            out = backend.text_model()(inputs_embeds=backend.input_embeds(inputs),
                                       position_ids=backend.prefill_positions(inputs), output_attentions=True,
                                       **_hf_deepstack(backend, inputs, inputs.input_ids.shape[1]))
    finally:
        config._attn_implementation = original
    start, end = inputs.visual_span
    maps = torch.stack([a[0, :, end:, start:end] for a in out.attentions])  # [layers, heads, q, span]
    return maps.mean(dim=(0, 1, 2))[inputs.visual_mask[start:end]]  # the video tokens' (not timestamps')


def test_visual_attention_scores_and_unchanged_logits(family, make_case):
    backend = family.target
    _, inputs = _case(family, make_case, seed=6)
    _, plain = backend.prefill(inputs)
    state, logits = backend.prefill(inputs, visual_attention=True)
    scores = backend.visual_attention(state)
    assert scores.shape == (inputs.num_visual_tokens,)
    assert bool((scores >= 0).all()) and float(scores.sum()) <= 1 + 1e-5
    torch.testing.assert_close(logits, plain, atol=ATOL, rtol=0)
    torch.testing.assert_close(scores, _eager_visual_attention(backend, inputs), atol=1e-5, rtol=1e-4)


def test_visual_hidden_states_cover_visual_tokens(family, make_case):
    _, inputs = _case(family, make_case, seed=7)
    state, _ = family.target.prefill(inputs, hidden_layers=(1,), visual_attention=True)
    assert state.visual_hidden[1].shape[0] == inputs.num_visual_tokens


def test_draft_shares_target_layout(family):
    assert family.draft.layout() == family.target.layout()
    assert family.draft.tokenizer.get_vocab() == family.target.tokenizer.get_vocab()


# ---- LLaVA-OneVision specifics -----------------------------------------------------------------


def test_llava_token_count_follows_the_model(llava_family, make_case):
    backend = llava_family.target
    case, inputs = _case(llava_family, make_case, seed=8)
    frames = case.videos[0][0].shape[0]
    assert inputs.num_visual_tokens == num_video_tokens(frames, backend.preprocess) == frames * 4 + 1
    assert backend.visual_features(inputs).shape[0] == inputs.num_visual_tokens
    # A released 384 px SigLIP tower: 27 x 27 patches pooled to 14 x 14 = 196 tokens per frame.
    assert SiglipPreprocessConfig(image_size=384, patch_size=14).tokens_per_frame == 196


def test_llava_frames_match_the_pil_image_processor():
    """Our frame path equals the base (first) patch of transformers' PIL image processor."""
    frame = np.random.default_rng(0).integers(0, 256, (37, 45, 3), dtype=np.uint8)
    processor = LlavaOnevisionImageProcessorPil(size={"height": 56, "width": 56}, image_mean=[0.5] * 3,
                                                image_std=[0.5] * 3, image_grid_pinpoints=[[56, 56]])
    want = processor(images=[frame], return_tensors="pt").pixel_values[0, 0]
    got = preprocess_video(frame[None], SiglipPreprocessConfig(image_size=56, patch_size=14))
    assert got.shape == (1, 1, 3, 56, 56)
    torch.testing.assert_close(got[0, 0], want, atol=1e-6, rtol=0)


def test_llava_rejects_pixel_budgets(llava_family):
    model, tok = llava_family.target.model, llava_family.target.tokenizer
    with pytest.raises(ValueError, match="max_pixels"):
        LlavaOnevisionBackend.from_pretrained_parts(model, tok, "cpu", {"max_pixels": 1000})
    custom = LlavaOnevisionBackend.from_pretrained_parts(model, tok, "cpu", {"image_mean": [0.4] * 3})
    assert custom.preprocess.image_mean == (0.4, 0.4, 0.4)


def test_llava_text_only_prompt(llava_family):
    inputs = llava_family.target.prepare("describe the ball", [])
    assert inputs.num_visual_tokens == 0 and not inputs.model_kwargs
    _, logits = llava_family.target.prefill(inputs)
    torch.testing.assert_close(logits, _full_logits(llava_family, inputs, []), atol=ATOL, rtol=0)
