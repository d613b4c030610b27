"""The demo target at every length of the speedup curve, and the length fine-tune that makes it so
(lvspec_eval/training/demo.py: `finetune_lengths`, `_length_step`; `lvspec-eval build-demo`)."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from lvspec_eval.backends.loading import DEMO_DIR as CHECKPOINTS
from lvspec_eval.demo import data, models, world
from lvspec_eval.training import demo as train


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


def test_appeared_counts_follow_the_rendered_frames():
    """The count probe's labels: objects drawn by each temporal patch's last frame (each object
    rendered alone, so none hides another; one that wraps around the frame edge counts on)."""
    for seed in range(data.HELDOUT_SEED, data.HELDOUT_SEED + 20):
        scene = world.make_scene(seed)
        for frames in (8, 32, 128):
            drawn = np.zeros(frames, dtype=int)
            for obj in scene.objects:
                alone = world.render(world.Scene(seed, scene.background, (obj,)), frames, 56, 56)
                seen = (alone != np.array(world.BACKGROUNDS[scene.background], dtype=np.uint8)).any(axis=(1, 2, 3))
                drawn += np.maximum.accumulate(seen)
            last = [min(2 * t + 1, frames - 1) for t in range((frames + 1) // 2)]
            assert train.appeared_counts(scene, frames).tolist() == drawn[last].tolist(), (seed, frames)


@pytest.mark.parametrize("weight", ["appearance_probe_weight", "slot_attention_weight", "order_probe_weight"])
def test_pointer_stage_trains_under_its_own_name(tmp_path, weight):
    """The second length stage (`name=POINTER_STAGE`) with the running-count probe, the pointer
    heads' supervision or the object tokens' order probe: its own log, checkpoint and marker beside
    the first stage's, and the signal's gradient reaches the language model (one step with it moves
    the weights elsewhere than the same step without)."""
    # one step of two 16-frame videos (long steps are mostly captions: the pointer heads need one)
    kwargs = dict(batch_size=2, trained_share=0.0, token_budget=256, eval_every=100, length_eval={models.FRAMES: 1},
                  name=train.POINTER_STAGE)
    weights = {}
    for on in (False, True):
        target, work = tmp_path / f"target_{on}", tmp_path / f"work_{on}"
        shutil.copytree(CHECKPOINTS / "target", target)
        (target / train.length_marker(train.POINTER_STAGE)).unlink()  # the shipped target's record of this stage
        work.mkdir()
        torch.manual_seed(0)
        train.finetune_lengths(work, target, steps=1, **{weight: 0.5 * on}, **kwargs)
        record = json.loads((target / train.length_marker(train.POINTER_STAGE)).read_text())
        assert record["steps"] == 1 and record[weight] == 0.5 * on
        assert (target / train.LENGTHS_MARKER).exists()  # the first stage's record is kept
        log = [json.loads(line) for line in (work / f"train_target_{train.POINTER_STAGE}.log").read_text().splitlines()]
        state = torch.load(work / f"target_{train.POINTER_STAGE}.ckpt", weights_only=False)
        key = weight.removesuffix("_weight")
        assert (f"{key}_loss" in log[0]) == on and log[0].get(f"{key}_loss", 1.0) > 0
        for probe in ("appearance_probe", "order_probe"):  # the pointer heads add no module
            assert (probe in state) == (on and key == probe)
        weights[on] = Qwen2_5_VLForConditionalGeneration.from_pretrained(target, dtype=torch.float32).state_dict()
    assert any(not torch.equal(weights[False][k], weights[True][k]) for k in weights[False] if ".layers.2." in k)


def test_the_shipped_target_went_through_every_length_stage():
    """Its records: the first stage, then the later stages with build-demo's recipes."""
    assert json.loads((CHECKPOINTS / "target" / train.LENGTHS_MARKER).read_text())["steps"] > 0
    for recipe in train.LATER_LENGTH_STAGES:
        record = json.loads((CHECKPOINTS / "target" / train.length_marker(recipe["name"])).read_text())
        assert {k: record[k] for k in recipe} == recipe


@pytest.fixture(scope="module")
def shipped_captions():
    """The shipped target's captions of held-out scenes: (frames, scenes, first seed) -> `train.evaluate`."""
    tok = AutoTokenizer.from_pretrained(CHECKPOINTS / "target")
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(CHECKPOINTS / "target", dtype=torch.float32).eval()
    return lambda frames, scenes, seed0: train.evaluate(model, tok, num_scenes=scenes, seed0=seed0, num_frames=frames,
                                                        questions=False)


