"""Sparrow for any target: `lvspec-eval train-sparrow --target <folder> --videos <dir>` (issue 17).

End to end on the CPU: a tiny random Qwen2.5-VL target saved as a checkpoint folder, three real
video files written with PyAV (different sizes, lengths and rates), a broken file and a file that
is not a video, under the video rule a real checkpoint gets by default (`lmms_eval`). The command generates the target's own answers (self-distillation), trains a head
for a few steps, and the head then drives `method=sparrow` through the Runner token-identically to
vanilla. A run interrupted after k steps resumes from its saved state without regenerating the
answers and ends where an uninterrupted run ends, bit for bit.
"""
from __future__ import annotations

import json
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
import pytest
import torch

from lvspec_eval import cli
from lvspec_eval.backends.loading import load_backend
from lvspec_eval.training import sparrow as sparrow_train
from lvspec_eval.decoding.drafters.sparrow import HEAD_WEIGHTS, SparrowHead
from lvspec_eval.models.video import load_video
from lvspec_eval.decoding.runner import Runner

# (name, frames, fps, height, width): lengths 2.5 s, 3 s and 1.2 s.
VIDEOS = (("street/a.mp4", 10, 4.0, 48, 64), ("b.mp4", 6, 2.0, 56, 80), ("c.MOV", 7, 6.0, 48, 48))
STEPS, KILL_AT = 8, 5
MAX_NEW = 12


def write_mp4(path: Path, num_frames: int, fps: float, height: int, width: int, seed: int) -> None:
    """A coloured square moving across a coloured background, H.264 in an mp4 container."""
    rng = np.random.default_rng(seed)
    background, square = rng.integers(0, 256, size=(2, 3), dtype=np.uint8)
    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=Fraction(fps).limit_denominator(1000))
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        for i in range(num_frames):
            frame = np.empty((height, width, 3), np.uint8)
            frame[:] = background
            x = i * (width - 16) // max(1, num_frames - 1)
            frame[height // 4: height // 4 + 16, x: x + 16] = square
            av_frame = av.VideoFrame.from_ndarray(frame, format="rgb24")
            av_frame.pts = i
            container.mux(stream.encode(av_frame))
        container.mux(stream.encode(None))


@pytest.fixture(scope="module")
def video_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("videos")
    for seed, (name, frames, fps, height, width) in enumerate(VIDEOS):
        write_mp4(root / name, frames, fps, height, width, seed)
    (root / "broken.mp4").write_bytes(b"not a video at all" * 10)
    (root / "notes.txt").write_text("not a video")
    return root


def _train(target: str, videos: Path, out: Path, *extra: str) -> int:
    return cli.main(["train-sparrow", "--target", target, "--videos", str(videos), "--out", str(out),
                     "--device", "cpu", "--frames", "4", "--prompts-per-video", "3", "--max-new-tokens", str(MAX_NEW),
                     "--steps", str(STEPS), "--batch-size", "4", "--warmup", "2", "--lr", "3e-3", "--ckpt-every", "3",
                     "--log-every", "1", "--gen-batch", "4", *extra])


def _log(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "train" / "train_sparrow.log").read_text().splitlines()]


def _answers(out: Path) -> list[dict]:
    (path,) = (out / "train").glob("answers_*.jsonl")
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def lmms_rule_target(qwen_family):
    """The tiny target as `--model lvspec` loads a real checkpoint: video_rule=lmms_eval."""
    return load_backend(str(qwen_family.target.model.name_or_path), video_rule="lmms_eval")


def _video(backend, path: Path):
    return load_video(path, plan=backend.frame_plan(None, 4))  # the rule's frames, max_frames=4 as trained


@pytest.fixture(scope="module")
def trained(qwen_family, video_dir, tmp_path_factory) -> Path:
    """One uninterrupted run of the command; returns the head's folder."""
    out = tmp_path_factory.mktemp("heads") / "qwen_tiny"
    assert _train(str(qwen_family.target.model.name_or_path), video_dir, out) == 0
    return out


