"""Fast checks of what tests/test_parity.py proves against lmms-eval's classes (slow, needs their packages):
prompt assembly, the simple classes' prompts, and the torch resize's fixed points."""
from __future__ import annotations

import numpy as np
import torch
from lmms_eval.protocol import ChatMessages

from lvspec_eval.backends import pixels
from lvspec_eval.backends.chat_template import RenderedPrompt, load_tokenizer, render_chat
from lvspec_eval.backends.loading import DEMO_DIR
from lvspec_eval.models.lvspec import messages_to_prompt
from lvspec_eval.models.parity import llava_hf_simple_prompt, qwen_simple_prompt

TOKENIZER = load_tokenizer(str(DEMO_DIR / "tokenizer"))


def text_of(prompt, num_videos: int = 1) -> str:
    return TOKENIZER.decode(render_chat(TOKENIZER, prompt, num_videos))


def test_a_tasks_turns_and_part_order_are_kept_and_text_parts_concatenated():
    task = [{"role": "system", "content": [{"type": "text", "text": "Answer briefly."}]},
            {"role": "user", "content": [{"type": "text", "text": "Look:"}, {"type": "video", "url": "a.mp4"},
                                         {"type": "text", "text": "the ball"}, {"type": "text", "text": " and cube?"}]}]
    messages, paths = messages_to_prompt(ChatMessages(messages=task))
    assert paths == ["a.mp4"]
    assert text_of(messages) == ("<|im_start|>system\nAnswer briefly.<|im_end|>\n<|im_start|>user\nLook:"
                                 "<|vision_start|><|video_pad|><|vision_end|>the ball and cube?<|im_end|>\n"
                                 "<|im_start|>assistant\n")


def test_simple_prompts_follow_lmms_evals_simple_classes():
    qwen = text_of(qwen_simple_prompt("<image>what colour", 1))
    assert qwen.startswith("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
                           "<|vision_start|><|video_pad|><|vision_end|>what colour<|im_end|>")
    # llava_hf: a string turn "<video>\n" + context, the tokenizer's own template (the demo's renders strings)
    llava = llava_hf_simple_prompt("what colour", 1, TOKENIZER)
    assert isinstance(llava, RenderedPrompt) and llava.startswith("<|im_start|>user\n<video>\nwhat colour<|im_end|>")
    TOKENIZER.own_chat_template, kept = None, TOKENIZER.own_chat_template
    try:  # without one, lmms-eval's Vicuna fallback
        assert llava_hf_simple_prompt("q", 1, TOKENIZER).endswith("USER: <video>\nq ASSISTANT:")
    finally:
        TOKENIZER.own_chat_template = kept


def test_resizes_keep_unchanged_sizes_and_give_integer_values():
    frames = np.random.default_rng(0).integers(0, 256, size=(3, 30, 44, 3), dtype=np.uint8)
    same = pixels.resize_qwen_vl_utils(frames, 30, 44)
    assert torch.equal(same, torch.from_numpy(frames).permute(0, 3, 1, 2).float())
    down = pixels.resize_qwen_vl_utils(frames, 28, 28)
    assert down.shape == (3, 3, 28, 28) and torch.equal(down, down.round()) and down.min() >= 0 and down.max() <= 255
    assert pixels.resize_transformers(frames, 28, 28).dtype == torch.uint8
    # fused: (x - 255 * mean) / (255 * std) in float32, as transformers' processors compute it
    x = torch.full((1, 3, 1, 1), 255.0)
    assert torch.allclose(pixels.normalise_fused(x, (0.5,) * 3, (0.5,) * 3), torch.ones(1, 3, 1, 1))
