"""Each benchmark read in its real release layouts (tasks/_common/layouts/), checked before any model runs.

Fixtures: tests/fixtures/benchmarks/<bench>/<layout>/ reproduce the authors' release and the hub
dataset lmms-eval reads (each README cites the release); videos are rendered at test time.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lvspec_eval.tasks import TASKS_DIR
from lvspec_eval.tasks._common import benchmarks, prompts
from lvspec_eval.tasks._common.builtin import builtin_utils
from lvspec_eval.tasks._common.schema import SOURCE_FILE, SchemaError

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "benchmarks"
sys.path.insert(0, str(FIXTURES))
from make_fixtures import write_video

# (benchmark, layout) -> (task, the annotation file read, the options field of a row)
CASES = {
    ("longvideobench", "authors"): ("lvspec_longvideobench", "lvb_val.json", "candidates"),
    ("longvideobench", "hub"): ("lvspec_longvideobench", "validation-00000-of-00001.parquet", "option0"),
    ("mlvu", "authors"): ("lvspec_mlvu", "1_plotQA.json", "candidates"),
    ("mlvu", "hub"): ("lvspec_mlvu", "test-00000-of-00001.parquet", "question"),
    ("mvbench", "authors"): ("lvspec_mvbench", "object_existence.json", "candidates"),
    ("videomme", "hub"): ("lvspec_videomme", "test-00000-of-00001.parquet", "options"),
}


def utils_of(task: str):
    import importlib.util

    folder = next(p.parent for p in TASKS_DIR.glob("*/*.yaml") if f"task: {task}\n" in p.read_text())
    spec = importlib.util.spec_from_file_location(f"utils_{folder.name}", folder / "utils.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def default_kwargs(task: str) -> dict:
    path = next(p for p in TASKS_DIR.glob("*/*.yaml") if f"task: {task}\n" in p.read_text())
    config = yaml.safe_load("\n".join(line for line in path.read_text().splitlines() if "!function" not in line))
    return config["lmms_eval_specific_kwargs"]["default"]


def release(tmp_path: Path, monkeypatch, bench: str, layout: str) -> Path:
    """A copy of the fixture as LVSPEC_<BENCH>_ROOT, with a tiny video wherever its docs point."""
    root = tmp_path / bench / layout
    shutil.copytree(FIXTURES / bench / layout, root)
    monkeypatch.setenv(benchmarks.get(bench).env_var, str(root))
    monkeypatch.delenv(prompts.PROMPT_VARIANT_VAR, raising=False)
    for k, doc in enumerate(benchmarks.load_rows(benchmarks.get(bench))):
        path = Path(benchmarks.video_candidates(benchmarks.get(bench), doc)[0])
        if path.suffix == ".webm":  # MVBench's release: named .webm, stored as .mp4
            path = path.parent.parent / "ssv2_video_mp4" / path.with_suffix(".mp4").name
        write_video(path, seed=k + 1)
    return root


def options_of(doc: dict) -> list[str]:
    if "candidates" in doc:
        return list(doc["candidates"])
    return list(doc["options"])  # Video-MME's "A. text" entries


@pytest.mark.parametrize("bench,layout", list(CASES))
def test_each_release_layout_loads_with_every_option_in_every_prompt(tmp_path, monkeypatch, bench, layout):
    task, file_name, _ = CASES[(bench, layout)]
    release(tmp_path, monkeypatch, bench, layout)
    rows = benchmarks.load_rows(benchmarks.get(bench))
    assert rows and any(r[SOURCE_FILE].endswith(file_name) for r in rows)
    benchmarks.check_rows(bench, rows, benchmarks.TASK_FIELDS[task], benchmarks.layouts_of(benchmarks.get(bench)))
    utils = utils_of(task)
    for doc in rows:
        prompt = utils.doc_to_text(doc, default_kwargs(task))
        assert len(options_of(doc)) >= 3 and all(option in prompt for option in options_of(doc)), prompt
        assert os.path.isfile(benchmarks.video_path(benchmarks.get(bench), doc))


def test_mlvu_authors_files_become_the_hub_fields(tmp_path, monkeypatch):
    release(tmp_path, monkeypatch, "mlvu", "authors")
    authors = benchmarks.load_rows(benchmarks.get("mlvu"))
    assert [r["task_type"] for r in authors] == ["plotQA", "needle", "count"]  # 8_sub_scene (open-ended) skipped
    assert [r["answer"] for r in authors] == ["C", "B", "A"]  # the option text became its letter
    assert authors[0]["video_name"] == "MLVU/video/1_plotQA/plotQA_0.mp4"
    hub = pytest.MonkeyPatch.context()
    with hub as m:
        release(tmp_path / "hub", m, "mlvu", "hub")
        hub_rows = benchmarks.load_rows(benchmarks.get("mlvu"))
    for a, h in zip(authors, hub_rows):
        assert (a["question"], a["answer"], a["task_type"], a["candidates"]) == \
               (h["question"], h["answer"], h["task_type"], h["candidates"])


def test_longvideobench_hub_options_become_candidates(tmp_path, monkeypatch):
    release(tmp_path, monkeypatch, "longvideobench", "hub")
    rows = benchmarks.load_rows(benchmarks.get("longvideobench"))
    authors = json.loads((FIXTURES / "longvideobench" / "authors" / "lvb_val.json").read_text())
    assert [r["candidates"] for r in rows] == [a["candidates"] for a in authors]  # "N/A" left out
    assert not any(k.startswith("option") for k in rows[0])


# ---- the schema check: a row without options, answer or video stops the run at start ------------------

# benchmark -> (layout, the annotation file to break, its options / answer / video fields)
BREAKABLE = {
    "longvideobench": ("authors", "lvb_val.json", ("candidates", "correct_choice", "video_path")),
    "mlvu": ("authors", "MLVU/json/1_plotQA.json", ("candidates", "answer", "video")),
    "mvbench": ("authors", "json/object_existence.json", ("candidates", "answer", "video")),
    "videomme": ("hub", "videomme/test-00000-of-00001.parquet", ("options", "answer", "videoID")),
}
TASK_OF = {"longvideobench": "lvspec_longvideobench", "mlvu": "lvspec_mlvu", "mvbench": "lvspec_mvbench",
           "videomme": "lvspec_videomme"}


def drop_field(path: Path, field: str) -> int:
    """Remove `field` from the file's last row; returns that row's number."""
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        rows = pq.read_table(path).to_pylist()
        rows[-1][field] = None
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        rows = json.loads(path.read_text())
        del rows[-1][field]
        path.write_text(json.dumps(rows))
    return len(rows) - 1


@pytest.mark.parametrize("bench", list(BREAKABLE))
@pytest.mark.parametrize("which", [0, 1, 2], ids=["options", "answer", "video"])
def test_a_row_without_options_answer_or_video_stops_at_start(tmp_path, monkeypatch, capsys, bench, which):
    import datasets

    layout, file_name, fields = BREAKABLE[bench]
    root = release(tmp_path, monkeypatch, bench, layout)
    row = drop_field(root / file_name, fields[which])
    with pytest.raises(SchemaError) as err:
        utils_of(TASK_OF[bench]).process_docs(datasets.Dataset.from_list([{"placeholder": 0}]))
    message = str(err.value)
    missing = {"candidates": "candidates", "video": {"mlvu": "video_name"}.get(bench, "video")}.get(
        fields[which], fields[which])
    assert message.startswith(f"{bench}: 1 of ") and f"{Path(file_name).name} row {row}: missing {missing}" in message
    assert "accepted layouts:" in message and "- " + layout in message
    out = dry_run_data(capsys, TASK_OF[bench])
    assert f"FAIL  schema {bench} ({TASK_OF[bench]}): 1 of " in out and f"row {row}: missing {missing}" in out


# benchmark -> (layout, file, field, a value that is none of the options, the problem named)
UNSCORABLE = {
    "mvbench": ("authors", "json/object_existence.json", "answer", "seven",
                "answer 'seven' is not one of its candidates"),
    "longvideobench": ("authors", "lvb_val.json", "correct_choice", 4, "correct_choice 4 is not an index of its 4"),
    "videomme": ("hub", "videomme/test-00000-of-00001.parquet", "answer", "E", "answer 'E' is not the letter of one"),
}


@pytest.mark.parametrize("bench", list(UNSCORABLE))
def test_an_answer_that_is_none_of_the_options_stops_at_start(tmp_path, monkeypatch, capsys, bench):
    import datasets
    import pyarrow as pa
    import pyarrow.parquet as pq

    layout, file_name, field, value, problem = UNSCORABLE[bench]
    path = release(tmp_path, monkeypatch, bench, layout) / file_name
    rows = pq.read_table(path).to_pylist() if path.suffix == ".parquet" else json.loads(path.read_text())
    rows[-1][field] = value
    if path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        path.write_text(json.dumps(rows))
    with pytest.raises(SchemaError, match=f"row {len(rows) - 1}: {problem}"):
        utils_of(TASK_OF[bench]).process_docs(datasets.Dataset.from_list([{"placeholder": 0}]))
    assert problem in dry_run_data(capsys, TASK_OF[bench])


def dry_run_data(capsys, task: str) -> str:
    from lvspec_eval.measure import dry_run as dr

    checks = dr.check_tasks([task], TASKS_DIR, 0)
    return dr.format_report(checks)


def test_a_prompt_without_options_is_refused_even_past_the_check():
    utils = utils_of("lvspec_longvideobench")
    with pytest.raises(SchemaError, match="no options"):
        utils.doc_to_text({"id": "x", "question": "Q?", "candidates": []}, default_kwargs("lvspec_longvideobench"))


# ---- scores as lmms-eval's own tasks compute them ---------------------------------------------------------

def test_mlvu_aggregate_equals_lmms_evals_when_every_task_type_is_present():
    utils, builtin = utils_of("lvspec_mlvu"), builtin_utils("mlvu")
    from lvspec_eval.tasks._common.layouts.mlvu import TASK_TYPES

    docs = [{"question": f"q{i}", "task_type": t, "answer": "AB"[i % 2]} for i, t in enumerate(TASK_TYPES * 3)]
    replies = ["A", "(B)", "C", "B", "A", "best option: A", "D"] * 3
    ours = [utils.process_results(d, [r])["mlvu_percetion_score"] for d, r in zip(docs, replies)]
    theirs = [builtin.mlvu_process_results(d, [r])["mlvu_percetion_score"] for d, r in zip(docs, replies)]
    assert [o["pred_answer"] for o in ours] == [t["pred_answer"] for t in theirs]
    assert utils.aggregate(ours) == pytest.approx(builtin.mlvu_aggregate_results_dev(theirs))
    with pytest.raises(ValueError, match="task_type 'findNeedle' is not a multiple-choice type"):
        utils.aggregate([{**ours[0], "task_type": "findNeedle"}])


def test_mlvu_aggregate_averages_the_types_present():
    utils = utils_of("lvspec_mlvu")
    results = [{"task_type": "plotQA", "pred_answer": "A", "answer": "A"},
               {"task_type": "needle", "pred_answer": "B", "answer": "A"},
               {"task_type": "needle", "pred_answer": "A", "answer": "A"}]
    assert utils.aggregate(results) == pytest.approx((100 + 50) / 2)


def test_longvideobench_scores_the_authors_answer_index(tmp_path, monkeypatch):
    """lmms-eval's longvideobench utils import decord (absent here): compared with a faithful reading of it,
    the answer is chr(65 + correct_choice) and the reply's letter is scored against it."""
    release(tmp_path, monkeypatch, "longvideobench", "authors")
    utils, doc = utils_of("lvspec_longvideobench"), benchmarks.load_rows(benchmarks.get("longvideobench"))[0]
    right = chr(65 + doc["correct_choice"])
    assert utils.process_results(doc, [f"{right}."])["lvb_acc"]["score"] == 1.0
    assert utils.process_results(doc, ["E"])["lvb_acc"]["score"] == 0.0  # a fifth option exists: E is readable


