"""Tree masks never reach a kernel that cannot honour them, and masked attention does not copy K/V.

The language model's attention is lvspec's dispatcher (backends/attention.py): forwards without a
mask (prefill, one-token steps) run the kernel the user asked for; 4-D tree masks run either a
grouped-query sdpa call (sdpa, flash) or eager. flash-attn cannot run here, so a stand-in is
registered under the name users pass, `flash_attention_2`: it computes causal attention as
flash-attn does for a mask-less call, and fails as the real one does (transformers' flash path
reads a 4-D mask as a 2-D padding mask: an IndexError on CPU, a device-side assert on CUDA) when a
4-D mask reaches it. Every method then runs on the demo models and must be token-identical to its
sdpa run; without the dispatcher the first tree forward reaches the stand-in and fails.
What only a GPU can confirm (tests/test_gpu.py): the real flash-attn kernel's numerics, and which
torch sdpa backend (memory-efficient, with a float mask) serves the grouped path there.
"""
from __future__ import annotations

import pytest
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.models.qwen2.modeling_qwen2 import eager_attention_forward

from lvspec_eval.backends import attention
from lvspec_eval.backends.base import additive_mask
from lvspec_eval.backends.loading import load_backend, placement
from lvspec_eval.demo import models, world
from lvspec_eval.decoding.runner import Runner, VideoInput

METHODS = ("vanilla", "sd_tree", "specvlm", "sparrow", "fly", "lvspec")
MAX_NEW = 32


class FakeFlash:
    """flash_attention_2 as transformers calls it, for mask-less calls only (see module docstring)."""

    def __init__(self):
        self.calls = 0
        self.masked_calls = 0

    def __call__(self, module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
        if attention_mask is not None:
            self.masked_calls += 1
            raise IndexError(f"flash_attention_2 got a {attention_mask.dim()}-D mask and read it as a padding mask")
        self.calls += 1
        q, k = query.shape[2], key.shape[2]
        causal = torch.ones(q, k, dtype=torch.bool, device=query.device).tril(k - q)  # bottom-right, as flash-attn
        out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=causal, scale=scaling,
                                                               enable_gqa=True)
        return out.transpose(1, 2).contiguous(), None


@pytest.fixture
def fake_flash(monkeypatch) -> FakeFlash:
    fake = FakeFlash()
    monkeypatch.setitem(AttentionInterface._global_mapping, "flash_attention_2", fake)
    return fake


class Head:
    """A stand-in attention module: what transformers' attention functions read from theirs."""

    def __init__(self, heads: int, kv_heads: int):
        self.num_key_value_groups = heads // kv_heads
        self.is_causal = True
        self.training = False


def _tree_case(heads=8, kv_heads=2, committed=11, parents=(-1, 0, 0, 1, 1, 2, 4), d=16, dtype=torch.float32):
    """q/k/v of a tree of `parents` after `committed` cache entries, and its additive mask."""
    g = torch.Generator().manual_seed(0)
    m = len(parents)
    visible = torch.zeros(m, m, dtype=torch.bool)
    for i, p in enumerate(parents):
        visible[i, i] = True
        while p >= 0:
            visible[i, p] = True
            p = parents[p]
    q = torch.randn(1, heads, m, d, generator=g, dtype=dtype)
    k = torch.randn(1, kv_heads, committed + m, d, generator=g, dtype=dtype)
    v = torch.randn(1, kv_heads, committed + m, d, generator=g, dtype=dtype)
    return q, k, v, additive_mask(committed, visible, dtype, "cpu")


@pytest.mark.parametrize("heads,kv_heads", [(8, 2), (7, 1), (4, 4)])
def test_grouped_attention_equals_sdpa_and_eager_on_a_tree_mask(heads, kv_heads):
    q, k, v, mask = _tree_case(heads, kv_heads)
    module = Head(heads, kv_heads)
    ours, _ = attention.grouped_attention(module, q, k, v, mask, scaling=0.25)
    for reference in (sdpa_attention_forward, eager_attention_forward):
        expected, _ = reference(module, q, k, v, mask, scaling=0.25)
        torch.testing.assert_close(ours, expected, atol=1e-6, rtol=1e-5)


