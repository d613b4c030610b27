"""The demo target at every length of the speedup curve, and the length fine-tune that makes it so
(lvspec_eval/demo/train.py: `finetune_lengths`, `_length_step`; `lvspec-eval build-demo`)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from lvspec_eval.demo import data, models, train

CHECKPOINTS = Path(train.__file__).resolve().parent / "checkpoints"


def test_length_steps_follow_budget_curriculum_and_share():
    rng = np.random.default_rng(0)
    steps, budget = 1000, 4096
    plans = [(step, *train._length_step(step, steps, 16, budget, 0.25, rng)) for step in range(steps)]
    trained = [p for p in plans if p[1] == models.FRAMES]
    assert 0.18 < len(trained) / steps < 0.32
    assert all(n == 16 and mix == data.QUESTION_MIX for _, _, n, mix in trained)
    long = [p for p in plans if p[1] != models.FRAMES]
    per_frame = train.visual_tokens_per_frame()
    # as many samples as fit the budget (at least one, at most a batch)
    assert all(n == min(16, max(1, budget // (f * per_frame))) and mix == train.LONG_MIX for _, f, n, mix in long)
    # the curriculum: nothing past 128 frames in its first 15%, past 256 before 35%; 512 reached
    assert max(f for s, f, *_ in long if s < 150) <= 128
    assert max(f for s, f, *_ in long if s < 350) <= 256
    assert {f for s, f, *_ in long if s >= 350} == set(train.LENGTH_LADDER)


def test_finetune_lengths_trains_logs_and_resumes(tmp_path, monkeypatch):
    target = tmp_path / "target"
    shutil.copytree(CHECKPOINTS / "target", target)
    (target / train.LENGTHS_MARKER).unlink(missing_ok=True)  # the shipped target's record of its own fine-tune
    before = Qwen2_5_VLForConditionalGeneration.from_pretrained(target, dtype=torch.float32).state_dict()
    work = tmp_path / "work"
    work.mkdir()
    kwargs = dict(batch_size=2, trained_share=1.0, ckpt_every=1, eval_every=100, length_eval={models.FRAMES: 1})
    optimise = train._optimise

    def stop_after_one(opt, loss, params):  # the run is killed after its first step
        optimise(opt, loss, params)
        raise KeyboardInterrupt

    monkeypatch.setattr(train, "_optimise", stop_after_one)
    with pytest.raises(KeyboardInterrupt):
        train.finetune_lengths(work, target, steps=3, **kwargs)
    monkeypatch.undo()
    assert not (target / train.LENGTHS_MARKER).exists()
    train.finetune_lengths(work, target, steps=3, **kwargs)  # resumes at step 1
    log = [json.loads(line) for line in (work / "train_target_lengths.log").read_text().splitlines()]
    assert [r["step"] for r in log if "lm_loss" in r] == [0, 1, 2]
    assert log[-1]["step"] == 3 and set(log[-1]["eval"]) == {f"{models.FRAMES * 8}_tokens"}
    assert json.loads((target / train.LENGTHS_MARKER).read_text())["steps"] == 3
    after = Qwen2_5_VLForConditionalGeneration.from_pretrained(target, dtype=torch.float32).state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed and not any(k.startswith("model.visual.") for k in changed)  # the vision tower stays frozen


@pytest.fixture(scope="module")
def shipped_at_512_frames() -> dict:
    """The shipped target's captions of 4 held-out scenes at 512 frames (4,096 visual tokens)."""
    tok = AutoTokenizer.from_pretrained(CHECKPOINTS / "target")
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(CHECKPOINTS / "target", dtype=torch.float32).eval()
    return train.evaluate(model, tok, num_scenes=4, seed0=data.HELDOUT_SEED + 4000, num_frames=512, questions=False)


@pytest.mark.slow
def test_shipped_target_captions_long_videos(shipped_at_512_frames):
    """After the length fine-tune the shipped target captions 512-frame videos (F1 0.87 on these 4
    scenes when it shipped); the 8-frame target it started from scored 0.41 at this length on 12
    scenes, falling into repetitions or losing objects."""
    assert shipped_at_512_frames["f1"] >= 0.75, shipped_at_512_frames
    assert shipped_at_512_frames["attribute_accuracy"]["motion"] >= 0.75, shipped_at_512_frames


@pytest.mark.slow
@pytest.mark.xfail(strict=True, reason="issue 19: the bar is 0.9 at every length; the shipped target reaches caption F1 "
                   "0.87 and fact accuracy 0.81 on these scenes (it merges two objects of one colour or motion in "
                   "three-object scenes, docs/DEMO.md); remove once a target that passes ships")
def test_shipped_target_meets_the_long_video_bar(shipped_at_512_frames):
    assert shipped_at_512_frames["f1"] >= 0.9 and shipped_at_512_frames["fact_accuracy"] >= 0.9, shipped_at_512_frames
