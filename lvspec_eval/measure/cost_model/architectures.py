"""The real architectures the cost model times, and the same architectures at a smaller scale.

ARCHITECTURES: the text decoders of the real checkpoints (layer counts, widths, heads, vocabularies);
PAIRS: the papers' target/draft pairs that fit one GPU. `shrink` scales one down for a CPU (widths
with the heads, head_dim kept, depth capped: the timings scale the layer stack back up), and
`model_config` turns one into a transformers config with a stand-in vision tower that is never run.
"""
from __future__ import annotations

from dataclasses import dataclass

# Qwen3.5's Gated DeltaNet layers: key heads x head dims, convolution, one full-attention layer in 4
QWEN3_5_LINEAR = dict(linear_k_heads=16, linear_k_dim=128, linear_v_dim=128, conv_kernel=4, full_every=4)
# Text decoders of the real checkpoints (their config.json text_config values).
ARCHITECTURES = {
    "qwen2.5-vl-7b": dict(family="qwen2_5_vl", hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128,
                          intermediate=18944, vocab=152064, tie=False),
    "qwen2.5-vl-32b": dict(family="qwen2_5_vl", hidden=5120, layers=64, heads=40, kv_heads=8, head_dim=128,
                           intermediate=27648, vocab=152064, tie=False),
    # Qwen3-VL's text models have the shapes of Qwen3-1.7B/4B/8B/32B (head_dim 128, 8 KV heads, vocabulary
    # 151,936; the two small ones tie their embeddings), as a public Megatron model-provider file lists them
    # (its 8B entry checked against Qwen/Qwen3-VL-8B-Instruct's config.json); not read from the hub here.
    "qwen3-vl-2b": dict(family="qwen3_vl", hidden=2048, layers=28, heads=16, kv_heads=8, head_dim=128,
                        intermediate=6144, vocab=151936, tie=True),
    "qwen3-vl-4b": dict(family="qwen3_vl", hidden=2560, layers=36, heads=32, kv_heads=8, head_dim=128,
                        intermediate=9728, vocab=151936, tie=True),
    "qwen3-vl-8b": dict(family="qwen3_vl", hidden=4096, layers=36, heads=32, kv_heads=8, head_dim=128,
                        intermediate=12288, vocab=151936, tie=False),
    "qwen3-vl-32b": dict(family="qwen3_vl", hidden=5120, layers=64, heads=64, kv_heads=8, head_dim=128,
                         intermediate=25600, vocab=151936, tie=False),
    "llava-ov-0.5b": dict(family="llava_onevision", hidden=896, layers=24, heads=14, kv_heads=2, head_dim=64,
                          intermediate=4864, vocab=151936, tie=True),
    "llava-ov-7b": dict(family="llava_onevision", hidden=3584, layers=28, heads=28, kv_heads=4, head_dim=128,
                        intermediate=18944, vocab=152128, tie=False),
    # Qwen3.5 (model_type qwen3_5 / qwen3_5_moe; vocabulary 248,320, head_dim 256, a full-attention layer every
    # 4th, Gated DeltaNet layers with 16 key heads of 128, conv kernel 4), from public copies of the
    # checkpoints' config.json (not read from the hub here):
    # 2B: the config.json of a Qwen3.5-2B fine-tune (lawrence3699/Jev-Style-Qwen3.5-2B-Decision-MLX-bf16):
    #   hidden 2048, 24 layers, 8 heads / 2 KV, MLP 6144, 16 value heads, tied embeddings.
    "qwen3.5-2b": dict(family="qwen3_5", hidden=2048, layers=24, heads=8, kv_heads=2, head_dim=256,
                       intermediate=6144, vocab=248320, tie=True, **QWEN3_5_LINEAR, linear_v_heads=16),
    # 4B: two public test configs pinned to Qwen3.5-4B: hidden 2560, 32 layers, 16 heads / 4 KV, MLP 9216,
    #   32 value heads, tied embeddings.
    "qwen3.5-4b": dict(family="qwen3_5", hidden=2560, layers=32, heads=16, kv_heads=4, head_dim=256,
                       intermediate=9216, vocab=248320, tie=True, **QWEN3_5_LINEAR, linear_v_heads=32),
    # 27B: THUDM/slime scripts/models/qwen3.5-27B.sh (hidden 5120, 64 layers, 24 heads / 4 query groups of
    #   256, MLP 17408, untied); its 48 value heads from a public Qwen3_5Config of that shape.
    "qwen3.5-27b": dict(family="qwen3_5", hidden=5120, layers=64, heads=24, kv_heads=4, head_dim=256,
                        intermediate=17408, vocab=248320, tie=False, **QWEN3_5_LINEAR, linear_v_heads=48),
    # 35B-A3B (MoE): THUDM/slime scripts/models/qwen3.5-35B-A3B.sh: hidden 2048, 40 layers, 16 heads / 2 query
    #   groups, 256 experts (8 a token) of 512 and a shared expert of 512, 32 value heads, untied.
    "qwen3.5-35b-a3b": dict(family="qwen3_5", hidden=2048, layers=40, heads=16, kv_heads=2, head_dim=256,
                            intermediate=512, vocab=248320, tie=False, **QWEN3_5_LINEAR, linear_v_heads=32,
                            experts=256, experts_per_token=8, shared_intermediate=512),
}


