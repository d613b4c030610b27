"""`lvspec-eval build-demo`: train the demo world's tokenizer, target and drafts on this CPU.

It runs once (on 2 cores: tokenizer seconds, target 77 minutes, the last 7 of them its question
phase, its length fine-tune 45 (--length-steps), four more length stages (the pointer heads, then
three times with the order probe) 21-23 each (--pointer-steps), each from the last as stored, the
draft about 30 (estimated from the step times of the re-distillations; one step in four on long
videos, half of those on pruned ones, --draft-pruned-share; 8 at 8 frames only, --draft-long-share
0), the restyled draft 2; the Sparrow heads are `lvspec-eval train-sparrow`; docs/DEMO.md has the
measured times);
the checkpoints it writes are committed (stored in bfloat16, run in float32), so `make demo` needs
no training. Every stage logs to <work>/train_*.log, checkpoints as it goes and resumes where it
stopped when run again.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from ..backends.loading import DEMO_DIR as CHECKPOINTS
from ..demo import models
from . import demo as demo_training


def write_preprocessor_config(folder: Path) -> None:
    """The demo's pixel budget (no resizing of its 112x112 frames), read by the model loader."""
    p = models.DEMO_PREPROCESS
    cfg = {"min_pixels": p.min_pixels, "max_pixels": p.max_pixels, "patch_size": p.patch_size,
           "temporal_patch_size": p.temporal_patch_size, "merge_size": p.merge_size,
           "image_mean": list(p.image_mean), "image_std": list(p.image_std)}
    (folder / "preprocessor_config.json").write_text(json.dumps(cfg, indent=2) + "\n")


def store_bfloat16(folder: Path) -> None:
    """Rewrite a trained model's weights in bfloat16: half the size in the repository. The demo
    runs them in float32 (the loader casts to the `dtype` model_arg), and every figure in the
    README is measured with these stored weights."""
    from transformers import Qwen2_5_VLForConditionalGeneration

    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(folder, dtype=torch.float32)
    model.to(torch.bfloat16).save_pretrained(folder, safe_serialization=True)


def build(work: Path, out: Path, target_steps: int, question_steps: int, draft_steps: int, threads: int,
          restyle_steps: int = 300, length_steps: int = 600, draft_init: Path | None = None,
          draft_lr: float = 2e-3, draft_long_share: float = 0.25, draft_pruned_share: float = 0.5,
          pointer_steps: int = 300) -> None:
    torch.set_num_threads(threads)
    work.mkdir(parents=True, exist_ok=True)
    target_dir = out / "target"
    if not (target_dir / "config.json").exists():
        demo_training.train_target(work, out, steps=target_steps, question_steps=question_steps)
    write_preprocessor_config(target_dir)
    if length_steps and not (target_dir / demo_training.LENGTHS_MARKER).exists():
        demo_training.finetune_lengths(work, target_dir, steps=length_steps)
        store_bfloat16(target_dir)  # the second stage starts from the first as it was stored
    for recipe in demo_training.LATER_LENGTH_STAGES if length_steps and pointer_steps else ():
        if not (target_dir / demo_training.length_marker(recipe["name"])).exists():
            demo_training.finetune_lengths(work, target_dir, steps=pointer_steps, **recipe)
            store_bfloat16(target_dir)  # each stage starts from the last as it was stored
    store_bfloat16(target_dir)  # the drafts (and Sparrow heads) learn from the target as shipped
    if not (out / "draft" / "config.json").exists():
        demo_training.train_draft(work, out, target_dir, steps=draft_steps, lr=draft_lr, init=draft_init,
                          long_share=draft_long_share, pruned_share=draft_pruned_share)
    write_preprocessor_config(out / "draft")
    if not (out / "draft_restyled" / "config.json").exists():
        demo_training.restyle_draft(work, out, out / "draft", steps=restyle_steps)
    write_preprocessor_config(out / "draft_restyled")
    for folder in (out / "draft", out / "draft_restyled"):
        store_bfloat16(folder)


def _run(args: argparse.Namespace) -> int:
    build(Path(args.work), Path(args.out), args.target_steps, args.question_steps, args.draft_steps, args.threads,
          args.restyle_steps, args.length_steps, Path(args.draft_init) if args.draft_init else None, args.draft_lr,
          args.draft_long_share, args.draft_pruned_share, args.pointer_steps)
    print(f"demo checkpoints in {args.out}")
    return 0


def register(sub) -> None:
    p = sub.add_parser("build-demo", help="train the demo world's tokenizer, target and drafts (CPU, about 4 hours)")
    p.add_argument("--out", default=str(CHECKPOINTS), help="where the checkpoints go (default: the package's)")
    p.add_argument("--work", default=".cache/demo_build", help="logs, resumable training state")
    p.add_argument("--target-steps", type=int, default=4000, help="target optimiser steps of 16 samples, both phases")
    p.add_argument("--question-steps", type=int, default=400,
                   help="of those, the last ones on a question-rich mix (motion and order questions)")
    p.add_argument("--length-steps", type=int, default=600,
                   help="steps fine-tuning the target on videos of 16-512 frames (4,096 visual tokens in each), "
                        "after its 8-frame run; 0: none (the 8-frame target)")
    p.add_argument("--pointer-steps", type=int, default=300,
                   help="steps of each later length stage (a running count of the objects and the pointer heads "
                        "supervised onto the object each caption sentence names; then three times more with an "
                        "order-of-appearance probe on the object tokens); 0: none")
    p.add_argument("--draft-steps", type=int, default=700, help="draft distillation steps of 16 samples at 8 frames "
                   "(or fewer videos of 16-512 frames, see --draft-long-share)")
    p.add_argument("--draft-init", default=None,
                   help="start the draft's distillation from this draft folder instead of from scratch")
    p.add_argument("--draft-lr", type=float, default=2e-3, help="the draft distillation's peak learning rate")
    p.add_argument("--draft-long-share", type=float, default=0.25,
                   help="share of the draft's steps on 16-512 frame videos, 2,048 visual tokens a step (one video at "
                        "512 frames; 0: 8 frames only, for an 8-frame target)")
    p.add_argument("--draft-pruned-share", type=float, default=0.5,
                   help="of the draft's long steps, the share where it sees only the video tokens SpecVLM's pruning "
                        "keeps (10%%), against the target's full-video distributions")
    p.add_argument("--restyle-steps", type=int, default=300,
                   help="steps fine-tuning a copy of the draft on captions of another phrasing style (demo-draft-restyled)")
    p.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    p.set_defaults(func=_run)
