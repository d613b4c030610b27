"""Shared fixtures: tiny random-weight models of both families, built once per session.

Each family has a target and a smaller draft that share the tokenizer and the visual-token
layout (as Qwen2.5-VL-32B/7B or LLaVA-OV-72B/7B do), saved with save_pretrained and loaded back
through `load_backend`, so the loading path is exercised too. Everything is fp32 on the CPU.

Random models have near-uniform logits; greedy argmax near-ties would then let a batched tree
forward and sequential decoding disagree by float rounding alone. initializer_range is raised to
0.3: on the tiny LLaVA-OV target, HF's 0.02 left a median top-2 logit gap of 0.06 (smallest
0.002 over 10 prompts), 0.3 gives 0.8 (smallest 0.08), far above fp32 rounding (~1e-6), so a
mismatch in these tests means a real bug.
"""
from __future__ import annotations

import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import (AutoTokenizer, LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration, Qwen2Config,
                          Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen3_5Config,
                          Qwen3_5ForConditionalGeneration, Qwen3VLConfig, Qwen3VLForConditionalGeneration,
                          SiglipVisionConfig)

from lvspec_eval.backends.base import Backend, PreparedInputs
from lvspec_eval.backends.loading import load_backend

# Models this small run fastest on one thread (and leave the other cores to parallel jobs).
torch.set_num_threads(1)

TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "lvspec_eval" / "demo" / "checkpoints" / "tokenizer"
INIT_RANGE = 0.3  # see the module docstring: well-separated greedy choices
WORDS = ("what", "colour", "is", "the", "ball", "describe", "video", "moves", "left", "red", "square", "which",
         "object", "appears", "first", "count", "shapes", "background", "blue", "circle")

# LLaVA-OneVision's chat format: a `<video>` token per video part, then the text.
LLAVA_CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'video' %}<video>\n"
    "{% elif part['type'] == 'image' %}<image>\n{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@dataclass
class Family:
    """A target and a draft backend of one family, and how to call the HF model directly."""

    name: str
    target: Backend
    draft: Backend
    hf_kwargs: Callable[[Backend, PreparedInputs, torch.Tensor], dict]  # (backend, inputs, ids) -> forward kwargs
    max_side: int  # frame sides are drawn from [14, max_side]


# ------------------------------------------------------------------------------------------------
# Qwen2.5-VL


def _qwen_config(tokenizer, hidden: int, layers: int) -> Qwen2_5_VLConfig:
    ids = tokenizer.convert_tokens_to_ids
    head_dim = 16  # M-RoPE splits its 8 frequencies 2/3/3 over (t, h, w), as Qwen's 16/24/24 of 64 does
    heads = hidden // head_dim
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 2), intermediate_size=2 * hidden, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                 "mrope_section": [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]},
                bos_token_id=0, eos_token_id=tokenizer.eos_token_id, pad_token_id=0, tie_word_embeddings=False,
                initializer_range=INIT_RANGE)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden, patch_size=14,
                  temporal_patch_size=2, spatial_merge_size=2, window_size=56, fullatt_block_indexes=[1],
                  tokens_per_second=2, initializer_range=INIT_RANGE)
    return Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                            video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                            vision_end_token_id=ids("<|vision_end|>"), eos_token_id=tokenizer.eos_token_id,
                            pad_token_id=0, tie_word_embeddings=False, initializer_range=INIT_RANGE)


def _qwen_hf_kwargs(backend: Backend, inputs: PreparedInputs, ids: torch.Tensor) -> dict:
    """Qwen2.5-VL needs mm_token_type_ids (2 = video), else it silently uses 1-D positions."""
    kwargs = {"input_ids": ids}
    if inputs.model_kwargs:
        kwargs.update(inputs.model_kwargs, mm_token_type_ids=(ids == backend.video_token_id).int() * 2)
    return kwargs


def _qwen3_hf_kwargs(backend: Backend, inputs: PreparedInputs, ids: torch.Tensor) -> dict:
    """As Qwen2.5-VL's; transformers keeps `rope_deltas` on the model between calls: reset it, so
    that every reference forward computes its positions afresh."""
    backend.model.model.rope_deltas = None
    return _qwen_hf_kwargs(backend, inputs, ids)