# target / draft pairs of the papers that fit one GPU (72B targets need several)
PAIRS = {
    "qwen2.5-vl-32b/7b": ("qwen2.5-vl-32b", "qwen2.5-vl-7b"),  # SpecVLM, LVSpec
    "llava-ov-7b/0.5b": ("llava-ov-7b", "llava-ov-0.5b"),  # Sparrow's target with a Std-SD draft
    "qwen3-vl-8b/2b": ("qwen3-vl-8b", "qwen3-vl-2b"),
    "qwen3-vl-32b/2b": ("qwen3-vl-32b", "qwen3-vl-2b"),
    "qwen3.5-27b/2b": ("qwen3.5-27b", "qwen3.5-2b"),
    "qwen3.5-35b-a3b/2b": ("qwen3.5-35b-a3b", "qwen3.5-2b"),  # an MoE target, a dense draft (one tokenizer)
}
MODEL_CLASSES = {"qwen2_5_vl": "Qwen2_5_VLForConditionalGeneration", "qwen3_vl": "Qwen3VLForConditionalGeneration",
                 "qwen3_5": "Qwen3_5ForConditionalGeneration", "qwen3_5_moe": "Qwen3_5MoeForConditionalGeneration",
                 "llava_onevision": "LlavaOnevisionForConditionalGeneration"}
MIN_VOCAB = 64  # above the five special ids a synthetic prompt uses


@dataclass(frozen=True)
class Scale:
    width: float = 1.0  # multiplies attention heads (and with them hidden and MLP widths)
    max_layers: int | None = None
    vocab_size: int | None = None
    head_dim: int | None = None

    def __post_init__(self):
        if not 0 < self.width <= 1:
            raise ValueError(f"scale width={self.width}; expected 0 < width <= 1")
        for name in ("max_layers", "vocab_size", "head_dim"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name}={value}; expected a positive integer")


