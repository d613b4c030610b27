"""A byte-level BPE tokenizer trained locally on the demo world's text.

Small vocabulary (so the output layer does not dominate the demo models' cost), Qwen2.5-VL's
special tokens and chat format, and a byte fallback so any prompt an lmms-eval task sends encodes.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from . import world

SPECIAL_TOKENS = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|vision_start|>", "<|vision_end|>", "<|video_pad|>", "<|image_pad|>",
]

# Qwen2.5-VL's chat format without the default system turn (the demo models never saw one).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}"
    "{% if part['type'] == 'video' %}<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif part['type'] == 'image' %}<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def training_corpus(num_scenes: int = 3000) -> list[str]:
    texts = [world.CAPTION_PROMPT, world.MCQ_SUFFIX, "user", "assistant", "system"]
    for seed in range(num_scenes):
        scene = world.make_scene(10_000_000 + seed)
        texts.append(world.make_caption(scene))
        texts.extend(world.format_mcq(q) for q in world.make_questions(scene))
    return texts


def train_tokenizer(vocab_size: int = 640) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=SPECIAL_TOKENS[1:],
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tokenizer(tok: PreTrainedTokenizerFast, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