def _save_qwen(model, tokenizer, path: Path) -> None:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    # A small pixel budget, read back by load_backend: frames are rounded to multiples of 28 px, at most 84x84.
    (path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 28 * 28, "max_pixels": 84 * 84}))


# ------------------------------------------------------------------------------------------------
# Qwen3-VL


def qwen3_config(tokenizer, hidden: int, layers: int, deepstack: int = 2) -> Qwen3VLConfig:
    """A tiny Qwen3-VL: patch 16, merge 2, a 4x4 learned position table, DeepStack features from the
    first `deepstack` vision blocks added after the first `deepstack` text layers, interleaved M-RoPE."""
    ids = tokenizer.convert_tokens_to_ids
    head_dim = 16
    heads = hidden // head_dim
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 2), head_dim=head_dim, intermediate_size=2 * hidden,
                max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_interleaved": True,
                                 "mrope_section": [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]},
                eos_token_id=tokenizer.eos_token_id, pad_token_id=0, initializer_range=INIT_RANGE)
    vision = dict(depth=deepstack + 1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                  patch_size=16, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                  deepstack_visual_indexes=list(range(deepstack)), initializer_range=INIT_RANGE)
    return Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                         video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                         vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=False,
                         initializer_range=INIT_RANGE)


def save_qwen3(model, tokenizer, path: Path) -> None:
    """The public folder layout: config, safetensors, tokenizer files, and a video processor config
    whose budget is the whole clip (Qwen3-VL's video processor: shortest/longest edge over all frames)."""
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps(
        {"size": {"shortest_edge": 32 * 32, "longest_edge": 96 * 96}, "image_mean": [0.5] * 3,
         "image_std": [0.5] * 3, "patch_size": 16, "merge_size": 2, "temporal_patch_size": 2}))
    (path / "video_preprocessor_config.json").write_text(json.dumps(
        {"size": {"shortest_edge": 32 * 32, "longest_edge": 4 * 96 * 96}, "image_mean": [0.5] * 3,
         "image_std": [0.5] * 3, "patch_size": 16, "merge_size": 2, "temporal_patch_size": 2}))


def build_qwen3_checkpoint(path: Path, hidden: int = 64, layers: int = 3, seed: int = 5, deepstack: int = 2) -> Path:
    """Save a tiny random Qwen3-VL checkpoint at `path` (the lmms-eval CLI tests load it by folder)."""
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    torch.manual_seed(seed)
    save_qwen3(Qwen3VLForConditionalGeneration(qwen3_config(tok, hidden, layers, deepstack)).eval(), tok, path)
    return path


# ------------------------------------------------------------------------------------------------
# Qwen3.5 (hybrid: Gated DeltaNet linear-attention layers, one full-attention layer in `full_every`)


def qwen3_5_config(tokenizer, hidden: int, layers: int, full_every: int = 2) -> Qwen3_5Config:
    """A tiny Qwen3.5: every `full_every`-th text layer full attention (the released models: 4), the
    others Gated DeltaNet; partial M-RoPE (a quarter of each head), gated attention; Qwen3-VL's vision
    tower without DeepStack."""
    ids = tokenizer.convert_tokens_to_ids
    head_dim = 16
    heads = hidden // head_dim
    text = dict(vocab_size=len(tokenizer), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                num_key_value_heads=max(1, heads // 2), head_dim=head_dim, intermediate_size=2 * hidden,
                max_position_embeddings=4096, linear_conv_kernel_dim=4, linear_key_head_dim=8,
                linear_value_head_dim=8, linear_num_key_heads=2, linear_num_value_heads=4,
                layer_types=["full_attention" if (i + 1) % full_every == 0 else "linear_attention"
                             for i in range(layers)],
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_interleaved": True,
                                 "mrope_section": [1, 1, 0], "partial_rotary_factor": 0.25},
                eos_token_id=tokenizer.eos_token_id, pad_token_id=0, initializer_range=INIT_RANGE)
    vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden,
                  patch_size=16, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                  initializer_range=INIT_RANGE)
    return Qwen3_5Config(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                         video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                         vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=False,
                         initializer_range=INIT_RANGE)


