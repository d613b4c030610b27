"""Experiment (not shipped): does a question mix richer in motion and order questions fix the
shipped target's MC misses? Continues the shipped run's training state (`build-demo --work W`:
W/target.ckpt, step 3,600) for STEPS steps of 16 samples with the shipped recipe's losses, but 75%
multiple-choice samples, of which 60% are motion or order questions.
usage: python scripts/research/finetune_mc_mix.py CKPT STEPS LR OUT   (from the repository root)"""
import math, sys, time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from lvspec_eval.demo import data, models, world
from lvspec_eval.training import demo as train

torch.set_num_threads(2)
ckpt, steps, lr, out = Path(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), Path(sys.argv[4])
tok = AutoTokenizer.from_pretrained("lvspec_eval/demo/checkpoints/tokenizer")
model = Qwen2_5_VLForConditionalGeneration(models.target_config(tok)).float()
modules = {"model": model, **train.training_heads(model.config.text_config.hidden_size)}
params = [p for m in modules.values() for p in m.parameters()]
opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
start = train._resume(ckpt, modules, opt)
print("resumed at step", start, flush=True)


def sample_task(scene, rng, mix=None):  # the run's own mix (data.QUESTION_MIX is what build-demo ships)
    qs = world.make_questions(scene)
    if rng.random() < 0.25:
        return world.CAPTION_PROMPT, world.make_caption(scene, seed=int(rng.integers(1 << 30))), None
    hard = [q for q in qs if q["kind"] in ("motion", "order")]
    pool = hard if rng.random() < 0.6 else qs
    q = pool[int(rng.integers(len(pool)))]
    return world.format_mcq(q), q["answer"], q


data.sample_task = sample_task
words = train.word_ids(tok)
rng = np.random.default_rng(77)
model.train()
t0 = time.time()
for k in range(steps):
    for g in opt.param_groups:
        g["lr"] = lr * min(1.0, (k + 1) / 30) * 0.5 * (1 + math.cos(math.pi * k / steps))
    step = 10_000 + k  # fresh scenes, past the shipped run's
    seeds = range(data.TRAIN_SEED + step * 16, data.TRAIN_SEED + (step + 1) * 16)
    samples = [data.make_sample(tok, model.config.video_token_id, s, rng=rng, noise=4.0) for s in seeds]
    losses = train.target_losses(model, modules, samples, models.FRAMES, words)
    loss = sum(losses.values())
    train._optimise(opt, loss, params)
    if k % 25 == 0:
        print(f"step {k} lm {losses['lm'].item():.3f} loss {loss.item():.3f} {time.time() - t0:.0f}s", flush=True)
model.eval()
model.save_pretrained(out, safe_serialization=True)
print("saved", out, f"{time.time() - t0:.0f}s")
