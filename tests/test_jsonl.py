"""One JSON-lines reader for the package (issue 52, item 4): split on b"\\n" only, each line decoded on
its own, an unterminated last line (a killed writer's) skipped with one warning naming the file. Resume,
the stats reader, the report and the judge read through it; `lvspec-eval report` reads a killed run."""
from __future__ import annotations

import json
import logging

import pytest
from test_report import make_runs

from lvspec_eval import cli
from lvspec_eval.models import resume, stats_writer

RECORD = {"doc_id": 0, "answer": "a line\u2028that goes on, 日本語"}  # U+2028: str.splitlines would cut here
WHOLE = json.dumps(RECORD, ensure_ascii=False).encode() + b"\n"
TORN = {  # what a kill leaves at the end of the file
    "mid_json": WHOLE[:20],
    "mid_character": WHOLE[:WHOLE.index("日".encode()) + 1],  # one byte of a 3-byte character
}


@pytest.fixture
def jsonl():
    from lvspec_eval import jsonl

    return jsonl


def _warnings(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and name in r.getMessage()]


@pytest.mark.parametrize("torn", TORN)
def test_a_torn_last_line_is_skipped_with_one_warning(jsonl, tmp_path, caplog, torn):
    path = tmp_path / "stats.jsonl"
    path.write_bytes(WHOLE + WHOLE + TORN[torn])
    with caplog.at_level(logging.WARNING):
        assert jsonl.read_jsonl(path) == [RECORD, RECORD]
    (message,) = _warnings(caplog, str(path))
    assert "incomplete line" in message


def test_complete_files_read_whole_and_silently(jsonl, tmp_path, caplog):
    path = tmp_path / "s.jsonl"
    path.write_bytes(WHOLE + b"\n" + WHOLE)  # a blank line is no record
    with caplog.at_level(logging.WARNING):
        assert jsonl.read_jsonl(path) == [RECORD, RECORD]
        (tmp_path / "empty.jsonl").write_bytes(b"")
        assert jsonl.read_jsonl(tmp_path / "empty.jsonl") == []
    assert caplog.records == []


def test_a_bad_line_inside_the_file_is_an_error_naming_it(jsonl, tmp_path):
    path = tmp_path / "s.jsonl"
    path.write_bytes(WHOLE + b"{not json\n" + WHOLE)
    with pytest.raises(ValueError, match=r"s\.jsonl:2: not JSON"):
        jsonl.read_jsonl(path)
    path.write_bytes(WHOLE + b"\xe6\x97\n" + WHOLE)  # a cut character inside the file is damage, not a kill
    with pytest.raises(ValueError, match=r"s\.jsonl:2: not UTF-8"):
        jsonl.read_jsonl(path)


@pytest.mark.parametrize("torn", TORN)
def test_resume_and_the_stats_reader_skip_a_torn_line(tmp_path, torn):
    path = tmp_path / "stats.jsonl"
    path.write_bytes(WHOLE + TORN[torn])
    assert stats_writer.read_lines(path) == [WHOLE.decode().rstrip("\n")]
    assert resume.read_records(path) == [(1, RECORD)]


@pytest.mark.parametrize("torn", TORN)
def test_the_judge_reads_a_torn_samples_file(tmp_path, torn):
    from judges import cli as judge_cli

    sample = {"doc_id": 3, "target": "a red ball", "filtered_resps": ["a red\u2028ball 日本"], "input": "q"}
    path = tmp_path / "20250101_samples_demo_cap.jsonl"
    line = json.dumps(sample, ensure_ascii=False).encode()
    path.write_bytes(line + b"\n" + line[:line.index("日".encode()) + 1] if torn == "mid_character"
                     else line + b"\n" + line[:20])
    (item,) = judge_cli.read_samples(path)
    assert item.key == "demo_cap/3" and item.caption == "a red\u2028ball 日本"


@pytest.mark.parametrize("torn", TORN)
def test_report_reads_a_killed_runs_stats_with_one_warning(tmp_path, torn, capsys):
    runs = make_runs(tmp_path)
    for stats in (tmp_path / "stats_shared.jsonl", runs[1] / "stats_sd.jsonl"):
        with stats.open("ab") as f:  # a writer killed in its last record
            f.write(TORN[torn])
    out = tmp_path / "out"
    assert cli.main(["report", *map(str, runs), "-o", str(out), "--n-boot", "50", "--no-plots"]) == 0
    warnings = json.loads((out / "summary.json").read_text())["warnings"]
    for stats in (tmp_path / "stats_shared.jsonl", runs[1] / "stats_sd.jsonl"):
        named = [w for w in warnings if str(stats) in w]
        assert len(named) == 1 and "incomplete line" in named[0], warnings
    assert "incomplete line" in capsys.readouterr().err


def test_sparrow_data_generation_resumes_a_file_a_kill_tore(tmp_path, monkeypatch):
    """train-sparrow appends the target's answers as they come and reruns from the file: a torn last
    line is no record (asked again), and is cut so that the next line is not glued to it."""
    from types import SimpleNamespace

    from lvspec_eval import jsonl
    from lvspec_eval.training import sparrow as sparrow_train

    tasks = [{"key": f"k{i}"} for i in range(3)]
    asked = []
    monkeypatch.setattr(sparrow_train, "task_list", lambda args: tasks)
    monkeypatch.setattr(sparrow_train, "answer_chunk",
                        lambda backend, chunk, args: asked.extend(t["key"] for t in chunk) or [{"answer": [1]}] * len(chunk))
    path = tmp_path / "data.jsonl"
    path.write_bytes(json.dumps({"key": "k0", "answer": [1]}).encode() + b'\n{"key": "k1", "ans')
    records = sparrow_train.generate_data(None, SimpleNamespace(gen_batch=2), path)
    assert [r["key"] for r in records] == ["k0", "k1", "k2"] and asked == ["k1", "k2"]
    assert [r["key"] for r in jsonl.read_jsonl(path)] == ["k0", "k1", "k2"]