@pytest.mark.slow
def test_shipped_target_captions_long_videos(shipped_captions):
    """After the length stages the shipped target captions 512-frame videos (4,096 visual tokens;
    F1 0.94 and fact accuracy 1.00 on these 4 scenes when it shipped, F1 0.84 after the pointer
    stage, 0.87 after the first stage alone); the 8-frame target it started from scored 0.41 at
    this length on 12 scenes, falling into repetitions or losing objects."""
    got = shipped_captions(512, 4, data.HELDOUT_SEED + 4000)
    assert got["f1"] >= 0.85 and got["fact_accuracy"] >= 0.85, got


@pytest.mark.slow
def test_shipped_target_meets_the_long_video_bar(shipped_captions):
    """Issue 19's bar at 1,024 visual tokens, the hardest length, on the 12 documented scenes of
    scripts/eval_demo_lengths.py: F1 0.95 and fact accuracy 0.91 when the target shipped (0.91 and
    0.84 before its fifth length stage). The 0.85 here leaves room for a few greedy tokens that
    another CPU may round the other way; the script's figures are the measurement."""
    got = shipped_captions(128, 12, data.HELDOUT_SEED + 3000)
    assert got["f1"] >= 0.85 and got["fact_accuracy"] >= 0.85, got


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
    engine = select_visual_tokens(backend.visual_attention(state), PruneConfig())
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


def test_slot_attention_supervises_the_models_own_attention():
    """`SlotAttention`'s loss is -log of the attention mass the supervised heads pay to the named
    object's visual tokens, as the model's eager attention weights give it; a question has no slot;
    the model's attention kernel is restored after the forward."""
    tok = AutoTokenizer.from_pretrained(CHECKPOINTS / "target")
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(CHECKPOINTS / "target", dtype=torch.float32)
    vid, frames = model.config.video_token_id, 16
    seeds = [s for s in range(data.HELDOUT_SEED, data.HELDOUT_SEED + 100) if len(world.make_scene(s).objects) == 3][:2]
    samples = [data.make_sample(tok, vid, s, num_frames=frames, mix=data.TaskMix(caption=1.0)) for s in seeds]
    samples.append(data.make_sample(tok, vid, seeds[0] + 1, num_frames=frames, mix=data.TaskMix(caption=0.0)))
    colour_ids = train.word_ids(tok)[1]
    slot = train.SlotAttention(colour_ids, tok(".").input_ids[0])
    kernel = model.config.get_text_config()._attn_implementation
    got = train.length_losses(model, train.VisualProbes(256, 4), samples, frames, slot_attention=slot)["slot_attention"]
    assert model.config.get_text_config()._attn_implementation == kernel
    model.config.get_text_config()._attn_implementation = "eager"
    batch = data.collate(samples, model.config.pad_token_id)
    embeds, pos, _ = train._embed_inputs(model, batch)
    with torch.no_grad():
        att = model(inputs_embeds=embeds, position_ids=pos, attention_mask=batch["attention_mask"],
                    output_attentions=True).attentions
    expected = []
    for b, s in enumerate(samples):
        rows, targets = slot.targets(s, train.coverage_owners(s.scene, frames, models.FRAME_SIZE), vid)
        if s.question is not None:
            assert len(rows) == 0
            continue
        # the three objects' sentences, each from the position predicting its size word
        assert targets.any(1).all() and len({tuple(t.nonzero().squeeze(1).tolist()) for t in targets}) == 3
        for layer, head in slot.heads:
            expected.append(-(att[layer][b, head, rows, : targets.shape[1]] * targets).sum(-1).log())
    assert torch.allclose(got, torch.cat(expected).mean(), rtol=1e-4)


def test_build_demo_runs_the_length_stages_in_order(tmp_path, monkeypatch):
    """`build-demo` on a trained 8-frame target: the first length stage, the target stored as
    shipped, then each later stage with its recipe from the last as stored; a rerun skips them all."""
    from lvspec_eval.training import build_demo as build

    out = tmp_path / "out"
    for folder in ("target", "draft", "draft_restyled"):  # the drafts' stages are skipped
        (out / folder).mkdir(parents=True)
        (out / folder / "config.json").write_text("{}")
    calls = []

    def finetune(work, target_dir, steps, **kwargs):
        calls.append((steps, kwargs))
        (target_dir / train.length_marker(kwargs.get("name", "lengths"))).write_text("{}")

    monkeypatch.setattr(train, "finetune_lengths", finetune)
    monkeypatch.setattr(build, "store_bfloat16", lambda folder: calls.append(("stored", folder.name)))
    threads = torch.get_num_threads()
    try:
        for _ in range(2):
            build.build(tmp_path / "work", out, 0, 0, 0, threads, length_steps=600, pointer_steps=300)
    finally:
        torch.set_num_threads(threads)
    stored = [("stored", "target"), ("stored", "draft"), ("stored", "draft_restyled")]
    stages = [(300, recipe) for recipe in train.LATER_LENGTH_STAGES]
    assert calls == ([(600, {}), ("stored", "target")] + [c for stage in stages for c in (stage, ("stored", "target"))]
                     + stored + stored)
