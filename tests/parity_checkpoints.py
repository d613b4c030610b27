"""Tiny random checkpoints saved in each family's public folder layout, for tests/test_parity.py.

Saved the way a released checkpoint is: weights and config, tokenizer, the processor's configs
(preprocessor_config.json, video_preprocessor_config.json, processor_config.json) and the family's
public chat template, so that lmms-eval's own classes load them with AutoProcessor. Saving the
processor needs torchvision (transformers' video processors), so this module runs inside
tests/parity_reference.py's subprocess. The tokenizer is the demo's (a 512-token vocabulary with
Qwen's special tokens): every prompt and answer still goes through the real templates and classes.
"""
from __future__ import annotations

import json
from pathlib import Path

TOKENIZER_DIR = Path(__file__).resolve().parent.parent / "lvspec_eval" / "demo" / "checkpoints" / "tokenizer"
INIT_RANGE = 0.3  # well-separated greedy choices (tests/conftest.py), so bf16 rounding cannot flip them

# The public Qwen2-VL / Qwen2.5-VL chat template (the checkpoints' chat_template.json)
QWEN2_5_VL_TEMPLATE = (
    "{% set image_count = namespace(value=0) %}{% set video_count = namespace(value=0) %}"
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}{{ message['content'] }}<|im_end|>\n"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "{% set image_count.value = image_count.value + 1 %}{% if add_vision_id %}Picture {{ image_count.value }}: {% endif %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "{% set video_count.value = video_count.value + 1 %}{% if add_vision_id %}Video {{ video_count.value }}: {% endif %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def build_qwen2_5_vl(path: Path) -> None:
    from transformers import (AutoTokenizer, GenerationConfig, Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration,
                              Qwen2_5_VLProcessor, Qwen2VLImageProcessor, Qwen2VLVideoProcessor)

    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    ids = tok.convert_tokens_to_ids
    head_dim, hidden = 16, 64
    text = dict(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=2, num_attention_heads=hidden // head_dim,
                num_key_value_heads=2, intermediate_size=2 * hidden, max_position_embeddings=32768,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
                bos_token_id=0, eos_token_id=ids("<|im_end|>"), pad_token_id=0, tie_word_embeddings=False,
                initializer_range=INIT_RANGE)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden, patch_size=14,
                  temporal_patch_size=2, spatial_merge_size=2, window_size=112, fullatt_block_indexes=[1],
                  tokens_per_second=2, initializer_range=INIT_RANGE)
    config = Qwen2_5_VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                              video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                              vision_end_token_id=ids("<|vision_end|>"), eos_token_id=ids("<|im_end|>"),
                              pad_token_id=0, tie_word_embeddings=False, initializer_range=INIT_RANGE)
    model = Qwen2_5_VLForConditionalGeneration(config).eval()
    # As released: generate() stops at <|im_end|> and <|endoftext|>; lmms-eval passes the tokenizer's eos only.
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")],
                                               pad_token_id=0, do_sample=False)
    model.save_pretrained(path)
    limits = {"size": {"shortest_edge": 3136, "longest_edge": 12845056}}  # Qwen2.5-VL's released limits
    processor = Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor(**limits),
                                    video_processor=Qwen2VLVideoProcessor(**limits), tokenizer=tok,
                                    chat_template=QWEN2_5_VL_TEMPLATE)
    processor.save_pretrained(path)



# Qwen3-VL's chat template renders a video part as Qwen2.5-VL's does; it adds no default system turn.
QWEN3_VL_TEMPLATE = QWEN2_5_VL_TEMPLATE.replace(
    "{% if loop.first and message['role'] != 'system' %}<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
    "{% endif %}", "")


