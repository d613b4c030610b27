"""On CUDA (opt-in, marker `gpu`; skipped without a GPU): one real sample per method with each
attention implementation the machine has (flash_attention_2 when flash-attn is installed, sdpa,
eager), bf16, on the demo models; and fp32 sdpa, where the exact methods must equal vanilla.

In bf16 an exact method may leave vanilla's tokens at a near-tie (different kernels round
differently), so bf16 runs check that every method completes and decodes tokens; with the real
flash-attn kernel that alone shows that no tree mask reached it (it would assert on the device).
Run: `.venv/bin/python -m pytest -q -m gpu tests/test_gpu.py`.
"""
from __future__ import annotations

import importlib.util

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from lvspec_eval.backends import attention
from lvspec_eval.backends.base import additive_mask
from lvspec_eval.backends.loading import load_backend
from lvspec_eval.decoding import methods
from lvspec_eval.demo import models, world
from lvspec_eval.decoding.runner import Runner, VideoInput

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

METHODS = ("vanilla", "sd_tree", "specvlm", "sparrow", "fly", "lvspec")
KERNELS = (("flash_attention_2",) if importlib.util.find_spec("flash_attn") else ()) + ("sdpa", "eager")
MAX_NEW = 48


@pytest.fixture(scope="module")
def video():
    scene = world.make_scene(3)
    return VideoInput(world.render(scene, models.FRAMES, models.FRAME_SIZE, models.FRAME_SIZE), models.FPS)


def _run_all(dtype: str, kernel: str, video) -> dict[str, list[int]]:
    load = dict(device="cuda", dtype=dtype, attn_implementation=kernel)
    target, draft = load_backend("demo", **load), load_backend("demo-draft", **load)
    assert target.model.config.vision_config._attn_implementation == kernel  # the vision tower keeps it
    out = {}
    for method in METHODS:
        runner = Runner("demo", method, draft="demo-draft", target_backend=target, draft_backend=draft, **load)
        out[method] = runner.generate(world.CAPTION_PROMPT, [video], MAX_NEW).tokens
    return out


@pytest.mark.parametrize("kernel", KERNELS)
def test_every_method_runs_in_bf16(kernel, video):
    tokens = _run_all("bfloat16", kernel, video)
    assert all(len(t) > 0 for t in tokens.values()), tokens


def test_exact_methods_equal_vanilla_in_fp32_on_the_gpu(video):
    tokens = _run_all("float32", "sdpa", video)
    for method in METHODS:
        if methods.is_lossless(methods.resolve(method)):
            assert tokens[method] == tokens["vanilla"], method


def test_grouped_attention_matches_transformers_sdpa_on_cuda_bf16():
    g = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, 28, 9, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    k = torch.randn(1, 4, 4000, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    v = torch.randn(1, 4, 4000, 128, device="cuda", dtype=torch.bfloat16, generator=g)
    visible = torch.ones(9, 9, dtype=torch.bool).tril()
    mask = additive_mask(4000 - 9, visible, torch.bfloat16, "cuda")

    class Module:
        num_key_value_groups, is_causal, training = 7, True, False

    ours, _ = attention.grouped_attention(Module(), q, k, v, mask, scaling=128 ** -0.5)
    reference, _ = sdpa_attention_forward(Module(), q, k, v, mask, scaling=128 ** -0.5)
    torch.testing.assert_close(ours, reference, atol=2e-2, rtol=2e-2)
