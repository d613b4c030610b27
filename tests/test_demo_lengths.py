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


def test_pruned_distillation_keeps_what_the_engine_keeps():
    """The draft's pruned distillation steps (`pruned_keep`) show it the video tokens SpecVLM's
    pruning keeps at inference: the same indices as the engine's prefill + select_visual_tokens on
    the same video and prompt."""
    from lvspec_eval.backends.loading import load_backend
    from lvspec_eval.decoding.pruning import PruneConfig, select_visual_tokens

    frames_n, seed = 32, data.HELDOUT_SEED + 77
    backend = load_backend(str(CHECKPOINTS / "target"), device="cpu", dtype="float32")
    model, tok = backend.model, backend.tokenizer
    sample = data.make_sample(tok, model.config.video_token_id, seed, num_frames=frames_n,
                              mix=data.TaskMix(caption=1.0))
    batch = data.collate([sample], tok.pad_token_id)
    embeds, pos, _ = train._embed_inputs(model, batch)
    kept = train.pruned_keep(model, embeds, pos, batch["input_ids"][0], sample.num_prompt, model.config.video_token_id)
    video = batch["input_ids"][0] == model.config.video_token_id
    ours = (kept & video)[video].nonzero().flatten()
    n = int(video.sum())
    assert ours.numel() == max(1, int(n * 0.1)) and bool(kept[~video].all())

    frames = data.world.render(sample.scene, frames_n, models.FRAME_SIZE, models.FRAME_SIZE)
    inputs = backend.prepare(data.world.CAPTION_PROMPT, [(frames, models.FPS)])
    assert inputs.input_ids[0].tolist() == batch["input_ids"][0, :sample.num_prompt].tolist()
    state, _ = backend.prefill(inputs, visual_attention=True)
    engine = select_visual_tokens(state.extra["visual_attention"], PruneConfig())
    assert ours.tolist() == engine.tolist()


def test_draft_distillation_with_pruned_long_steps(tmp_path):
    """Two re-distillation steps at 512 frames, the draft seeing the pruned video: it trains (its
    weights move), logs the pruned steps, and writes a draft that loads."""
    out = tmp_path / "out"
    (out / "tokenizer").mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(CHECKPOINTS / "draft" / name, out / "tokenizer" / name)
    work = tmp_path / "work"
    work.mkdir()
    train.train_draft(work, out, CHECKPOINTS / "target", steps=2, batch_size=2, long_share=1.0, pruned_share=1.0,
                      token_budget=512, init=CHECKPOINTS / "draft", eval_every=100)
    log = [json.loads(line) for line in (work / "train_draft.log").read_text().splitlines()]
    assert log[0]["pruned"] is True and log[0]["frames"] > models.FRAMES
    before = Qwen2_5_VLForConditionalGeneration.from_pretrained(CHECKPOINTS / "draft", dtype=torch.float32).state_dict()
    after = Qwen2_5_VLForConditionalGeneration.from_pretrained(out / "draft", dtype=torch.float32).state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before if "visual" not in k)