def build_qwen3_5_checkpoint(path: Path, hidden: int = 64, layers: int = 4, seed: int = 11,
                             full_every: int = 2) -> Path:
    """Save a tiny random Qwen3.5 checkpoint at `path` (Qwen3-VL's folder layout and processor files)."""
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(qwen3_5_config(tok, hidden, layers, full_every)).eval()
    save_qwen3(model, tok, path)
    return path


# ------------------------------------------------------------------------------------------------
# LLaVA-OneVision


def _llava_tokenizer():
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    tok.add_special_tokens({"additional_special_tokens": ["<image>", "<video>"]})
    tok.chat_template = LLAVA_CHAT_TEMPLATE
    return tok


def _llava_config(tokenizer, hidden: int, layers: int) -> LlavaOnevisionConfig:
    ids = tokenizer.convert_tokens_to_ids
    text = Qwen2Config(vocab_size=len(tokenizer), hidden_size=hidden, intermediate_size=2 * hidden,
                       num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=4096, eos_token_id=tokenizer.eos_token_id, pad_token_id=0,
                       tie_word_embeddings=False, initializer_range=INIT_RANGE)
    # 56 px / 14 = a 4x4 patch grid, pooled to 2x2 tokens per frame (a real 384 px SigLIP: 27x27 -> 14x14).
    vision = SiglipVisionConfig(image_size=56, patch_size=14, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=2, vision_use_head=False,
                                initializer_range=INIT_RANGE)
    return LlavaOnevisionConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                image_token_index=ids("<image>"), video_token_index=ids("<video>"),
                                vision_feature_select_strategy="full", vision_feature_layer=-1,
                                initializer_range=INIT_RANGE)


def _llava_hf_kwargs(backend: Backend, inputs: PreparedInputs, ids: torch.Tensor) -> dict:
    return {"input_ids": ids, **inputs.model_kwargs}


def _save_llava(model, tokenizer, path: Path) -> None:
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    # What a released checkpoint ships; the fixed square size carries no pixel budget.
    (path / "preprocessor_config.json").write_text(json.dumps(
        {"size": {"height": 56, "width": 56}, "image_mean": [0.5] * 3, "image_std": [0.5] * 3}))


# ------------------------------------------------------------------------------------------------
# The kernel cache (backends/linear_kernels.py): never the user's


@pytest.fixture(scope="session", autouse=True)
def _temporary_kernel_cache(tmp_path_factory):
    """Tests never read or write the user's ~/.cache/lvspec (measured CPU kernels, the ledger of
    prepacked memory): one temporary folder for the session, inherited by the processes tests start
    (lmms-eval runs, data-parallel ranks)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LVSPEC_CACHE_DIR", str(tmp_path_factory.mktemp("lvspec-cache")))
        yield


@pytest.fixture(autouse=True)
def _no_prompt_variant_left_over(monkeypatch):
    """An lvspec model built in this process names its prompt variant in the environment
    (models/parity.py PROMPT_VARIANT_VAR): no test sees one a previous test's model left."""
    from lvspec_eval.models.parity import PROMPT_VARIANT_VAR

    monkeypatch.delenv(PROMPT_VARIANT_VAR, raising=False)
    yield
    os.environ.pop(PROMPT_VARIANT_VAR, None)


@pytest.fixture
def kernel_cache(tmp_path, monkeypatch) -> Path:
    """A fresh, empty kernel cache folder for one test."""
    folder = tmp_path / "lvspec-cache"
    monkeypatch.setenv("LVSPEC_CACHE_DIR", str(folder))
    return folder


# ------------------------------------------------------------------------------------------------
# Fixtures


def build_qwen2_5_vl_checkpoint(path: Path, hidden: int = 64, layers: int = 2, seed: int = 1) -> Path:
    """Save a tiny random Qwen2.5-VL checkpoint at `path`."""
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    torch.manual_seed(seed)
    _save_qwen(Qwen2_5_VLForConditionalGeneration(_qwen_config(tok, hidden, layers)).eval(), tok, path)
    return path