def build_qwen3_vl(path: Path) -> None:
    """Qwen3-VL: patch 16, merge 2, DeepStack after the first two of three text layers, mean/std 0.5."""
    from transformers import AutoTokenizer, Qwen3VLConfig, Qwen3VLForConditionalGeneration

    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    ids = tok.convert_tokens_to_ids
    head_dim, hidden = 16, 64
    text = dict(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=3, num_attention_heads=hidden // head_dim,
                num_key_value_heads=2, head_dim=head_dim, intermediate_size=2 * hidden, max_position_embeddings=32768,
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3],
                                 "mrope_interleaved": True},
                eos_token_id=ids("<|im_end|>"), pad_token_id=0, initializer_range=INIT_RANGE)
    vision = dict(depth=3, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=hidden, patch_size=16,
                  temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                  deepstack_visual_indexes=[0, 1], initializer_range=INIT_RANGE)
    config = Qwen3VLConfig(text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"),
                           video_token_id=ids("<|video_pad|>"), vision_start_token_id=ids("<|vision_start|>"),
                           vision_end_token_id=ids("<|vision_end|>"), tie_word_embeddings=False,
                           initializer_range=INIT_RANGE)
    save_qwen3(Qwen3VLForConditionalGeneration(config).eval(), tok, path, QWEN3_VL_TEMPLATE)


def save_qwen3(model, tok, path: Path, template: str) -> None:
    """Weights, generation config and the Qwen3-VL processor files (Qwen3.5 ships the same processor)."""
    from transformers import GenerationConfig, Qwen2VLImageProcessor, Qwen3VLProcessor, Qwen3VLVideoProcessor

    ids = tok.convert_tokens_to_ids
    model.generation_config = GenerationConfig(bos_token_id=0, eos_token_id=[ids("<|im_end|>"), ids("<|endoftext|>")],
                                               pad_token_id=0, do_sample=False)
    model.save_pretrained(path)
    mean_std = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    processor = Qwen3VLProcessor(
        image_processor=Qwen2VLImageProcessor(patch_size=16, merge_size=2, **mean_std,
                                              size={"shortest_edge": 65536, "longest_edge": 16777216}),
        video_processor=Qwen3VLVideoProcessor(**mean_std, size={"shortest_edge": 4096, "longest_edge": 25165824}),
        tokenizer=tok, chat_template=template)
    processor.save_pretrained(path)


# Qwen3.5's public chat template (chat_template.jinja of the Qwen3.5 checkpoints), reduced to what a video
# question uses (no tools, no earlier assistant turns' reasoning): a system turn only first, every turn's
# content trimmed, and the generation prompt with its thinking switch: `<think>\n` opened unless
# enable_thinking is false, which closes an empty block instead.
QWEN3_5_TEMPLATE = (
    "{%- macro render(content) %}{%- if content is string %}{{- content }}{%- else %}{%- for item in content %}"
    "{%- if item.type == 'image' or 'image' in item %}{{- '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item.type == 'video' or 'video' in item %}{{- '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif 'text' in item %}{{- item.text }}{%- endif %}{%- endfor %}{%- endif %}{%- endmacro %}"
    "{%- for message in messages %}{%- set content = render(message.content)|trim %}"
    "{%- if message.role == 'system' and not loop.first %}{{- raise_exception('System message must be at the "
    "beginning.') }}{%- endif %}"
    "{{- '<|im_start|>' + message.role + '\\n' + content + '<|im_end|>\\n' }}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}{%- endif %}"
)


def qwen3_5_text(tok, hidden: int = 64, layers: int = 4) -> dict:
    """A tiny Qwen3.5 text model: Gated DeltaNet layers, every fourth one full attention (as released),
    partial interleaved M-RoPE (a quarter of each head), gated attention."""
    head_dim = 16
    return dict(vocab_size=len(tok), hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=hidden // head_dim,
                num_key_value_heads=2, head_dim=head_dim, intermediate_size=2 * hidden, max_position_embeddings=32768,
                linear_conv_kernel_dim=4, linear_key_head_dim=8, linear_value_head_dim=8, linear_num_key_heads=2,
                linear_num_value_heads=4,
                layer_types=["full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(layers)],
                rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_interleaved": True,
                                 "mrope_section": [1, 1, 0], "partial_rotary_factor": 0.25},
                eos_token_id=tok.convert_tokens_to_ids("<|im_end|>"), pad_token_id=0, initializer_range=INIT_RANGE)


