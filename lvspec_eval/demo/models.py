"""Configs of the demo world's models: tiny instances of the real Qwen2.5-VL architecture.

The target and the draft share the tokenizer and the visual-token layout (same patch, temporal
patch and merge sizes), as a real Qwen2.5-VL-32B / 7B pair does; the draft's vision tower starts
as a copy of the target's.
"""
from __future__ import annotations

from transformers import Qwen2_5_VLConfig

from ..backends.qwen_vision import VisionPreprocessConfig

FRAMES = 8  # frames per demo video at the trained length
FRAME_SIZE = 112  # pixels per side -> 4x4 merged tokens per temporal patch, 64 visual tokens
FPS = 4.0
LONG_FRAMES = 256  # long variant: 2,048 visual tokens at the same resolution

# No resizing for the demo's 112x112 frames; real models keep Qwen's own budget.
DEMO_PREPROCESS = VisionPreprocessConfig(min_pixels=28 * 28, max_pixels=448 * 448)


def _vision(out_hidden: int) -> dict:
    return dict(
        depth=4, hidden_size=128, intermediate_size=384, num_heads=4, out_hidden_size=out_hidden,
        patch_size=14, temporal_patch_size=2, spatial_merge_size=2, window_size=112,
        fullatt_block_indexes=[1, 3], tokens_per_second=2,
    )


def _mrope_section(head_dim: int) -> list[int]:
    return [head_dim // 8, 3 * head_dim // 16, 3 * head_dim // 16]


def _text(vocab: int, hidden: int, layers: int, heads: int, kv_heads: int, inter: int) -> dict:
    return dict(
        vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=kv_heads, intermediate_size=inter, max_position_embeddings=8192,
        # M-RoPE splits head_dim / 2 frequencies over (t, h, w) as Qwen's 16/24/24 of 64 does.
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": _mrope_section(hidden // heads)},
        bos_token_id=0, eos_token_id=2, pad_token_id=0, tie_word_embeddings=False,
    )


def _config(tokenizer, text: dict, vision: dict) -> Qwen2_5_VLConfig:
    ids = tokenizer.convert_tokens_to_ids
    cfg = Qwen2_5_VLConfig(
        text_config=text, vision_config=vision,
        image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        bos_token_id=text["bos_token_id"], eos_token_id=text["eos_token_id"], pad_token_id=0,
        tie_word_embeddings=False,
    )
    return cfg


def target_config(tokenizer) -> Qwen2_5_VLConfig:
    """8 layers x 256 wide: the demo's verifier."""
    return _config(tokenizer, _text(len(tokenizer), 256, 8, 4, 2, 768), _vision(256))


def draft_config(tokenizer) -> Qwen2_5_VLConfig:
    """1 layer x 128 wide: the demo's Std-SD drafter (a decoder layer's compute is small next to
    the per-forward overhead on a CPU, so depth is what separates draft and target costs)."""
    return _config(tokenizer, _text(len(tokenizer), 128, 1, 4, 2, 384), _vision(128))