def test_trains_on_the_targets_own_answers(trained, lmms_rule_target, video_dir):
    records = _answers(trained)
    good = [r for r in records if "answer" in r]
    assert sorted({r["video"] for r in good}) == sorted(name for name, *_ in VIDEOS)
    assert len(good) == 3 * len(VIDEOS)  # 3 prompts per readable video
    bad = [r for r in records if "error" in r]  # broken.mp4, once per prompt: skipped, with its reason
    assert len(bad) == 3 and all(r["video"] == "broken.mp4" and "broken.mp4" in r["error"] for r in bad)
    assert not any("notes" in r["key"] for r in records)
    # Self-distillation: each answer is the target's greedy output (the loop's vanilla tokens + EOS).
    target = lmms_rule_target
    runner = Runner(str(target.model.name_or_path), video_rule="lmms_eval", target_backend=target)
    eos = sparrow_train.end_token(target)
    for r in good[::3]:
        video = _video(target, video_dir / r["video"])
        assert len(video.frames) == 4  # lmms_eval's Qwen2.5-VL rule: min(max_frames, N), even
        tokens = runner.generate(r["prompt"], [video], MAX_NEW).tokens
        assert r["answer"] == tokens + ([eos] if len(tokens) < MAX_NEW else []), r["key"]
    log = _log(trained)
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == STEPS and np.mean(losses[-3:]) < np.mean(losses[:3])
    head = SparrowHead.load(trained, target)
    assert head.meta["steps_done"] == STEPS
    assert (head.meta["video_rule"], head.meta["max_frames"], head.meta["fps"]) == ("lmms_eval", 4, None)


def test_trained_head_drives_sparrow_token_identically_to_vanilla(trained, lmms_rule_target, video_dir):
    target = str(lmms_rule_target.model.name_or_path)
    vanilla = Runner(target, method="vanilla", video_rule="lmms_eval", target_backend=lmms_rule_target)
    # eager: the head is prepared and drafts on every request (lazily, the policy may decode alone)
    sparrow = Runner(target, method="sparrow", options={"sparrow_head": str(trained), "draft_prepare": "eager"},
                     video_rule="lmms_eval", target_backend=lmms_rule_target)
    prompts = (sparrow_train.VIDEO_PROMPTS[0], "which object appears first")  # seen in training, and not
    for name, *_ in VIDEOS:
        video = _video(lmms_rule_target, video_dir / name)
        for prompt in prompts:
            ref = vanilla.generate(prompt, [video], 24)
            out = sparrow.generate(prompt, [video], 24)
            assert out.stats["method"] == "sparrow" and out.stats["kept_visual_tokens"] == 0
            assert out.stats["draft_prepared_at"] == 0
            assert out.tokens == ref.tokens, (name, prompt)