def build_qwen3_5(path: Path, moe: bool = False) -> None:
    """Qwen3.5 (dense; `moe`: Qwen3.5-MoE's sparse MLP): Qwen3-VL's vision tower without DeepStack."""
    import transformers
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    ids = tok.convert_tokens_to_ids
    text = qwen3_5_text(tok)
    if moe:
        text.pop("intermediate_size")
        text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    vision = dict(depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=text["hidden_size"],
                  patch_size=16, temporal_patch_size=2, spatial_merge_size=2, num_position_embeddings=16,
                  initializer_range=INIT_RANGE)
    name = "Qwen3_5Moe" if moe else "Qwen3_5"
    config = getattr(transformers, f"{name}Config")(
        text_config=text, vision_config=vision, image_token_id=ids("<|image_pad|>"), video_token_id=ids("<|video_pad|>"),
        vision_start_token_id=ids("<|vision_start|>"), vision_end_token_id=ids("<|vision_end|>"),
        tie_word_embeddings=False, initializer_range=INIT_RANGE)
    model = getattr(transformers, f"{name}ForConditionalGeneration")(config).eval()
    save_qwen3(model, tok, path, QWEN3_5_TEMPLATE)



# LLaVA-OneVision's public processor template (transformers' own LLaVA-OneVision processor tests use it)
LLAVA_ONEVISION_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + ' '}}{# Render all images first #}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'image') %}{{ '<image>' }}{% endfor %}"
    "{# Render all video then #}{% for content in message['content'] | selectattr('type', 'equalto', 'video') %}"
    "{{ '<video>' }}{% endfor %}{# Render all text next #}{% if message['role'] != 'assistant' %}"
    "{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}{{ '\\n' + content['text'] }}"
    "{% endfor %}{% else %}{% for content in message['content'] | selectattr('type', 'equalto', 'text') %}"
    "{% generation %}{{ '\\n' + content['text'] }}{% endgeneration %}{% endfor %}{% endif %}{{'<|im_end|>'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def build_llava_onevision(path: Path) -> None:
    from transformers import (AutoTokenizer, LlavaOnevisionConfig, LlavaOnevisionForConditionalGeneration,
                              LlavaOnevisionImageProcessor, LlavaOnevisionProcessor, LlavaOnevisionVideoProcessor,
                              Qwen2Config, SiglipVisionConfig)

    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    tok.add_special_tokens({"additional_special_tokens": ["<image>", "<video>"]})
    tok.chat_template = None  # the demo tokenizer's own
    ids = tok.convert_tokens_to_ids
    text = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32768,
                       eos_token_id=tok.eos_token_id, pad_token_id=0, tie_word_embeddings=False,
                       initializer_range=INIT_RANGE)
    side = 56  # a 4x4 patch grid, pooled to 2x2 tokens per frame (a released 384 px SigLIP: 27x27 -> 14x14)
    vision = SiglipVisionConfig(image_size=side, patch_size=14, hidden_size=32, intermediate_size=64,
                                num_hidden_layers=2, num_attention_heads=2, vision_use_head=False,
                                initializer_range=INIT_RANGE)
    config = LlavaOnevisionConfig(text_config=text.to_dict(), vision_config=vision.to_dict(),
                                  image_token_index=ids("<image>"), video_token_index=ids("<video>"),
                                  vision_feature_select_strategy="full", vision_feature_layer=-1,
                                  initializer_range=INIT_RANGE)
    LlavaOnevisionForConditionalGeneration(config).eval().save_pretrained(path)
    norm = {"image_mean": [0.5] * 3, "image_std": [0.5] * 3}
    processor = LlavaOnevisionProcessor(
        image_processor=LlavaOnevisionImageProcessor(size={"height": side, "width": side}, **norm),
        video_processor=LlavaOnevisionVideoProcessor(size={"height": side, "width": side}, **norm), tokenizer=tok,
        num_image_tokens=(side // 14) ** 2, vision_feature_select_strategy="full",
        chat_template=LLAVA_ONEVISION_TEMPLATE)
    processor.save_pretrained(path)
    # the legacy layout: the processor's template in chat_template.json, none in the tokenizer (lmms-eval's
    # simple llava_hf then renders with its Vicuna fallback, ours must too)
    template = (path / "chat_template.jinja").read_text()
    (path / "chat_template.jinja").unlink()
    (path / "chat_template.json").write_text(json.dumps({"chat_template": template}))



def build_qwen3_5_moe(path: Path) -> None:
    """Qwen3.5-MoE (4 experts, 2 a token, a shared expert), saved under a name lmms-eval reads as MoE."""
    build_qwen3_5(path, moe=True)