def test_mvbench_webm_names_find_their_mp4(tmp_path, monkeypatch):
    release(tmp_path, monkeypatch, "mvbench", "authors")
    doc = next(r for r in benchmarks.load_rows(benchmarks.get("mvbench")) if r["sub_task"] == "action_antonym")
    assert benchmarks.video_path(benchmarks.get("mvbench"), doc).endswith("ssv2_video_mp4/166583.mp4")


def test_mvbench_hub_fallback_is_pinned_to_lmms_evals_revision():
    import lmms_eval

    template = Path(lmms_eval.__file__).parent / "tasks" / "mvbench" / "_default_template_yaml"
    text = "\n".join(line for line in template.read_text().splitlines() if "!function" not in line)
    pinned = yaml.safe_load(text)["dataset_kwargs"]["revision"]
    assert benchmarks.get("mvbench").revision == pinned


# ---- Video-MME's per-model prompt -----------------------------------------------------------------------

def test_videomme_gives_qwen3_vl_its_lmms_eval_variant(tmp_path, monkeypatch):
    release(tmp_path, monkeypatch, "videomme", "hub")
    utils, doc = utils_of("lvspec_videomme"), benchmarks.load_rows(benchmarks.get("videomme"))[0]
    builtin, table = builtin_utils("videomme"), prompts.builtin_variants("videomme", "videomme.yaml")
    default = default_kwargs("lvspec_videomme")
    assert utils.doc_to_text(doc, default) == builtin.videomme_doc_to_text(doc, dict(table["default"]))
    monkeypatch.setenv(prompts.PROMPT_VARIANT_VAR, "qwen3_vl")
    qwen3 = utils.doc_to_text(doc, default)
    assert qwen3 == builtin.videomme_doc_to_text(doc, dict(table["qwen3_vl"])) and qwen3 != utils.doc_to_text(
        doc, {"variant": "default", **default})
    monkeypatch.setenv(prompts.PROMPT_VARIANT_VAR, "qwen2_5_vl")  # no such variant: the default, as lmms-eval
    assert utils.doc_to_text(doc, default) == builtin.videomme_doc_to_text(doc, dict(table["default"]))
    monkeypatch.delenv(prompts.PROMPT_VARIANT_VAR)  # lmms-eval's own qwen3_vl class on our task
    assert utils.doc_to_text(doc, {"variant": "qwen3_vl"}) == qwen3


