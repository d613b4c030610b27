"""The real-benchmark tasks (lvspec_eval/tasks/<bench>/, tasks/_common/) on tiny fixtures of each real schema.

Fast tests call the task functions the way lmms-eval does (utils.py loaded by path); the slow
test runs every task end to end through the lmms-eval CLI with a tiny random Qwen2.5-VL, offline.
"""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
from pathlib import Path

import pytest

from lvspec_eval.tasks import TASKS_DIR
from lvspec_eval.tasks._common import benchmarks, judge, metrics
from lvspec_eval.tasks._common.schema import SOURCE_FILE, SOURCE_ROW

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "benchmarks"

JUDGE_VARS = judge.ENDPOINT_VARS + (judge.JUDGE_SWITCH,)
BENCH_DIRS = {"videomme": "videomme", "vdc": "vdc", "vdd": "vdd", "moviechat": "moviechat", "mvbench": "mvbench",
              "mlvu": "mlvu", "longvideobench": "longvideobench"}


@pytest.fixture
def roots(monkeypatch):
    """Every benchmark's root at its fixture; no judge configured."""
    for name, bench in benchmarks.BENCHMARKS.items():
        monkeypatch.setenv(bench.env_var, str(FIXTURES / name))
    for var in JUDGE_VARS:
        monkeypatch.delenv(var, raising=False)
    judge._state.clear()


