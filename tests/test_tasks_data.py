"""synthvid tasks: data generation (deterministic, cached), task functions, and the YAMLs in lmms-eval."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from lvspec_eval.demo import data, models, tasks_data, world
from lvspec_eval.models.video import load_video
from lvspec_eval.tasks import TASKS_DIR


@pytest.fixture
def small(monkeypatch, tmp_path):
    """Two docs per task, generated under tmp_path."""
    monkeypatch.setenv(tasks_data.ENV_DOCS, "2")
    monkeypatch.setenv(tasks_data.ENV_DIR, str(tmp_path / "cache"))
    return tmp_path / "cache"


def load_utils():
    spec = importlib.util.spec_from_file_location("synthvid_utils", TASKS_DIR / "synthvid" / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- generation ------------------------------------------------------------------------------------

def test_same_seeds_give_identical_docs_and_frames(small, tmp_path):
    a = tasks_data.ensure("synthvid_caption", tmp_path / "a")
    b = tasks_data.ensure("synthvid_caption", tmp_path / "b")
    assert (a / "docs.jsonl").read_bytes() == (b / "docs.jsonl").read_bytes()
    for doc_a, doc_b in zip(tasks_data.load_docs("synthvid_caption", tmp_path / "a"),
                            tasks_data.load_docs("synthvid_caption", tmp_path / "b")):
        frames_a = load_video(doc_a["video"], models.FPS, 64).frames
        np.testing.assert_array_equal(frames_a, load_video(doc_b["video"], models.FPS, 64).frames)


def test_docs_hold_video_scene_prompt_and_answer(small):
    docs = tasks_data.load_docs("synthvid_caption")
    assert [d["doc_id"] for d in docs] == [0, 1]
    doc = docs[0]
    scene = world.Scene.from_dict(doc["scene"])
    assert doc["seed"] == scene.seed == data.TEST_SEED
    assert doc["prompt"] == world.CAPTION_PROMPT and doc["answer"] == world.make_caption(scene)
    assert Path(doc["video"]).is_absolute() and Path(doc["video"]).is_file()


def test_colours_survive_the_codec(small):
    doc = tasks_data.load_docs("synthvid_caption")[0]
    decoded = load_video(doc["video"], models.FPS, 64)
    rendered = world.render(world.Scene.from_dict(doc["scene"]), models.FRAMES, models.FRAME_SIZE, models.FRAME_SIZE)
    assert decoded.frames.shape == rendered.shape and decoded.fps == pytest.approx(models.FPS)
    error = np.abs(decoded.frames.astype(int) - rendered)
    assert error.mean() < 2.0 and np.median(error) <= 2  # only shape edges move by more


def test_long_videos_have_the_long_length(small):
    doc = tasks_data.load_docs("synthvid_caption_long")[0]
    assert doc["num_frames"] == models.LONG_FRAMES
    assert load_video(doc["video"], models.FPS, models.LONG_FRAMES).frames.shape[0] == models.LONG_FRAMES


def test_mcq_answers_name_the_right_option(small):
    kinds = []
    for i in range(12):
        doc = tasks_data.make_doc("synthvid_mcq", tasks_data.TASKS["synthvid_mcq"], i)
        scene = world.Scene.from_dict(doc["scene"])
        option = doc["options"][world.LETTERS.index(doc["answer"])]
        if doc["kind"] == "count":
            assert option == world.COUNT_WORDS[len(scene.objects)]
        if doc["kind"] == "background":
            assert option == scene.background
        assert doc["prompt"] == world.format_mcq(doc)
        kinds.append(doc["kind"])
    assert set(kinds) >= {"count", "background", "colour", "shape", "motion"}


def test_task_seeds_do_not_overlap_and_are_held_out():
    seeds = [set(range(s.first_seed, s.first_seed + s.num_docs)) for s in tasks_data.TASKS.values()]
    assert all(min(s) >= data.TEST_SEED for s in seeds)
    assert sum(len(s) for s in seeds) == len(set().union(*seeds))
    assert [s.num_docs for s in tasks_data.TASKS.values()] == [50, 100, 10, 4, 4, 4]


def test_every_task_has_a_yaml_and_a_stub_naming_it():
    for task in tasks_data.TASKS:
        yaml = (TASKS_DIR / "synthvid" / f"{task}.yaml").read_text()
        assert f"\ntask: {task}\n" in yaml and f"test: stub_{task}.jsonl" in yaml
        assert json.loads((TASKS_DIR / "synthvid" / f"stub_{task}.jsonl").read_text()) == {"task": task}


def test_demo_length_stage_covers_the_lengths_and_the_model_sees_every_frame():
    from lvspec_eval.measure import demo_run as run
    from lvspec_eval.models.args import DEMO_MAX_FRAMES, ModelArgs

    frames = [tasks_data.TASKS[t].num_frames for t in run.LENGTH_TASKS]
    assert frames == [32, 128, models.LONG_FRAMES, 512]  # 256 ... 4,096 visual tokens, after the 64 of DEMO_TASKS
    assert max(s.num_frames for s in tasks_data.TASKS.values()) <= DEMO_MAX_FRAMES
    assert ModelArgs.parse({"pretrained": "demo", "device": "cpu"}).max_frames == DEMO_MAX_FRAMES
    assert run.length_methods("") == []
    assert run.length_methods("sd_tree,specvlm") == ["vanilla", "sd_tree", "specvlm"]


def test_stale_or_incomplete_data_is_regenerated(small):
    folder = tasks_data.ensure("synthvid_mcq")
    video = folder / "videos" / "00001.mp4"
    video.unlink()
    tasks_data.ensure("synthvid_mcq")
    assert video.is_file()
    meta = json.loads((folder / "meta.json").read_text())
    (folder / "meta.json").write_text(json.dumps({**meta, "version": -1}))
    tasks_data.ensure("synthvid_mcq")
    assert json.loads((folder / "meta.json").read_text()) == meta


def test_bad_task_or_size():
    with pytest.raises(ValueError, match="unknown synthvid task 'synthvid_qa'"):
        tasks_data.spec_for("synthvid_qa")


def test_bad_size_env(monkeypatch):
    monkeypatch.setenv(tasks_data.ENV_DOCS, "few")
    with pytest.raises(ValueError, match="LVSPEC_SYNTHVID_DOCS='few'"):
        tasks_data.spec_for("synthvid_caption")


# ---- task functions (tasks/synthvid/utils.py) --------------------------------------------------

@pytest.mark.parametrize("response, num_options, letter", [
    ("B", 4, "B"), ("B.", 4, "B"), ("(C) red", 4, "C"), ("The answer is D", 4, "D"), (" a. red", 4, None),
    ("", 4, None), ("E", 4, None), ("E. purple", 6, "E"), ("EB", 6, None),
])
def test_parse_letter(response, num_options, letter):
    assert load_utils().parse_letter(response, num_options) == letter


def test_caption_scoring_and_aggregation():
    utils = load_utils()
    scene = world.make_scene(data.TEST_SEED)
    doc = {"scene": scene.to_dict()}
    perfect = utils.process_caption(doc, [world.make_caption(scene)])
    assert perfect["fidelity_f1"] == perfect["fidelity_precision"] == perfect["fidelity_recall"] == 1.0
    assert perfect["visual_fact_accuracy"]["correct"] == perfect["visual_fact_accuracy"]["stated"] > 0
    empty = utils.process_caption(doc, [""])
    assert empty["fidelity_f1"] == 0.0 and empty["visual_fact_accuracy"] == {"correct": 0, "stated": 0,
                                                                             "facts_right": []}
    n = len(scene.objects)
    assert len(perfect["visual_fact_accuracy"]["facts_right"]) == 2 + 4 * n  # count, background, 4 per object
    pooled = [{"correct": 3, "stated": 4}, {"correct": 0, "stated": 0}, {"correct": 1, "stated": 4}]
    assert utils.visual_fact_accuracy(pooled) == 0.5
    assert utils.visual_fact_accuracy([empty["visual_fact_accuracy"]]) == 0.0


def test_mcq_scoring():
    utils = load_utils()
    doc = {"answer": "C", "options": ["red", "green", "blue", "yellow", "white", "purple"]}
    assert utils.process_mcq(doc, ["C. blue"]) == {"accuracy": 1.0}
    assert utils.process_mcq(doc, ["B"]) == {"accuracy": 0.0}
    assert utils.process_mcq({**doc, "answer": "F"}, ["F"]) == {"accuracy": 1.0}


def test_prompts_are_fixed_and_put_the_video_first():
    utils = load_utils()
    doc = {"video": "/v.mp4", "prompt": "Describe the video in detail."}
    assert utils.doc_to_text(doc) == utils.doc_to_text(doc) == "Describe the video in detail."
    assert utils.doc_to_visual(doc) == ["/v.mp4"]
    assert utils.doc_to_messages(doc) == [{"role": "user", "content": [
        {"type": "video", "url": "/v.mp4"}, {"type": "text", "text": "Describe the video in detail."}]}]


# ---- the YAMLs, loaded by lmms-eval ------------------------------------------------------------------

@pytest.mark.parametrize("task_type", ["chat", "simple"])
def test_yamls_load_offline_in_lmms_eval(small, monkeypatch, task_type):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    from lmms_eval.tasks import TaskManager, get_task_dict

    manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False)
    names = ["synthvid_caption", "synthvid_mcq", "synthvid_caption_long"]
    tasks = get_task_dict(names, manager, task_type)
    for name in names:
        task = tasks[name]
        docs = task.test_docs()
        assert len(docs) == 2 and docs[0]["task"] == name and Path(docs[0]["video"]).is_file()
        assert task.config.generation_kwargs["temperature"] == 0
    caption, mcq = tasks["synthvid_caption"], tasks["synthvid_mcq"]
    assert caption.config.generation_kwargs["max_new_tokens"] == 64
    assert mcq.config.generation_kwargs["max_new_tokens"] == 4
    assert caption.config.metric_list[0]["metric"] == "fidelity_f1"