def test_interrupted_run_resumes_without_regenerating(trained, qwen_family, video_dir, tmp_path, monkeypatch,
                                                     capsys):
    target = str(qwen_family.target.model.name_or_path)
    out = tmp_path / "head"
    step = sparrow_train.train_step

    def killed_at(head, backend, store, opt, k, args):
        if k == KILL_AT:
            raise KeyboardInterrupt
        return step(head, backend, store, opt, k, args)

    monkeypatch.setattr(sparrow_train, "train_step", killed_at)
    with pytest.raises(KeyboardInterrupt):
        _train(target, video_dir, out)
    assert not (out / HEAD_WEIGHTS).exists()
    assert torch.load(out / "train" / "sparrow.ckpt", weights_only=False)["step"] == KILL_AT
    monkeypatch.setattr(sparrow_train, "train_step", step)

    def no_generation(*args, **kwargs):
        raise AssertionError("the answers are cached: a resumed run must not generate them again")

    monkeypatch.setattr(sparrow_train, "generate_stacked", no_generation)
    monkeypatch.setattr(sparrow_train, "greedy_one", no_generation)
    assert _train(target, video_dir, out) == 0  # the same command again: resumes by itself
    starts = [r["step"] for r in _log(out) if r.get("event") == "start"]
    assert starts == [0, KILL_AT]
    assert [r["step"] for r in _log(out) if "loss" in r] == list(range(STEPS))
    resumed, whole = SparrowHead.load(out), SparrowHead.load(trained)
    assert resumed.meta["steps_done"] == whole.meta["steps_done"] == STEPS
    for key, value in whole.state_dict().items():
        assert torch.equal(resumed.state_dict()[key], value), key
    # A state made with other settings is refused, naming them; --restart starts over.
    assert cli.main(["train-sparrow", "--target", target, "--videos", str(video_dir), "--out", str(out),
                     "--device", "cpu", "--frames", "4", "--prompts-per-video", "3", "--max-new-tokens", str(MAX_NEW),
                     "--steps", str(STEPS), "--batch-size", "4", "--mtp-steps", "1"]) == 2
    assert "made with mtp_steps=2 (now 1); pass --restart" in capsys.readouterr().err


def test_batched_answers_on_videos_of_different_shapes_match_the_loop(family, video_dir, tmp_path):
    """LLaVA-OV's videos only stack at equal frame counts (under rule fps they differ here): batches
    are split by shape, not refused."""
    args = _args(video_dir, tmp_path, "--video-rule", "fps")
    sparrow_train.attach_frame_plan(args, family.target)  # the fixture's targets are loaded with rule fps
    tasks = sparrow_train.task_list(args)
    assert [t["video"] for t in tasks] == sorted([name for name, *_ in VIDEOS] + ["broken.mp4"])
    readable = [t for t in tasks if sparrow_train.unreadable(t, args) is None]
    assert len(readable) == len(VIDEOS)
    prepared = [family.target.prepare(t["prompt"], [sparrow_train.video_for(t, args)]) for t in readable]
    groups = sparrow_train.stackable_groups(prepared)
    assert sorted(i for g in groups for i in g) == list(range(len(readable)))
    batched = sparrow_train.greedy_batch(family.target, readable, args)
    assert batched == [sparrow_train.greedy_one(family.target, t, args) for t in readable]


def _args(video_dir: Path, tmp_path: Path, *extra: str):
    parser = cli.build_parser()
    args = parser.parse_args(["train-sparrow", "--target", "unused", "--videos", str(video_dir), "--out",
                              str(tmp_path / "head"), "--frames", "4", "--prompts-per-video", "1",
                              "--max-new-tokens", "8", *extra])
    sparrow_train.resolve_args(args)
    return args


def test_bad_arguments_are_refused_by_name(video_dir, tmp_path):
    with pytest.raises(ValueError, match="--out is required"):
        sparrow_train.resolve_args(cli.build_parser().parse_args(["train-sparrow", "--videos", str(video_dir)]))
    with pytest.raises(ValueError, match="--prompts-per-video"):
        _args(video_dir, tmp_path, "--prompts-per-video", "99")
    with pytest.raises(ValueError, match="holds no video file"):
        sparrow_train.task_list(_args(tmp_path, tmp_path))
    with pytest.raises(ValueError, match="--resume and --restart"):
        _args(video_dir, tmp_path, "--resume", "--restart")
    args = _args(video_dir, tmp_path)  # a real checkpoint: `--model lvspec`'s defaults for it
    assert (args.work, args.video_rule, args.fps, args.frames) == (str(tmp_path / "head" / "train"), "lmms_eval",
                                                                   None, 4)
    demo = cli.build_parser().parse_args(["train-sparrow", "--videos", str(video_dir), "--out", str(tmp_path)])
    sparrow_train.resolve_args(demo)
    assert (demo.video_rule, demo.fps, demo.frames, demo.max_new_tokens) == ("fps", 2.0, 32, 256)