def load_utils(bench_dir: str):
    """A task's utils.py loaded by file path, as lmms-eval's `!function` loads it."""
    spec = importlib.util.spec_from_file_location(f"utils_{bench_dir}", TASKS_DIR / bench_dir / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rows(name: str) -> list[dict]:
    return benchmarks.load_rows(benchmarks.get(name))


# ---- data roots and annotations -------------------------------------------------------------------

EXPECTED_KEYS = {
    "videomme": {"videoID", "question", "options", "answer", "duration", "domain", "sub_category", "task_type"},
    "vdc": {"video_name", "caption", "qa_list"},
    "vdd": {"video_name", "question", "answer"},
    "moviechat": {"video_name", "question", "answer", "time"},
    "mvbench": {"video", "question", "candidates", "answer", "sub_task"},
    "mlvu": {"video_name", "question", "answer", "task_type"},
    "longvideobench": {"video_path", "question", "option0", "correct_choice", "id", "duration_group"},
}


@pytest.mark.parametrize("name", list(EXPECTED_KEYS))
def test_fixture_rows_have_the_real_schema_and_their_videos(roots, name):
    found = rows(name)
    assert len(found) == 2 and all(EXPECTED_KEYS[name] <= set(r) for r in found)
    present = [os.path.isfile(benchmarks.video_path(benchmarks.get(name), r)) for r in found]
    assert present == ([True, False] if name == "mlvu" else [True, True])  # MLVU's 2nd video is missing on purpose


def test_missing_video_returns_the_expected_path_instead_of_exiting(roots):
    bench = benchmarks.get("mlvu")
    assert benchmarks.video_path(bench, rows("mlvu")[1]) == str(FIXTURES / "mlvu" / "mlvu_missing.mp4")


def test_mvbench_rows_find_their_sub_task_folder(roots):
    paths = [benchmarks.video_path(benchmarks.get("mvbench"), r) for r in rows("mvbench")]
    assert [r["sub_task"] for r in rows("mvbench")] == ["action_antonym", "object_existence"]
    assert paths[1].endswith("clevrer/video_validation/object_existence_fixture.mp4")


def test_without_the_variable_the_hf_home_layout_is_used(monkeypatch, tmp_path):
    bench = benchmarks.get("videomme")
    monkeypatch.delenv(bench.env_var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    assert benchmarks.data_root(bench) == (tmp_path / "videomme", False)
    doc = {"videoID": "abc"}
    assert benchmarks.video_path(bench, doc) == str(tmp_path / "videomme" / "data" / "abc.mp4")
    (tmp_path / "videomme" / "data").mkdir(parents=True)
    (tmp_path / "videomme" / "data" / "abc.mkv").write_bytes(b"x")  # the built-in tasks' other suffixes
    assert benchmarks.video_path(bench, doc).endswith("abc.mkv")


def test_a_root_without_annotations_names_what_it_looked_for(monkeypatch, tmp_path):
    monkeypatch.setenv("LVSPEC_VDD_ROOT", str(tmp_path))
    with pytest.raises(ValueError, match=r"(?s)LVSPEC_VDD_ROOT=.*no annotations for vdd; accepted layouts:.*test\.jsonl"):
        rows("vdd")
    monkeypatch.setenv("LVSPEC_VDD_ROOT", str(tmp_path / "nope"))
    with pytest.raises(ValueError, match="is not a folder"):
        rows("vdd")


def test_parquet_and_json_annotations_load(monkeypatch, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    source = without_provenance(rows_at(monkeypatch, "vdd", FIXTURES / "vdd"))
    pq.write_table(pa.Table.from_pylist(source), tmp_path / "test.parquet")
    assert without_provenance(rows_at(monkeypatch, "vdd", tmp_path)) == source
    assert rows_at(monkeypatch, "vdd", tmp_path)[1][SOURCE_ROW] == 1  # each doc says where it came from
    (tmp_path / "test.parquet").unlink()
    (tmp_path / "test.json").write_text(json.dumps({"data": source}))
    assert without_provenance(rows_at(monkeypatch, "vdd", tmp_path)) == source
    assert rows_at(monkeypatch, "vdd", tmp_path)[0][SOURCE_FILE] == str(tmp_path / "test.json")


def without_provenance(found: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in (SOURCE_FILE, SOURCE_ROW)} for r in found]


def rows_at(monkeypatch, name: str, root: Path) -> list[dict]:
    monkeypatch.setenv(benchmarks.get(name).env_var, str(root))
    return rows(name)


def test_process_docs_replaces_the_placeholder(roots):
    import datasets

    placeholder = datasets.Dataset.from_list([{"placeholder": 0}])
    docs = benchmarks.process_docs("longvideobench", placeholder, benchmarks.TASK_FIELDS["lvspec_longvideobench"])
    assert len(docs) == 2 and docs[0]["video_path"] == "lvb_fixture01.mp4"


def test_task_registry_covers_every_task_yaml():
    import yaml

    names = set()
    for path in TASKS_DIR.glob("*/*.yaml"):
        if path.parent.name in BENCH_DIRS.values():
            config = yaml.safe_load("\n".join(l for l in path.read_text().splitlines() if "!function" not in l))
            names.add(config["group"] if "group" in config else config["task"])
    assert names == set(benchmarks.TASKS) | set(benchmarks.GROUPS)


def test_task_names_do_not_collide_with_builtin_tasks():
    """lmms-eval's built-in tasks win over our same-named tasks (test_plugin checks it): ours must differ."""
    import lmms_eval

    builtin = Path(lmms_eval.__file__).parent / "tasks"
    taken = set()
    for path in builtin.rglob("*.yaml"):
        for line in path.read_text(errors="replace").splitlines():
            if line.startswith(("task:", "group:")):
                taken.add(line.split(":", 1)[1].strip().strip("\"'"))
    assert not (set(benchmarks.TASKS) | set(benchmarks.GROUPS)) & taken


def test_yaml_configs_resolve_their_functions_and_placeholder():
    from lmms_eval.utils import load_yaml_config

    config = load_yaml_config(str(TASKS_DIR / "vdc" / "vdc_camera.yaml"), mode="full")
    assert callable(config["doc_to_text"]) and callable(config["process_results"])
    assert Path(config["dataset_kwargs"]["data_files"]["test"]).resolve() == TASKS_DIR / "_common" / "placeholder.jsonl"
    assert config["lmms_eval_specific_kwargs"]["default"]["dimension"] == "camera"


# ---- prompts: fixed, the built-in tasks' wording ------------------------------------------------

def test_vdc_asks_the_canonical_instruction_every_time(roots):
    from lvspec_eval.tasks._common.builtin import builtin_constant

    utils, doc = load_utils("vdc"), rows("vdc")[0]
    for dim, attr in utils.PROMPT_LISTS.items():
        kwargs = {"dimension": dim, "prompt_index": 0}
        texts = {utils.doc_to_text(doc, kwargs) for _ in range(5)}
        assert texts == {builtin_constant("vdc", attr)[0]}
    with pytest.raises(ValueError, match="VDC dimension 'sound'; expected one of detailed"):
        utils.instruction("sound")


def test_videomme_prompt_is_lmms_evals(roots):
    utils, doc = load_utils("videomme"), rows("videomme")[0]
    post = "\nAnswer with the option's letter from the given choices directly."
    text = utils.doc_to_text(doc, {"pre_prompt": "", "post_prompt": post})
    assert text.startswith("Select the best answer") and doc["question"] in text and text.endswith(post)
    assert "A. one" in text


def test_moviechat_breakpoint_names_the_moment(roots):
    utils, doc = load_utils("moviechat"), rows("moviechat")[1]  # time = frame 3 of a 2 fps clip
    assert utils.moment(doc) == "0:01"
    assert "At 0:01 of the video: What colour" in utils.doc_to_text_breakpoint(doc, {})
    assert utils.moment({**doc, "video_name": "gone.mp4"}) == "frame 3"


def test_longvideobench_prompt_lists_real_options_only(roots):
    utils, doc = load_utils("longvideobench"), rows("longvideobench")[0]
    text = utils.doc_to_text(doc, {"pre_prompt": "", "post_prompt": "Answer with the letter.\n"})
    assert "A. black\nB. gray\nC. brown\nAnswer with the letter.\n" in text and "N/A" not in text


# ---- scoring ----------------------------------------------------------------------------------------

def test_multiple_choice_scores_are_numeric_per_sample(roots):
    cases = {"videomme": ("videomme_perception_score", "A"), "mvbench": ("mvbench_accuracy", "(B) gray"),
             "mlvu": ("mlvu_percetion_score", "B"), "longvideobench": ("lvb_acc", "B.")}
    for name, (metric, reply) in cases.items():
        utils, doc = load_utils(BENCH_DIRS[name]), rows(name)[0]
        value = utils.process_results(doc, [reply])[metric]
        assert value["score"] in (0, 1, 0.0, 1.0), name
        assert utils.process_results(doc, [""])[metric]["score"] == 0, name  # a failed sample is wrong
        assert isinstance(utils.aggregate([value]), (int, float)), name


def test_longvideobench_parsing_is_deterministic(roots):
    utils, doc = load_utils("longvideobench"), rows("longvideobench")[0]
    scores = {utils.process_results(doc, ["I cannot tell."])["lvb_acc"]["parsed_pred"] for _ in range(20)}
    assert scores == {""}


def test_judged_scores_are_missing_without_a_judge(roots):
    vdc, doc = load_utils("vdc"), rows("vdc")[0]
    out = vdc.process_results(doc, ["A red square moves left."])
    for metric in ("vdc_score", "vdc_acc"):
        assert "score" not in out[metric] and out[metric]["judge_score"] is None
        assert "no judge configured" in out[metric]["judge_error"]
    assert out["qa_list"] == doc["qa_list"]  # logged for `lvspec-eval judge --mode vdc`
    assert vdc.aggregate([out["vdc_score"]]) is None
    mc = load_utils("moviechat").process_results(rows("moviechat")[0], ["gray"])
    assert mc["qa_acc"]["judge_score"] is None


def test_judge_switch_off(roots, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://judge.test/v1")
    assert judge.unavailable_reason() is None
    monkeypatch.setenv(judge.JUDGE_SWITCH, "off")
    assert "judging is off" in judge.unavailable_reason()


class StubClient:
    """Stands in for judges.client.JudgeClient: answers every judge() with a fixed value."""

    def __init__(self, value):
        self.value = value

    def judge(self, request):
        from judges.client import Judgment

        return Judgment(self.value, "{}", None if self.value else "unparsable", 1, False)


def test_judged_caption_scores_flow_into_the_metrics(roots, monkeypatch):
    import judges.client

    monkeypatch.setenv("OPENAI_BASE_URL", "http://judge.test/v1")
    seen = []

    def fake_score(client, items, mode):
        seen.append((mode, items[0]))
        return [{"key": items[0].key, "mode": mode, "score": 3.5, "acc": 0.5, "parts": {}, "errors": []}]

    monkeypatch.setattr(judges.client, "score_captions", fake_score)
    monkeypatch.setitem(judge._state, "client", StubClient(None))
    doc = rows("vdc")[0]
    out = load_utils("vdc").process_results(doc, ["caption"])
    assert out["vdc_score"]["score"] == 3.5 and out["vdc_acc"]["score"] == 0.5
    assert seen[0][0] == "vdc" and seen[0][1].qa == tuple((q["question"], q["answer"]) for q in doc["qa_list"])
    vdd = load_utils("vdd").process_results(rows("vdd")[0], ["caption"])
    assert seen[1][0] == "detail" and vdd["detail_score"]["score"] == 3.5
    # the _facts variants: the same caption and reference, judged in mode facts
    vdd_facts = load_utils("vdd").process_results_facts(rows("vdd")[0], ["caption"])
    vdc_facts = load_utils("vdc").process_results_facts(doc, ["caption"])
    assert [m for m, _ in seen[2:]] == ["facts", "facts"] and seen[3][1].reference == doc["caption"]
    assert vdd_facts["facts_score"]["score"] == vdc_facts["facts_score"]["score"] == 3.5


def test_moviechat_answers_are_judged_yes_no(roots, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", "http://judge.test/v1")
    monkeypatch.setitem(judge._state, "client", StubClient({"pred": "yes", "score": 4}))
    out = load_utils("moviechat").process_results(rows("moviechat")[0], ["gray"])
    assert out["qa_acc"]["score"] == 1.0 and out["qa_score"]["score"] == 4.0
    monkeypatch.setitem(judge._state, "client", StubClient(None))  # an unreadable reply: missing, not 0
    out = load_utils("moviechat").process_results(rows("moviechat")[0], ["gray"])
    assert out["qa_acc"]["judge_score"] is None and out["qa_acc"]["judge_error"] == "unparsable"


def test_mean_judged_leaves_missing_scores_out():
    assert metrics.mean_judged([{"score": 4.0}, {"judge_score": None}, {"score": 2.0}]) == 3.0
    assert metrics.mean_judged([{"judge_score": None}]) is None


# ---- end to end through the lmms-eval CLI -----------------------------------------------------------

ALL_TASKS = ("lvspec_videomme", "vdc", "vdd", "vdd_facts", "vdc_detailed_facts", "lvspec_moviechat_global",
             "lvspec_moviechat_breakpoint", "lvspec_mvbench", "lvspec_mlvu", "lvspec_longvideobench")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    """A random Qwen2.5-VL of the demo's target architecture, saved with its tokenizer."""
    import torch
    from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

    from lvspec_eval.demo.models import target_config

    tok = AutoTokenizer.from_pretrained(ROOT / "lvspec_eval" / "demo" / "checkpoints" / "tokenizer")
    path = tmp_path_factory.mktemp("tiny_qwen")
    torch.manual_seed(0)
    Qwen2_5_VLForConditionalGeneration(target_config(tok)).eval().save_pretrained(path)
    tok.save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 784, "max_pixels": 200704}))
    return path


def cli_env() -> dict:
    env = {k: v for k, v in os.environ.items() if k not in JUDGE_VARS}
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.update({b.env_var: str(FIXTURES / name) for name, b in benchmarks.BENCHMARKS.items()})
    return env


@pytest.mark.slow
def test_every_task_runs_end_to_end_through_lmms_eval(tiny_model, tmp_path):
    stats = tmp_path / "stats.jsonl"
    args = [str(ROOT / ".venv" / "bin" / "lmms-eval"), "--model", "lvspec", "--model_args",
            f"pretrained={tiny_model},method=vanilla,max_new_tokens=8,stats_path={stats}",
            "--tasks", ",".join(ALL_TASKS), "--limit", "2",  # no --include_path: the plugin registers the tasks
            "--gen_kwargs", "max_new_tokens=8",  # the tasks' own limits (up to 512) only slow a random model down
            "--output_path", str(tmp_path / "out"), "--log_samples", "--verbosity", "DEBUG"]
    run = subprocess.run(args, check=False, cwd=ROOT, env=cli_env(), capture_output=True, text=True, timeout=3600)
    results = list((tmp_path / "out").rglob("*_results.json"))  # lmms-eval can exit 0 on failure
    assert results, run.stdout[-3000:] + run.stderr[-3000:]
    tasks = set(json.loads(results[0].read_text())["results"])
    expected = set(benchmarks.TASKS)
    assert expected <= tasks
    for task in expected:
        samples = list((tmp_path / "out").rglob(f"*_samples_{task}.jsonl"))
        assert samples and len(samples[0].read_text().splitlines()) == 2, task
    records = [json.loads(line) for line in stats.read_text().splitlines()]
    assert {(r["task"], r["doc_id"]) for r in records} == {(t, d) for t in expected for d in (0, 1)}
    failed = [r for r in records if r["error"]]
    assert [(r["task"], r["doc_id"]) for r in failed] == [("lvspec_mlvu", 1)]
    assert "mlvu_missing.mp4" in failed[0]["error"]


# ---- lvspec-eval dry-run ------------------------------------------------------------------------------

def dry_run(capsys, model_args: str, tasks: str, videos: int = 3) -> tuple[int, str]:
    import argparse

    from lvspec_eval.measure import dry_run as dr

    code = dr.run(argparse.Namespace(model_args=model_args, tasks=tasks, include_path=str(TASKS_DIR), videos=videos))
    return code, capsys.readouterr().out


def save_checkpoint_files(path: Path, merge_size: int = 2, draft: bool = False) -> Path:
    """config.json, tokenizer and preprocessor config of a demo-architecture Qwen2.5-VL (no weights)."""
    from transformers import AutoTokenizer

    from lvspec_eval.demo import models

    tok = AutoTokenizer.from_pretrained(ROOT / "lvspec_eval" / "demo" / "checkpoints" / "tokenizer")
    config = (models.draft_config if draft else models.target_config)(tok)
    config.vision_config.spatial_merge_size = merge_size
    config.save_pretrained(path)
    tok.save_pretrained(path)
    (path / "preprocessor_config.json").write_text(json.dumps({"min_pixels": 784, "max_pixels": 200704}))
    return path


def test_dry_run_passes_on_good_settings(roots, capsys, tmp_path):
    target = save_checkpoint_files(tmp_path / "target")
    draft = save_checkpoint_files(tmp_path / "draft", draft=True)
    code, out = dry_run(capsys, f"pretrained={target},draft={draft},method=specvlm", "lvspec_videomme,vdd,synthvid_mcq")
    assert code == 0, out
    assert "OK    pairing:" in out and "OK    data videomme (lvspec_videomme): LVSPEC_VIDEOMME_ROOT=" in out
    assert "the first 2 videos exist" in out
    assert "WARN  data vdd (vdd): judged scores will be missing: no judge configured" in out
    assert "WARN  task synthvid_mcq: not one of this project's benchmark tasks" in out


def test_dry_run_fails_on_a_missing_video(roots, capsys, tmp_path):
    target = save_checkpoint_files(tmp_path / "target")
    code, out = dry_run(capsys, f"pretrained={target},method=vanilla", "lvspec_mlvu")
    assert code == 1 and "FAIL  data mlvu (lvspec_mlvu): 1 of the first 2 videos missing:" in out
    assert "mlvu_missing.mp4" in out and out.rstrip().endswith("1 failures")


def test_dry_run_fails_on_bad_model_args_and_roots(roots, capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("LVSPEC_VDC_ROOT", str(tmp_path / "nowhere"))
    code, out = dry_run(capsys, "pretrained=demo,method=vanila", "vdc,videomme")
    assert code == 1
    assert "FAIL  model_args: unknown method 'vanila'" in out
    assert "WARN  task videomme: not one of this project's benchmark tasks" in out and "lvspec_videomme?" in out
    assert "data vdc (vdc_detailed,vdc_camera,vdc_short,vdc_background,vdc_main_object)" in out
    assert "nowhere: no such folder" in out


def test_dry_run_finds_a_layout_mismatch(roots, capsys, tmp_path):
    target = save_checkpoint_files(tmp_path / "target")
    draft = save_checkpoint_files(tmp_path / "draft", merge_size=1, draft=True)
    code, out = dry_run(capsys, f"pretrained={target},draft={draft},method=sd_tree", "lvspec_videomme")
    assert code == 1 and "FAIL  pairing: layout: target ('qwen2_5_vl', 14, 2, 2," in out


@pytest.mark.parametrize("family", ["qwen2_5_vl", "llava_onevision"], indirect=True)
def test_dry_run_layout_equals_the_backends(family):
    """dry-run computes the layout from files; it must agree with the loaded backend's."""
    from transformers import AutoConfig

    from lvspec_eval.measure import dry_run as dr
    from lvspec_eval.models.args import ModelArgs

    path = family.target.model.config._name_or_path
    parsed = ModelArgs.parse({"pretrained": path, "device": "cpu", "video_rule": "fps"})  # as conftest loads them
    assert dr.config_layout(AutoConfig.from_pretrained(path), path, parsed) == family.target.layout()


@pytest.mark.judge_server
def test_judged_tasks_against_the_real_local_judge(roots, monkeypatch, tmp_path):
    """VDD and MovieChat scoring through a real OpenAI-compatible server (plumbing, not quality)."""
    from judges.server import JudgeServer, missing_reason

    reason = missing_reason()
    if reason:
        pytest.skip(f"local judge server not available: {reason}")
    with JudgeServer.start(log_path=tmp_path / "server.log", n_threads=1) as server:
        monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
        monkeypatch.setenv("MODEL_VERSION", server.model)
        monkeypatch.setenv(judge.JUDGE_CACHE, str(tmp_path / "cache.sqlite"))
        vdd = load_utils("vdd").process_results(rows("vdd")[0], ["A red square moves left on a black background."])
        mc = load_utils("moviechat").process_results(rows("moviechat")[0], ["gray"])
        assert server.request_count() > 0
    for value in (vdd["detail_score"], mc["qa_acc"], mc["qa_score"]):
        assert (value["judge_score"] is None) == (value["judge_error"] is not None)  # a score, or why not
        if value["judge_score"] is not None:
            assert 0 <= value["score"] <= 5


def test_dry_run_registers_its_sub_command():
    import argparse

    from lvspec_eval.measure import dry_run as dr

    parser = argparse.ArgumentParser()
    dr.register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["dry-run", "--model_args", "pretrained=demo", "--tasks", "vdc"])
    assert args.func is dr.run and args.videos == 3 and Path(args.include_path) == TASKS_DIR