def shrink(arch: dict, scale: Scale, layers: int | None = None) -> dict:
    """The architecture at `scale`: heads (a multiple of the KV heads) and widths shrink together.

    A capped depth is not a smaller model: the timings scale the decoder layers' share back up to
    the real depth (`real_layers`, see timing.timed_call). The vocabulary shrinks with the width, unless
    `vocab_size` is given, so the output layer (~ width x vocab) keeps its real share against the
    layers (~ width^2).
    """
    head_dim = scale.head_dim or arch["head_dim"]
    kv = max(1, round(arch["kv_heads"] * scale.width))
    heads = max(kv, round(arch["heads"] * scale.width / kv) * kv)
    # the width follows the heads (Qwen3/Qwen3.5 widths are not heads x head_dim: Qwen3.5-27B has 24 x 256
    # for 5,120, Qwen3-VL-32B 64 x 128 for 5,120)
    hidden = round(arch["hidden"] * heads / arch["heads"] * head_dim / arch["head_dim"])
    real_layers = layers or arch["layers"]
    depth = min(real_layers, scale.max_layers) if scale.max_layers else real_layers
    inter = max(8, round(arch["intermediate"] * hidden / arch["hidden"]))
    vocab = scale.vocab_size or max(MIN_VOCAB, round(arch["vocab"] * hidden / arch["hidden"]))
    out = {**arch, "hidden": hidden, "heads": heads, "kv_heads": kv, "head_dim": head_dim, "layers": depth,
           "real_layers": real_layers, "intermediate": inter, "vocab": min(vocab, arch["vocab"])}
    if "linear_k_heads" in arch:  # Gated DeltaNet heads shrink like the attention heads (value heads: a multiple)
        k = max(1, round(arch["linear_k_heads"] * scale.width))
        out.update(linear_k_heads=k, linear_v_heads=k * (arch["linear_v_heads"] // arch["linear_k_heads"]))
    if "shared_intermediate" in arch:
        out["shared_intermediate"] = max(8, round(arch["shared_intermediate"] * hidden / arch["hidden"]))
    return out


def text_config(arch: dict) -> dict:
    """transformers text_config keys; Qwen's M-RoPE splits head_dim / 2 as 16/24/24 of 64 does."""
    hd = arch["head_dim"]
    rope = {"rope_type": "default", "rope_theta": 1_000_000.0}
    if arch["family"] in ("qwen2_5_vl", "qwen3_vl"):
        rope["mrope_section"] = [hd // 8, 3 * hd // 16, 3 * hd // 16]
    if arch["family"] in ("qwen3_vl", "qwen3_5"):
        rope["mrope_interleaved"] = True
    eos = arch["vocab"] - 5
    out = dict(model_type="qwen2", vocab_size=arch["vocab"], hidden_size=arch["hidden"],
               num_hidden_layers=arch["layers"], num_attention_heads=arch["heads"],
               num_key_value_heads=arch["kv_heads"], head_dim=hd, intermediate_size=arch["intermediate"],
               max_position_embeddings=131072, rope_parameters=rope, tie_word_embeddings=arch["tie"],
               bos_token_id=eos, eos_token_id=eos, pad_token_id=eos)
    if arch["family"] == "qwen3_5":
        out.update(qwen3_5_text(arch))
    return out


def qwen3_5_text(arch: dict) -> dict:
    """Qwen3.5's own text_config keys: the layer pattern, the Gated DeltaNet sizes, a quarter of each head
    rotated (M-RoPE 11/11/10 of 32 at head_dim 256), and the MoE sizes where the model has experts."""
    every, depth = arch["full_every"], arch["layers"]
    kinds = ["full_attention" if (i + 1) % every == 0 else "linear_attention" for i in range(depth)]
    if "full_attention" not in kinds:  # a stack capped below `every` layers keeps one full-attention layer
        kinds[-1] = "full_attention"
    half = int(arch["head_dim"] * 0.25) // 2
    side = round(half * 11 / 32)
    rope = {"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
            "mrope_interleaved": True, "mrope_section": [side, side, half - 2 * side]}
    out = dict(layer_types=kinds, linear_num_key_heads=arch["linear_k_heads"],
               linear_num_value_heads=arch["linear_v_heads"], linear_key_head_dim=arch["linear_k_dim"],
               linear_value_head_dim=arch["linear_v_dim"], linear_conv_kernel_dim=arch["conv_kernel"],
               rope_parameters=rope)
    if "experts" in arch:
        out.update(num_experts=arch["experts"], num_experts_per_tok=arch["experts_per_token"],
                   moe_intermediate_size=arch["intermediate"],
                   shared_expert_intermediate_size=arch["shared_intermediate"])
    return out


def model_class(arch: dict) -> str:
    """The transformers class of an architecture (Qwen3.5 with experts: the MoE class)."""
    return MODEL_CLASSES["qwen3_5_moe" if arch["family"] == "qwen3_5" and "experts" in arch else arch["family"]]


def special_ids(vocab: int) -> dict:
    """Token ids of the visual markers, placed at the top of the (possibly shrunk) vocabulary."""
    return {"video": vocab - 1, "image": vocab - 2, "vision_start": vocab - 3, "vision_end": vocab - 4}


def model_config(arch: dict):
    """A full VLM config with a one-layer stand-in vision tower (never run: features are random)."""
    from transformers import (
        LlavaOnevisionConfig,
        Qwen2_5_VLConfig,
        Qwen3_5Config,
        Qwen3_5MoeConfig,
        Qwen3VLConfig,
    )

    text, ids = text_config(arch), special_ids(arch["vocab"])
    if arch["family"] == "qwen3_5":  # Qwen3-VL's tower without DeepStack
        text.pop("model_type")
        if "experts" in arch:
            text.pop("intermediate_size")
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=arch["hidden"],
                      patch_size=16, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16)
        config_cls = Qwen3_5MoeConfig if "experts" in arch else Qwen3_5Config
        return config_cls(text_config=text, vision_config=vision, video_token_id=ids["video"],
                          image_token_id=ids["image"], vision_start_token_id=ids["vision_start"],
                          vision_end_token_id=ids["vision_end"], tie_word_embeddings=arch["tie"])
    if arch["family"] == "qwen3_vl":
        text.pop("model_type")
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=arch["hidden"],
                      patch_size=16, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                      deepstack_visual_indexes=[])
        return Qwen3VLConfig(text_config=text, vision_config=vision, video_token_id=ids["video"],
                             image_token_id=ids["image"], vision_start_token_id=ids["vision_start"],
                             vision_end_token_id=ids["vision_end"], tie_word_embeddings=arch["tie"])
    if arch["family"] == "qwen2_5_vl":
        vision = dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=arch["hidden"],
                      patch_size=14, temporal_patch_size=2, spatial_merge_size=2, window_size=112,
                      fullatt_block_indexes=[0], tokens_per_second=2)
        return Qwen2_5_VLConfig(text_config=text, vision_config=vision, video_token_id=ids["video"],
                                image_token_id=ids["image"], vision_start_token_id=ids["vision_start"],
                                vision_end_token_id=ids["vision_end"], tie_word_embeddings=arch["tie"])
    vision = dict(model_type="siglip_vision_model", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, image_size=28, patch_size=14)
    return LlavaOnevisionConfig(text_config=text, vision_config=vision, video_token_id=ids["video"],
                                image_token_id=ids["image"], tie_word_embeddings=arch["tie"])