def test_prompt_variant_model_arg():
    from lvspec_eval.models import parity
    from lvspec_eval.models.args import ModelArgs

    assert parity.PROMPT_VARIANT_VAR == prompts.PROMPT_VARIANT_VAR
    assert parity.prompt_variant("auto", "qwen3_vl", "chat") == "qwen3_vl"
    assert parity.prompt_variant("auto", "qwen2_5_vl", "simple") == "qwen2_5_vl"
    assert parity.prompt_variant("default", "qwen3_vl", "chat") == "default"
    assert ModelArgs.parse({"pretrained": "demo", "device": "cpu"}).prompt_variant == "auto"
    with pytest.raises(ValueError, match="prompt_variant='qwen9'.*expected one of auto, default, .*qwen3_vl"):
        ModelArgs.parse({"pretrained": "demo", "device": "cpu", "prompt_variant": "qwen9"})


# ---- end to end through lmms-eval with the demo model ------------------------------------------------------

# two runs cover every (benchmark, layout): a benchmark's root is one environment variable per run
E2E_RUNS = {"authors": [("longvideobench", "authors"), ("mlvu", "authors"), ("mvbench", "authors"),
                        ("videomme", "hub")],
            "hub": [("longvideobench", "hub"), ("mlvu", "hub")]}