def test_grouped_attention_never_repeats_keys_and_values(monkeypatch):
    """The sdpa call sees kv_heads K/V heads; transformers' sdpa path, given a mask, repeats them."""
    seen = []
    real = torch.nn.functional.scaled_dot_product_attention

    def spy(query, key, value, **kwargs):
        seen.append((query.shape[1], key.shape[1], value.shape[1]))
        return real(query, key, value, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    q, k, v, mask = _tree_case(heads=8, kv_heads=2)
    attention.grouped_attention(Head(8, 2), q, k, v, mask, scaling=0.25)
    sdpa_attention_forward(Head(8, 2), q, k, v, mask, scaling=0.25)
    assert seen == [(2, 2, 2), (8, 8, 8)]  # ours: grouped queries on 2 KV heads; transformers: 8 copies


def _text_forward(backend, embeds, mask):
    with torch.no_grad():
        return backend.text_model()(inputs_embeds=embeds, attention_mask=mask).last_hidden_state


def test_tree_forward_equals_plain_sdpa_and_eager_on_tiny_gqa_models(family):
    """A tiny random Qwen2.5-VL / LLaVA-OV (num_key_value_heads < num_attention_heads), loaded by
    load_backend (dispatcher installed): a tree-masked forward equals transformers' own sdpa and
    eager paths within fp32 tolerance."""
    backend = family.target
    text_config = backend.model.config.get_text_config()
    assert text_config.num_key_value_heads < text_config.num_attention_heads
    assert text_config._attn_implementation == attention.PREFIX + "sdpa"
    g = torch.Generator().manual_seed(1)
    embeds = torch.randn(1, 12, text_config.hidden_size, generator=g)
    visible = torch.ones(12, 12, dtype=torch.bool).tril()  # 7 prompt tokens, then a tree of 5 nodes
    visible[10, 8:10] = False  # tree node 3 hangs off node 0
    mask = additive_mask(0, visible, torch.float32, "cpu")
    ours = _text_forward(backend, embeds, mask)
    for kernel in ("sdpa", "eager", attention.dispatch_name("eager")):  # the last: eager through the dispatcher
        text_config._attn_implementation = kernel
        try:
            reference = _text_forward(backend, embeds, mask)
        finally:
            attention.install(backend.model, "sdpa")
        torch.testing.assert_close(ours, reference, atol=1e-5, rtol=1e-5)


def test_load_keeps_the_users_kernel_for_the_vision_tower_and_refuses_unknown_kernels():
    backend = load_backend("demo", attn_implementation="eager")
    config = backend.model.config
    assert config.get_text_config()._attn_implementation == attention.PREFIX + "eager"
    assert config.vision_config._attn_implementation == "eager"
    assert attention.kernel_of(config.get_text_config()) == "eager"
    with pytest.raises(ValueError, match=r"attn_implementation='flex_attention' is not supported"):
        load_backend("demo", attn_implementation="flex_attention")
    assert "grouped query heads" in attention.describe("flash_attention_2")


def test_placement_loads_weights_straight_onto_the_device():
    assert placement("cpu", None) == {}
    assert placement("cuda", None) == {"device_map": {"": "cuda"}}
    assert placement("cuda:1", None) == {"device_map": {"": "cuda:1"}}
    assert placement("cuda", "auto") == {"device_map": "auto"}


# ---- every method, every kernel, on the demo models ------------------------------------------------
@pytest.fixture(scope="module")
def video():
    torch.set_num_threads(1)
    scene = world.make_scene(5)
    return VideoInput(world.render(scene, models.FRAMES, models.FRAME_SIZE, models.FRAME_SIZE), models.FPS)


def _run_all(target, draft, video) -> dict[str, list[int]]:
    out = {}
    for method in METHODS:
        runner = Runner("demo", method, draft="demo-draft", target_backend=target, draft_backend=draft)
        out[method] = runner.generate(world.CAPTION_PROMPT, [video], MAX_NEW).tokens
    return out


@pytest.fixture(scope="module")
def sdpa_tokens(video) -> dict[str, list[int]]:
    return _run_all(load_backend("demo"), load_backend("demo-draft"), video)


def test_flash_attention_2_never_gets_a_tree_mask_and_every_method_matches_sdpa(fake_flash, sdpa_tokens, video,
                                                                                  monkeypatch):
    target, draft = load_backend("demo"), load_backend("demo-draft")
    for backend in (target, draft):  # what load_backend(attn_implementation="flash_attention_2") installs
        assert attention.install(backend.model, "flash_attention_2") == "flash_attention_2"
    grouped_calls = []
    real = attention.grouped_attention
    monkeypatch.setattr(attention, "grouped_attention", lambda *a, **k: grouped_calls.append(1) or real(*a, **k))
    assert _run_all(target, draft, video) == sdpa_tokens
    assert fake_flash.calls > 0 and fake_flash.masked_calls == 0
    assert grouped_calls  # the tree forwards took the grouped path


def test_without_the_dispatcher_flash_attention_2_receives_the_tree_mask(fake_flash, video):
    """The failure the dispatcher prevents: the model's own flash path gets the 4-D mask."""
    target, draft = load_backend("demo"), load_backend("demo-draft")
    for backend in (target, draft):
        backend.model.config.get_text_config()._attn_implementation = "flash_attention_2"
    runner = Runner("demo", "sd_tree", draft="demo-draft", target_backend=target, draft_backend=draft)
    with pytest.raises(IndexError, match="4-D mask"):
        runner.generate(world.CAPTION_PROMPT, [video], MAX_NEW)


def test_eager_runs_every_method_and_matches_sdpa(sdpa_tokens, video):
    target = load_backend("demo", attn_implementation="eager")
    draft = load_backend("demo-draft", attn_implementation="eager")
    assert _run_all(target, draft, video) == sdpa_tokens


@pytest.mark.parametrize("method", ["sd_tree", "specvlm"])
def test_flash_attention_2_dispatch_on_tiny_gqa_models_of_both_families(method, family, make_case, fake_flash):
    """The same on random tiny Qwen2.5-VL and LLaVA-OneVision pairs (GQA), tree drafts and the
    two-part SpecVLM prefill included."""
    from lvspec_eval.decoding import loop, methods

    def decode():
        spec = methods.resolve(method)
        drafter, verifier = methods.build(spec, methods.make_options(spec, {}), family.draft, family.target)
        return loop.generate(family.target, drafter, verifier, case.prompt, case.videos, 16).tokens

    case = make_case(7, family.max_side)
    expected = decode()
    try:
        for backend in (family.target, family.draft):
            attention.install(backend.model, "flash_attention_2")
        assert decode() == expected
    finally:
        for backend in (family.target, family.draft):
            attention.install(backend.model, "sdpa")
    assert fake_flash.calls > 0 and fake_flash.masked_calls == 0


# ---- SpecVLM's pruning scores in the one target prefill ----------------------------------------------
@torch.no_grad()
def _two_part_scores(backend, inputs) -> torch.Tensor:
    """The scores as they were collected before: the prompt up to the end of the video, then the text
    after it as a second forward under an explicit causal mask, every query of that part counted; each
    part gets its rows' family inputs (Qwen3-VL's DeepStack), and the video tokens' scores are kept
    (Qwen3-VL's visual span also holds timestamps and markers)."""
    from transformers import DynamicCache

    embeds, positions = backend.input_embeds(inputs), backend.prefill_positions(inputs)
    start, end = inputs.visual_span
    text = backend.text_model()
    cache = DynamicCache(config=backend.model.config.get_text_config())
    rows = torch.arange(embeds.shape[1])
    text(inputs_embeds=embeds[:, :end], position_ids=positions[..., :end], cache=cache, use_cache=True,
         **backend.text_inputs(inputs, rows[:end]))
    n = embeds.shape[1] - end
    mask = additive_mask(end, torch.ones(n, n, dtype=torch.bool).tril(), embeds.dtype, embeds.device)
    with attention.collect_visual_attention(text.config, start, end) as col:
        text(inputs_embeds=embeds[:, end:], position_ids=positions[..., end:], attention_mask=mask, cache=cache,
             use_cache=True, **backend.text_inputs(inputs, rows[end:]))
    return col.scores()[inputs.visual_mask[start:end]]


@pytest.mark.parametrize("kernel", ["sdpa", "eager", "flash_attention_2"])
def test_pruning_scores_of_the_one_prefill_equal_the_two_part_scores(family, make_case, kernel, fake_flash):
    """One prefill keeps what the two-part prefill used to compute the scores with, under every kernel;
    the scores, computed later from those queries and the cache (after decoding steps grew it), equal
    the two-part ones (float tolerance) and keep the same video tokens; the prefill's first-token
    logits are vanilla's."""
    from lvspec_eval.decoding.pruning import PruneConfig, select_visual_tokens

    backend = family.target
    case = make_case(3, family.max_side)
    inputs = backend.prepare(case.prompt, case.videos)
    assert 0 < inputs.visual_span[1] < inputs.input_ids.shape[1]
    expected = _two_part_scores(backend, inputs)
    _, plain_logits = backend.prefill(backend.prepare(case.prompt, case.videos))
    try:
        attention.install(backend.model, kernel)
        state, logits = backend.prefill(inputs, visual_attention=True)
    finally:
        attention.install(backend.model, "sdpa")
    # computed when a pruned draft is prepared, possibly mid-request: the cache has grown since
    backend.forward(state, torch.tensor([3, 4, 5]), torch.arange(3), None)
    backend.keep(state, 2)
    scores = backend.visual_attention(state)
    assert scores.shape == (inputs.num_visual_tokens,) and abs(float(scores.sum()) - float(expected.sum())) < 1e-5
    torch.testing.assert_close(scores, expected, rtol=1e-4, atol=1e-7)
    cfg = PruneConfig(ratio=0.75)
    assert select_visual_tokens(scores, cfg).tolist() == select_visual_tokens(expected, cfg).tolist()
    torch.testing.assert_close(logits, plain_logits, rtol=1e-5, atol=1e-5)
    if kernel == "flash_attention_2":
        assert fake_flash.calls > 0 and fake_flash.masked_calls == 0
