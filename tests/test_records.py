"""Records that say what decided them (models/resume.py): the request key covers the video files and
the frame rule, the settings carry the machine, each record carries the CPU kernel choices the run made
under its load (`load`, not a resume key), and a resume on another machine is refused unless model_arg
resume_any_machine=true, while a resume on the same machine under another load is served."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_plugin import GEN, TASK, chat_request, docs, make_model, read_jsonl
from test_resume import answered_first, counting_generate, through_response_cache

from lvspec_eval.backends import host
from lvspec_eval.backends import linear_kernels as lk
from lvspec_eval.models import lvspec, resume
from lvspec_eval.models.resume import ResumeMismatch

from test_failures import synthvid, tiny_model  # noqa: F401  (the same module fixtures: a tiny model, 3 docs)


def another_machine(monkeypatch, **changes):
    """Make this process look like another machine to the model class built next."""
    real = resume.machine_settings

    def machine_settings():
        return {**real(), **changes}

    monkeypatch.setattr(lvspec, "machine_settings", machine_settings)


def test_records_carry_the_machine_the_kernels_and_the_frames(tiny_model, synthvid, tmp_path):
    stats = tmp_path / "stats.jsonl"
    answered_first(tiny_model, synthvid, stats)
    record = read_jsonl(stats)[0]
    settings = record["settings"]
    for key in ("machine.cpu", "machine.cpu_flags", "machine.cores", "machine.threads", "machine.gpus",
                "machine.torch", "machine.transformers"):
        assert key in settings
    assert not [key for key in settings if key.startswith("kernels.")]  # the load's choices: not a resume key
    assert {"kernels.pretrained", "kernels.draft", "packed_mb.pretrained", "packed_mb.draft"} <= set(record["load"])
    assert settings["machine.cores"] >= 1 and settings["machine.torch"]
    assert record["frames"] and all(isinstance(i, int) for i in record["frames"][0])


@pytest.mark.parametrize("changes", [{"machine.cpu": "Another CPU"}, {"machine.threads": 64},
                                     {"machine.transformers": "4.0.0"}])
def test_a_resume_on_another_machine_is_refused_unless_asked_for(changes, monkeypatch, tiny_model, synthvid, tmp_path):
    stats = tmp_path / "stats.jsonl"
    first = answered_first(tiny_model, synthvid, stats)
    another_machine(monkeypatch, **changes)
    key = next(iter(changes))
    refused = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4)
    refused.task_dict = first.task_dict
    with pytest.raises(ResumeMismatch, match=f"made on another machine: {key}=.*resume_any_machine=true"):
        through_response_cache(refused, [chat_request(0, GEN)], tmp_path / "cache")

    accepted = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4, resume_any_machine=True)
    accepted.task_dict = first.task_dict
    decodes = counting_generate(accepted)
    results = through_response_cache(accepted, [chat_request(i, GEN) for i in range(2)], tmp_path / "cache2")
    records = read_jsonl(stats)
    assert len(decodes) == 1 and [r["doc_id"] for r in records] == [0, 1]  # doc 0 served, doc 1 decoded here
    assert results[0].text == records[0]["text"]
    assert records[0]["settings"][key] != records[1]["settings"][key]  # each record says where it was made


def test_other_settings_are_refused_even_with_resume_any_machine(tiny_model, synthvid, tmp_path):
    stats = tmp_path / "stats.jsonl"
    first = answered_first(tiny_model, synthvid, stats)
    other = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4, resume_any_machine=True,
                       method="sd_tree")
    other.task_dict = first.task_dict
    with pytest.raises(ResumeMismatch, match="made under other settings: method="):
        through_response_cache(other, [chat_request(0, GEN)], tmp_path / "cache")


def test_a_record_for_another_video_is_never_reused(tiny_model, synthvid, tmp_path):
    """Same doc id, same text and kwargs (as in vdc, where every doc sends one instruction): only the
    video differs, and the record is not served for it."""
    stats = tmp_path / "stats.jsonl"
    first = answered_first(tiny_model, synthvid, stats)
    task_docs = docs(synthvid)
    again = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4)
    again.task_dict = {TASK: {"test": [{**task_docs[0], "video": task_docs[1]["video"]}, *task_docs[1:]]}}
    with pytest.raises(ResumeMismatch, match="doc 0 was answered for another request .*video files"):
        through_response_cache(again, [chat_request(0, GEN)], tmp_path / "cache")
    assert first.task_dict[TASK]["test"][0]["video"] == task_docs[0]["video"]


def test_the_video_key_follows_the_content_not_the_folder(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir(), b.mkdir()
    (a / "v.mp4").write_bytes(b"\x01" * 1000)
    shutil.copy(a / "v.mp4", b / "v.mp4")
    assert resume.video_fingerprint(str(a / "v.mp4")) == resume.video_fingerprint(str(b / "v.mp4"))
    (b / "v.mp4").write_bytes(b"\x01" * 999 + b"\x02")
    assert resume.video_fingerprint(str(a / "v.mp4")) != resume.video_fingerprint(str(b / "v.mp4"))
    assert "unreadable" in resume.video_fingerprint(str(tmp_path / "missing.mp4"))
    key = resume.request_key("describe", {"max_new_tokens": 4}, (resume.video_fingerprint(str(a / "v.mp4")),), "fps 2")
    assert key != resume.request_key("describe", {"max_new_tokens": 4}, (), "fps 2")
    assert key != resume.request_key("describe", {"max_new_tokens": 4}, (resume.video_fingerprint(str(a / "v.mp4")),),
                                     "fps 1")


def test_the_report_flags_records_from_more_than_one_machine(caplog):
    from lvspec_eval.reporting import report
    from lvspec_eval.reporting.runs import TaskRun

    def run(method: str, cpus: list[str]) -> TaskRun:
        stats = {str(i): {"settings": {"machine.cpu": cpu, "machine.threads": 2, "kernels.draft": method}}
                 for i, cpu in enumerate(cpus)}
        return TaskRun(method, "t", ("m",), {}, stats, Path("x"), True)

    one = {("t", "vanilla"): run("vanilla", ["A", "A"]), ("t", "sd_tree"): run("sd_tree", ["A"])}
    with caplog.at_level("WARNING"):
        report.warn_machines(one)  # other kernels for another draft: the same machine
    assert "machines" not in caplog.text
    two = {**one, ("t", "sd_tree"): run("sd_tree", ["A", "B"])}  # resumed on another machine
    with caplog.at_level("WARNING"):
        report.warn_machines(two)
    assert "the records come from 2 machines" in caplog.text and "B, 2: sd_tree/t" in caplog.text


def onednn_wins(monkeypatch, kernel_cache):
    """Every shape measures a prepacked copy 10x faster than nn.Linear (no timing taken): where the
    allowance lets it, the kernels choose it."""
    monkeypatch.setattr(lk, "measure", lambda w, b, onednn: lk.ShapeCurve(
        {m: 10.0 for m in lk.ROWS}, {m: 1.0 for m in lk.ROWS} if onednn else {}))


def hold_the_budget(process: subprocess.Popen, folder: Path | None = None) -> None:
    """The ledger (in the kernel cache `folder`) as another lvspec process leaves it while it holds
    every byte of the kernel budget."""
    big = 1 << 50
    book = {"budget": big, "pids": {str(process.pid): big}, "owners": {str(process.pid): host.process_identity(process.pid)}}
    ((folder or lk.cache_dir()) / "packed_ledger.json").write_text(json.dumps(book))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN: nothing is prepacked")
def test_a_resume_on_the_same_machine_while_another_process_holds_the_kernel_budget_is_served(
        monkeypatch, kernel_cache, tiny_model, synthvid, tmp_path):
    """The kernel allowance is 0 on the rerun (another process holds the budget), so the target's
    prepacked kernels are dropped and its kernel choices differ from the first run's: the same machine
    all the same, and the record is served; each record says what its run chose."""
    onednn_wins(monkeypatch, kernel_cache)
    stats = tmp_path / "stats.jsonl"
    first = answered_first(tiny_model, synthvid, stats)
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"]) as other:
        try:
            hold_the_budget(other)
            again = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4)
            again.task_dict = first.task_dict
            decodes = counting_generate(again)
            results = through_response_cache(again, [chat_request(i, GEN) for i in range(2)], tmp_path / "cache")
        finally:
            other.kill()
    records = read_jsonl(stats)
    assert len(decodes) == 1 and [r["doc_id"] for r in records] == [0, 1]  # doc 0 served from its record
    assert results[0].text == records[0]["text"]
    assert records[0]["settings"] == records[1]["settings"]
    assert records[0]["load"]["packed_mb.pretrained"] > 0 and not records[1]["load"]["packed_mb.pretrained"]
    assert records[0]["load"]["kernels.pretrained"] != records[1]["load"]["kernels.pretrained"]


def test_records_of_an_older_version_with_kernel_fingerprints_in_their_settings_resume(tiny_model, synthvid, tmp_path):
    """Records written while kernels.* were resume keys (other choices under another load) resume."""
    stats = tmp_path / "stats.jsonl"
    first = answered_first(tiny_model, synthvid, stats)
    (record,) = read_jsonl(stats)
    record["settings"]["kernels.pretrained"] = "0123456789abcdef"
    stats.write_text(json.dumps(record) + "\n")
    again = make_model("LVSpecChat", tiny_model, stats, max_new_tokens=4)
    again.task_dict = first.task_dict
    decodes = counting_generate(again)
    through_response_cache(again, [chat_request(i, GEN) for i in range(2)], tmp_path / "cache")
    assert len(decodes) == 1


def test_the_report_says_when_a_runs_records_ran_under_other_kernel_choices(caplog):
    from lvspec_eval.reporting import report
    from lvspec_eval.reporting.runs import TaskRun

    def run(method: str, loads: list[str]) -> TaskRun:
        stats = {str(i): {"settings": {"machine.cpu": "A"}, "load": {"kernels.pretrained": fp, "packed_mb.pretrained": 1.0}}
                 for i, fp in enumerate(loads)}
        return TaskRun(method, "t", ("m",), {}, stats, Path("x"), True)

    runs = {("t", "vanilla"): run("vanilla", ["a", "a"]), ("t", "sd_tree"): run("sd_tree", ["a", "b", "b"])}
    with caplog.at_level("WARNING"):
        report.warn_machines(runs)
        report.note_load_choices(runs)
    assert "machines" not in caplog.text  # one machine
    assert "sd_tree/t: its records ran under 2 kernel choices" in caplog.text and "vanilla/t" not in caplog.text