def build_llava_checkpoint(path: Path, hidden: int = 64, layers: int = 2, seed: int = 3) -> Path:
    """Save a tiny random LLaVA-OneVision checkpoint at `path`."""
    tok = _llava_tokenizer()
    torch.manual_seed(seed)
    _save_llava(LlavaOnevisionForConditionalGeneration(_llava_config(tok, hidden, layers)).eval(), tok, path)
    return path


# Each family's target as its fixture builds it (scripts/bf16_partings.py builds them too).
TARGET_CHECKPOINTS = {"qwen2_5_vl": build_qwen2_5_vl_checkpoint, "llava_onevision": build_llava_checkpoint,
                      "qwen3_vl": build_qwen3_checkpoint, "qwen3_5": build_qwen3_5_checkpoint}


@pytest.fixture(scope="session")
def qwen_family(tmp_path_factory) -> Family:
    root = tmp_path_factory.mktemp("qwen")
    target = load_backend(str(build_qwen2_5_vl_checkpoint(root / "target", 64, 2, seed=1)))
    draft = load_backend(str(build_qwen2_5_vl_checkpoint(root / "draft", 32, 1, seed=2)))
    return Family("qwen2_5_vl", target, draft, _qwen_hf_kwargs, max_side=84)


@pytest.fixture(scope="session")
def llava_family(tmp_path_factory) -> Family:
    root = tmp_path_factory.mktemp("llava")
    target = load_backend(str(build_llava_checkpoint(root / "target", 64, 2, seed=3)))
    draft = load_backend(str(build_llava_checkpoint(root / "draft", 32, 1, seed=4)))
    return Family("llava_onevision", target, draft, _llava_hf_kwargs, max_side=80)


@pytest.fixture(scope="session")
def qwen3_family(tmp_path_factory) -> Family:
    """Target: 3 text layers, DeepStack after layers 1 and 2; draft: its own tower, DeepStack after layer 1."""
    root = tmp_path_factory.mktemp("qwen3")
    target = load_backend(str(build_qwen3_checkpoint(root / "target", 64, 3, seed=5, deepstack=2)))
    draft = load_backend(str(build_qwen3_checkpoint(root / "draft", 32, 2, seed=6, deepstack=1)))
    return Family("qwen3_vl", target, draft, _qwen3_hf_kwargs, max_side=96)


@pytest.fixture(scope="session")
def qwen3_5_family(tmp_path_factory) -> Family:
    """Target: 4 text layers (linear, full, linear, full); draft: 2 (linear, full)."""
    root = tmp_path_factory.mktemp("qwen3_5")
    target = load_backend(str(build_qwen3_5_checkpoint(root / "target", 64, 4, seed=11)))
    draft = load_backend(str(build_qwen3_5_checkpoint(root / "draft", 32, 2, seed=12)))
    return Family("qwen3_5", target, draft, _qwen3_hf_kwargs, max_side=96)


FAMILY_FIXTURES = {"qwen2_5_vl": "qwen_family", "llava_onevision": "llava_family", "qwen3_vl": "qwen3_family",
                   "qwen3_5": "qwen3_5_family"}


@pytest.fixture(params=list(FAMILY_FIXTURES))
def family(request) -> Family:
    """Every family; narrow with @pytest.mark.parametrize("family", [name], indirect=True)."""
    return request.getfixturevalue(FAMILY_FIXTURES[request.param])


# ------------------------------------------------------------------------------------------------
# Random requests


@dataclass
class Case:
    prompt: str
    videos: list  # [(frames uint8 [T, H, W, 3], fps)]


def random_case(seed: int, max_side: int, max_frames: int = 4, with_video: bool = True) -> Case:
    """A prompt of 2-8 words from WORDS and a video of 1-max_frames random frames."""
    rng = random.Random(seed)
    prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 8)))
    if not with_video:
        return Case(prompt, [])
    t, h, w = rng.randint(1, max_frames), rng.randint(14, max_side), rng.randint(14, max_side)
    frames = np.random.default_rng(seed).integers(0, 256, size=(t, h, w, 3), dtype=np.uint8)
    return Case(prompt, [(frames, rng.choice([1.0, 2.0, 4.0]))])


@pytest.fixture(scope="session")
def make_case() -> Callable[..., Case]:
    return random_case
