"""Demo samples as model inputs: prompt ids with the video span, pixels, labels.

Seed ranges keep splits apart: training scenes use seeds from TRAIN_SEED, held-out evaluation
during training HELDOUT_SEED, and the lmms-eval tasks TEST_SEED (never trained on).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..backends.qwen_vision import VideoPixels, expand_video_tokens, preprocess_video
from . import models, world

TRAIN_SEED = 0
HELDOUT_SEED = 1_000_000
TEST_SEED = 2_000_000


def chat_prompt(tokenizer, text: str) -> str:
    messages = [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": text}]}]
    return tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


@dataclass
class Sample:
    input_ids: list[int]  # prompt + answer + <|im_end|>
    num_prompt: int  # loss is taken on the rest
    pixels: VideoPixels
    scene: world.Scene
    question: dict | None = None  # the multiple-choice question answered, None for a caption


HARD_KINDS = ("motion", "order")


@dataclass(frozen=True)
class TaskMix:
    """How training samples are drawn: a caption with probability `caption`, else a multiple-choice
    question; with probability `hard` that question is of a HARD_KINDS kind (the kinds the target
    answers worst while its captions state the same facts right); captions are phrased in style
    `favourite` (world.make_caption)."""
    caption: float = 0.5
    hard: float = 0.0
    favourite: int = 0


QUESTION_MIX = TaskMix(caption=0.25, hard=0.6)
RESTYLE_MIX = TaskMix(caption=0.75, favourite=1)  # the restyled draft's corpus: mostly captions, the other style


def sample_task(scene: world.Scene, rng: np.random.Generator, mix: TaskMix = TaskMix()) -> tuple[str, str, dict | None]:
    """(prompt, answer, question or None) drawn by `mix` (default: half captions, half questions)."""
    if rng.random() < mix.caption:
        return world.CAPTION_PROMPT, world.make_caption(scene, int(rng.integers(1 << 30)), mix.favourite), None
    qs = world.make_questions(scene)
    if mix.hard > 0 and rng.random() < mix.hard:
        qs = [q for q in qs if q["kind"] in HARD_KINDS] or qs
    q = qs[int(rng.integers(len(qs)))]
    return world.format_mcq(q), q["answer"], q


def make_sample(tokenizer, video_token_id: int, seed: int, num_frames: int = models.FRAMES,
                rng: np.random.Generator | None = None, noise: float = 0.0, mix: TaskMix = TaskMix()) -> Sample:
    scene = world.make_scene(seed)
    rng = rng or np.random.default_rng(seed)
    frames = world.render(scene, num_frames, models.FRAME_SIZE, models.FRAME_SIZE)
    if noise > 0:  # mimic codec noise so the model does not rely on exact pixel values
        frames = np.clip(frames + rng.normal(0, noise, frames.shape), 0, 255).astype(np.uint8)
    pixels = preprocess_video(frames, models.FPS, models.DEMO_PREPROCESS)
    prompt, answer, question = sample_task(scene, rng, mix)
    ids = tokenizer(chat_prompt(tokenizer, prompt)).input_ids
    ids = expand_video_tokens(ids, video_token_id, pixels.num_visual_tokens)
    answer_ids = tokenizer(answer).input_ids + [tokenizer.convert_tokens_to_ids("<|im_end|>")]
    return Sample(ids + answer_ids, len(ids), pixels, scene, question)


def collate(samples: list[Sample], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded batch; labels are -100 outside the answers."""
    length = max(len(s.input_ids) for s in samples)
    ids = torch.full((len(samples), length), pad_id, dtype=torch.long)
    labels = torch.full_like(ids, -100)
    mask = torch.zeros_like(ids)
    for b, s in enumerate(samples):
        n = len(s.input_ids)
        ids[b, :n] = torch.tensor(s.input_ids)
        labels[b, s.num_prompt:n] = ids[b, s.num_prompt:n]
        mask[b, :n] = 1
    return {
        "input_ids": ids,
        "labels": labels,
        "attention_mask": mask,
        "pixel_values_videos": torch.cat([s.pixels.pixel_values for s in samples]),
        "video_grid_thw": torch.cat([s.pixels.grid_thw for s in samples]),
        "second_per_grid_ts": torch.tensor([s.pixels.second_per_grid for s in samples]),
    }