@pytest.mark.slow
@pytest.mark.parametrize("run_name", list(E2E_RUNS))
def test_release_layouts_run_end_to_end(tmp_path, monkeypatch, run_name):
    """`lmms_eval --model lvspec --model_args pretrained=demo,method=vanilla --limit 3 --log_samples`: every
    logged multiple-choice prompt carries all its options."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    env.pop(prompts.PROMPT_VARIANT_VAR, None)
    docs = {}
    for bench, layout in E2E_RUNS[run_name]:
        env[benchmarks.get(bench).env_var] = str(release(tmp_path / "data", monkeypatch, bench, layout))
        docs[CASES[(bench, layout)][0]] = benchmarks.load_rows(benchmarks.get(bench))
    args = [sys.executable, "-m", "lmms_eval", "--model", "lvspec", "--model_args", "pretrained=demo,method=vanilla",
            "--tasks", ",".join(docs), "--limit", "3", "--gen_kwargs", "max_new_tokens=4", "--output_path",
            str(tmp_path / "out"), "--log_samples", "--verbosity", "DEBUG"]
    run = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1800, check=False)
    for task, rows in docs.items():
        samples = list((tmp_path / "out").rglob(f"*_samples_{task}.jsonl"))
        assert samples, task + run.stdout[-3000:] + run.stderr[-3000:]
        logged = [json.loads(line) for line in samples[0].read_text().splitlines()]
        assert len(logged) == min(3, len(rows)), task
        for sample in logged:
            options = options_of(rows[sample["doc_id"]])
            assert options and all(o in sample["input"] for o in options), (task, sample["input"])


def test_docs_data_shows_every_layout_the_code_accepts():
    text = (ROOT / "docs" / "DATA.md").read_text()
    for name in ("videomme", "mvbench", "mlvu", "longvideobench"):
        for layout in benchmarks.layouts_of(benchmarks.get(name)):
            assert f"- {layout.name}: {layout.source}\n" in text, (name, layout.name)
    assert "(DATA.md)" in (ROOT / "docs" / "GPU.md").read_text()
    assert "(docs/DATA.md)" in (ROOT / "README.md").read_text()


def test_mlvu_hub_options_are_read_from_the_question():
    from lvspec_eval.tasks._common.layouts.mlvu import listed_options

    assert listed_options("What colour?\n(A) black\n(B) gray (dark)\n(C) brown") == ["black", "gray (dark)", "brown"]
    assert listed_options("What colour? (A) black (B) gray") == ["black", "gray"]
    assert listed_options("What colour is the background?") == []  # no options: the check stops the run
    assert listed_options("Which? (B) gray (C) brown") == []  # not from A: not an option list


def test_hub_fallback_reads_lmms_evals_dataset_at_its_revision(monkeypatch, tmp_path):
    """Without LVSPEC_<NAME>_ROOT: the hub dataset, at the revision lmms-eval pins, converted and tagged."""
    import datasets

    calls = []

    def fake_load(hub_id, config, split, revision=None):
        calls.append((hub_id, config, split, revision))
        return [{"video": "v.mp4", "question": "Q?", "candidates": ["a", "b"], "answer": "b"}] if config else [
            {"video_path": "v.mp4", "question": "Q?", "option0": "a", "option1": "b", "option2": "N/A",
             "correct_choice": 1, "id": "x", "duration_group": 15, "question_category": "S2O"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_load)
    monkeypatch.setenv("HF_HOME", str(tmp_path))
    for name in ("mvbench", "longvideobench"):
        monkeypatch.delenv(benchmarks.get(name).env_var, raising=False)
    mvbench = benchmarks.load_rows(benchmarks.get("mvbench"))
    assert {c[3] for c in calls} == {"video"} and len(mvbench) == len(benchmarks.MVBENCH_CONFIGS)
    assert mvbench[0]["sub_task"] == "action_sequence" and "OpenGVLab/MVBench@video" in mvbench[0][SOURCE_FILE]
    lvb = benchmarks.load_rows(benchmarks.get("longvideobench"))
    assert calls[-1] == ("longvideobench/LongVideoBench", None, "validation", None)
    assert lvb[0]["candidates"] == ["a", "b"]


@pytest.mark.parametrize("bench,layout,metric", [("mvbench", "authors", "mvbench_accuracy"),
                                                 ("videomme", "hub", "videomme_perception_score")])
def test_scores_are_lmms_evals_for_the_same_answers(tmp_path, monkeypatch, bench, layout, metric):
    release(tmp_path, monkeypatch, bench, layout)
    task = CASES[(bench, layout)][0]
    utils, builtin = utils_of(task), builtin_utils(bench)
    process = builtin.mvbench_process_results if bench == "mvbench" else builtin.videomme_process_results
    for doc in benchmarks.load_rows(benchmarks.get(bench)):
        for reply in ("A", "(B) two", "C.", "I do not know"):
            ours, theirs = utils.process_results(doc, [reply])[metric], process(doc, [reply])[metric]
            assert ours["score"] == theirs["score"], (doc, reply)
