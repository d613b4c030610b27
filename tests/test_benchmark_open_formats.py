"""VDC, VDD and MovieChat-1K read as their authors release them and as lmms-eval's hub snapshots lay
them out (fixtures under tests/fixtures/benchmarks/<bench>/<layout>/, each with a README citing the
release). Videos are written at test time; the fixtures hold annotations only.
"""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lvspec_eval.tasks import TASKS_DIR
from lvspec_eval.tasks._common import benchmarks, judge
from lvspec_eval.tasks._common.layouts import vdc as vdc_layouts
from lvspec_eval.tasks._common.schema import SOURCE_FILE, SOURCE_ROW, SchemaError

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "benchmarks"
JUDGE_VARS = judge.ENDPOINT_VARS + (judge.JUDGE_SWITCH,)
# (benchmark, layout folder) -> the folder its videos sit in and the doc field naming them
LAYOUTS = {("vdc", "authors"): "videos", ("vdc", "hub"): "Test_Videos",
           ("vdd", "authors"): "Test_Videos", ("vdd", "hub"): "Test_Videos",
           ("moviechat", "authors"): "videos", ("moviechat", "hub"): "Test_Videos"}


def load_module(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def load_utils(bench: str):
    """A task's utils.py loaded by file path, as lmms-eval's `!function` loads it."""
    return load_module(f"open_utils_{bench}", TASKS_DIR / bench / "utils.py")


def video_file(doc: dict, bench: str) -> str:
    name = str(doc["video_name"])
    return name if name.endswith(".mp4") else name + ".mp4"


def make_root(tmp_path: Path, bench: str, layout: str, monkeypatch=None) -> Path:
    """A copy of one layout's fixture with a tiny video for every doc, set as the benchmark's root."""
    root = tmp_path / f"{bench}-{layout}"
    shutil.copytree(FIXTURES / bench / layout, root)
    writer = load_module("make_fixtures", FIXTURES / "make_fixtures.py").write_video
    docs = layout_docs(bench, root)
    for seed, name in enumerate(sorted({video_file(d, bench) for d in docs})):
        writer(root / LAYOUTS[(bench, layout)] / name, seed)
    if monkeypatch is not None:
        monkeypatch.setenv(benchmarks.get(bench).env_var, str(root))
    return root


def layout_docs(bench: str, root: Path) -> list[dict]:
    return benchmarks.local_rows(benchmarks.get(bench), root)


@pytest.fixture(autouse=True)
def no_judge(monkeypatch):
    for var in JUDGE_VARS:
        monkeypatch.delenv(var, raising=False)
    judge._state.clear()


def process(bench: str, name: str) -> list[dict]:
    """The docs one task's process_docs returns (lmms-eval calls it before any model runs)."""
    import datasets

    placeholder = datasets.Dataset.from_list([{"placeholder": 0}])
    return list(getattr(load_utils(bench), name)(placeholder))


# ---- the readers ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("bench,layout", list(LAYOUTS))
def test_each_release_reads_into_the_tasks_fields_with_provenance(bench, layout):
    docs = layout_docs(bench, FIXTURES / bench / layout)
    fields = {"vdc": {"video_name", "caption", "qa_list", "dimension"}, "vdd": {"video_name", "question", "answer"},
              "moviechat": {"video_name", "question", "answer", "mode", "time", "fps"}}[bench]
    assert docs and all(fields <= set(d) for d in docs)
    assert all(Path(d[SOURCE_FILE]).is_relative_to(FIXTURES / bench / layout) and d[SOURCE_ROW] is not None
               for d in docs)


def test_vdc_auroracap_pairs_each_dimension_with_its_own_caption():
    docs = layout_docs("vdc", FIXTURES / "vdc" / "authors")
    assert len(docs) == 3 * len(vdc_layouts.VDC_DIMENSIONS)
    camera = next(d for d in docs if d["dimension"] == "camera")
    captions = json.loads((FIXTURES / "vdc/authors/post_eval/VDC_1k_captions.jsonl").read_text().split("\n")[0])
    assert camera["caption"] == captions["captions"]["camera_caption"]
    assert camera["qa_list"][0] == {"question": "Does the camera move?", "answer": "no, it is static"}


def test_vdd_video_chatgpt_keys_become_question_and_answer():
    doc = layout_docs("vdd", FIXTURES / "vdd" / "authors")[0]
    raw = json.loads((FIXTURES / "vdd/authors/Benchmarking_QA/generic_qa.json").read_text())[0]
    assert (doc["video_name"], doc["question"], doc["answer"]) == (raw["video_name"], raw["Q"], raw["A"])


def test_vdc_without_its_captions_file_says_what_it_needs(tmp_path):
    root = tmp_path / "vdc"
    shutil.copytree(FIXTURES / "vdc" / "authors", root)
    (root / "post_eval" / "VDC_1k_captions.jsonl").unlink()
    with pytest.raises(SchemaError, match=r"no VDC captions file \(VDC_1k_captions.jsonl or VDC_1k.jsonl\)"):
        layout_docs("vdc", root)


# ---- VDC: each dimension judged against its own QA ---------------------------------------------------------

@pytest.mark.parametrize("layout", ["authors", "hub"])
def test_two_vdc_dimensions_judge_against_their_own_questions(tmp_path, monkeypatch, layout):
    import judges.client

    make_root(tmp_path, "vdc", layout, monkeypatch)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://judge.test/v1")
    asked = []

    def fake_score(client, items, mode):
        asked.append(items[0])
        return [{"key": items[0].key, "mode": mode, "score": 3.0, "acc": 0.5, "parts": {}, "errors": []}]

    monkeypatch.setattr(judges.client, "score_captions", fake_score)
    monkeypatch.setitem(judge._state, "client", object())
    vdc = load_utils("vdc")
    out = {}
    for dim in ("camera", "detailed"):
        docs = process("vdc", f"process_docs_{dim}")
        assert {d["dimension"] for d in docs} == {dim} and len(docs) == 3
        out[dim] = vdc.process_results(docs[0], ["a caption"])
    camera, detailed = asked
    assert [q for q, _ in camera.qa] == ["Does the camera move?", "What is the shot type?"]
    assert [q for q, _ in detailed.qa] == ["What happens in the video?", "How many objects appear?"]
    assert camera.reference.startswith("The camera stays fixed") and detailed.reference.startswith("A red square")
    assert camera.key != detailed.key  # the judge cache cannot hand one dimension's marks to the other
    for dim in out:
        assert out[dim]["vdc_protocol"] == out[dim]["vdc_score"]["protocol"] == "vdcscore-per-dimension"
        assert out[dim]["vdc_score"]["score"] == 3.0


def test_vdc_rows_without_a_dimension_follow_lmms_eval(monkeypatch):
    """The merged hub rows (no dimension): every dimension task asks every row, protocol lmms-eval-hub."""
    monkeypatch.setenv("LVSPEC_VDC_ROOT", str(FIXTURES / "vdc"))  # test.jsonl: lmms-eval's rows, merged
    camera, short = process("vdc", "process_docs_camera"), process("vdc", "process_docs_short")
    assert [d["video_name"] for d in camera] == [d["video_name"] for d in short] == ["vdc_fixture01", "vdc_fixture02"]
    out = load_utils("vdc").process_results(camera[0], ["a caption"])
    assert out["vdc_protocol"] == out["vdc_acc"]["protocol"] == "lmms-eval-hub"


def test_a_vdc_dimension_absent_from_the_files_is_named(tmp_path, monkeypatch):
    root = make_root(tmp_path, "vdc", "authors", monkeypatch)
    (root / "post_eval" / "short.jsonl").unlink()
    with pytest.raises(ValueError, match=r"vdc_short: no rows with dimension='short'.*found: background, camera"):
        process("vdc", "process_docs_short")


# ---- a missing field stops the run at start ------------------------------------------------------------------

def drop_vdc_caption(root: Path) -> str:
    """The second video's camera caption gone from the captions file: its camera row has no reference."""
    path = root / "post_eval" / "VDC_1k_captions.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    del records[1]["captions"]["camera_caption"]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return "camera.jsonl row 1: missing caption"


def drop_vdd_answer(root: Path) -> str:
    path = root / "Benchmarking_QA" / "generic_qa.json"
    rows = json.loads(path.read_text())
    del rows[2]["A"]
    path.write_text(json.dumps(rows))
    return "generic_qa.json row 2: missing answer"


def drop_moviechat_time(root: Path) -> str:
    path = root / "annotations" / "2.json"
    data = json.loads(path.read_text())
    del data["breakpoint"][1]["time"]
    path.write_text(json.dumps(data))
    return "2.json row breakpoint[1]: missing time"


@pytest.mark.parametrize("bench,layout,task_docs,drop", [
    ("vdc", "authors", "process_docs_camera", drop_vdc_caption),
    ("vdd", "authors", "process_docs", drop_vdd_answer),
    ("moviechat", "authors", "process_docs_breakpoint", drop_moviechat_time),
])
def test_a_row_missing_a_field_stops_the_run_at_start(tmp_path, monkeypatch, bench, layout, task_docs, drop):
    root = make_root(tmp_path, bench, layout, monkeypatch)
    where = drop(root)
    with pytest.raises(SchemaError) as err:
        process(bench, task_docs)
    assert where in str(err.value) and "accepted layouts" in str(err.value)


def test_a_vdc_question_without_its_answer_is_named(tmp_path, monkeypatch):
    root = make_root(tmp_path, "vdc", "authors", monkeypatch)
    path = root / "post_eval" / "detailed.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    del records[2][first_key(records[2])][1]["answer"]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    with pytest.raises(SchemaError, match=r"detailed\.jsonl row 2: QA item\(s\) \[1\] lack a question or an answer"):
        process("vdc", "process_docs_detailed")


def first_key(record: dict) -> str:
    return next(iter(record))


def test_a_missing_video_name_stops_the_run(tmp_path, monkeypatch):
    root = make_root(tmp_path, "moviechat", "authors", monkeypatch)
    path = root / "annotations" / "3.json"
    data = json.loads(path.read_text())
    del data["info"]["video_path"]
    path.write_text(json.dumps(data))
    with pytest.raises(SchemaError, match=r"3\.json row global\[0\]: missing video_name"):
        process("moviechat", "process_docs_global")


def test_a_missing_video_is_a_per_sample_failure_not_a_schema_error(tmp_path, monkeypatch):
    root = make_root(tmp_path, "vdd", "authors", monkeypatch)
    (root / "Test_Videos" / "v_fixture_b02.mp4").unlink()
    docs = process("vdd", "process_docs")  # loads: the video is the model's problem, for that sample alone
    assert len(docs) == 3
    assert load_utils("vdd").doc_to_visual(docs[1]) == [str(root / "Test_Videos" / "v_fixture_b02.mp4")]


# ---- MovieChat-1K: each task asks its own questions; breakpoint times are frame indices ---------------------

@pytest.mark.parametrize("layout", ["authors", "hub"])
def test_moviechat_global_and_breakpoint_ask_only_their_own_questions(tmp_path, monkeypatch, layout):
    make_root(tmp_path, "moviechat", layout, monkeypatch)
    global_docs = process("moviechat", "process_docs_global")
    breakpoint_docs = process("moviechat", "process_docs_breakpoint")
    assert {d["question"] for d in global_docs} == {"What colour is the background?", "How many objects are there?"}
    assert {d["question"] for d in breakpoint_docs} == {"What is moving right now?",
                                                         "Where is the object at this moment?"}
    assert len(global_docs) == len(breakpoint_docs) == 6
    assert {d["time"] for d in breakpoint_docs} == {1200, 2400}


def test_moviechat_breakpoint_time_is_a_frame_index(tmp_path, monkeypatch):
    """The authors' time 1200 at info.fps 24 is 50 s (read as seconds it would be 20:00); without a
    release fps the video file's rate converts it (the tiny clips run at 2 fps: frame 3 -> 0:01)."""
    make_root(tmp_path, "moviechat", "authors", monkeypatch)
    utils = load_utils("moviechat")
    doc = next(d for d in process("moviechat", "process_docs_breakpoint") if d["time"] == 1200)
    assert utils.doc_to_text_breakpoint(doc, {}).startswith("At 0:50 of the video: What is moving right now?")
    make_root(tmp_path, "moviechat", "hub", monkeypatch)
    hub_doc = {**process("moviechat", "process_docs_breakpoint")[0], "time": 3}
    assert hub_doc["fps"] is None and utils.moment(hub_doc) == "0:01"


# ---- the report names the VDC protocol -----------------------------------------------------------------------

def test_the_report_shows_the_protocol_the_samples_name():
    from lvspec_eval.reporting import quality, sections
    from lvspec_eval.reporting.runs import TaskRun

    def run(protocols):
        samples = {str(i): {"doc_id": i, "vdc_score": {"score": 2.0, "protocol": p}} for i, p in enumerate(protocols)}
        return TaskRun("vanilla", "vdc_camera", ("vdc_score",), samples, {}, Path("r.json"), True)

    assert quality.protocol(run(["vdcscore-per-dimension"] * 2), "vdc_score") == "vdcscore-per-dimension"
    assert quality.protocol(run(["lmms-eval-hub", "vdcscore-per-dimension"]), "vdc_score") == \
        "lmms-eval-hub+vdcscore-per-dimension"
    assert quality.protocol(run([None]), "vdc_score") is None
    cell = dict(sections.COLUMNS)["metric"]
    assert cell({"metric": "vdc_score", "protocol": "vdcscore-per-dimension"}) == "vdc_score (vdcscore-per-dimension)"
    assert cell({"metric": "qa_acc", "protocol": None}) == "qa_acc"


# ---- end to end through the lmms-eval CLI ------------------------------------------------------------------

E2E = {"authors": {"vdc": "authors", "vdd": "authors", "moviechat": "authors"},
       "hub": {"vdc": "hub", "vdd": "hub", "moviechat": "hub"}}
E2E_TASKS = ("vdc_detailed", "vdc_camera", "vdd", "lvspec_moviechat_global", "lvspec_moviechat_breakpoint")


def run_lmms_eval(tmp_path: Path, roots: dict[str, Path]) -> Path:
    env = {k: v for k, v in os.environ.items() if k not in JUDGE_VARS}
    env.update(HF_DATASETS_OFFLINE="1", HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    env.update({benchmarks.get(b).env_var: str(root) for b, root in roots.items()})
    out = tmp_path / "out"
    args = [sys.executable, "-m", "lmms_eval", "--model", "lvspec", "--model_args", "pretrained=demo,method=vanilla",
            "--tasks", ",".join(E2E_TASKS), "--limit", "3", "--gen_kwargs", "max_new_tokens=8",
            "--output_path", str(out), "--log_samples", "--verbosity", "DEBUG"]
    run = subprocess.run(args, check=False, cwd=ROOT, env=env, capture_output=True, text=True, timeout=3600)
    assert list(out.rglob("*_results.json")), run.stdout[-3000:] + run.stderr[-3000:]  # lmms-eval may exit 0
    return out


def logged(out: Path, task: str) -> list[dict]:
    path = next(out.rglob(f"*_samples_{task}.jsonl"))
    return [json.loads(line) for line in path.read_text().split("\n") if line.strip()]


@pytest.mark.slow
@pytest.mark.parametrize("release", list(E2E))
def test_each_layout_runs_end_to_end_through_lmms_eval(tmp_path, release):
    roots = {bench: make_root(tmp_path, bench, layout) for bench, layout in E2E[release].items()}
    out = run_lmms_eval(tmp_path, roots)
    for task in E2E_TASKS:
        assert len(logged(out, task)) == 3, task
    camera, detailed = logged(out, "vdc_camera"), logged(out, "vdc_detailed")
    assert {s["vdc_protocol"] for s in camera + detailed} == {"vdcscore-per-dimension"}
    assert camera[0]["qa_list"][0]["question"] == "Does the camera move?"
    assert detailed[0]["qa_list"][0]["question"] == "What happens in the video?"
    global_questions = ("What colour is the background?", "How many objects are there?")
    breakpoints, globals_ = logged(out, "lvspec_moviechat_breakpoint"), logged(out, "lvspec_moviechat_global")
    assert all(any(s["input"].endswith(q) for q in global_questions) for s in globals_)
    assert not any(q in s["input"] for s in breakpoints for q in global_questions)
    assert all("of the video: " in s["input"] for s in breakpoints)
    if release == "authors":  # frame 1200 at the release's 24 fps
        assert "At 0:50 of the video: What is moving right now?" in breakpoints[0]["input"]
    assert all(s["vdc_score"]["judge_error"] for s in camera)  # no judge here: missing, never 0


# ---- lvspec-eval dry-run checks each task's own rows -----------------------------------------------------

def dry_run(capsys, tasks: str) -> tuple[int, str]:
    import argparse

    from lvspec_eval.measure import dry_run as dr

    code = dr.run(argparse.Namespace(model_args="pretrained=demo,method=vanilla", tasks=tasks,
                                     include_path=str(TASKS_DIR), videos=3))
    return code, capsys.readouterr().out


def test_dry_run_checks_each_moviechat_task_on_its_own_questions(tmp_path, monkeypatch, capsys):
    root = make_root(tmp_path, "moviechat", "authors", monkeypatch)
    tasks = "lvspec_moviechat_global,lvspec_moviechat_breakpoint"
    code, out = dry_run(capsys, tasks)  # global questions have no time, and need none
    assert f"OK    schema moviechat ({tasks})" in out, out
    drop_moviechat_time(root)
    code, out = dry_run(capsys, tasks)
    assert code == 1 and f"FAIL  schema moviechat ({tasks}): 1 of 12 rows" in out
    assert "2.json row breakpoint[1]: missing time" in out


def test_docs_data_shows_every_vdc_vdd_moviechat_layout():
    text = (ROOT / "docs" / "DATA.md").read_text()
    for name in ("vdc", "vdd", "moviechat"):
        for layout in benchmarks.layouts_of(benchmarks.get(name)):
            assert f"- {layout.name}: {layout.source}\n" in text, (name, layout.name)
    assert "vdcscore-per-dimension" in text and "lmms-eval-hub" in text
