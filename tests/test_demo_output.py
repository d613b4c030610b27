"""`lvspec-eval demo` and `make demo` leave the checkout clean: their output folder is ignored by
git and holds no tracked file; the committed reference report is refreshed only on request."""
from __future__ import annotations

import argparse
import re
import subprocess
from pathlib import Path

import pytest

from lvspec_eval.measure import demo_run as run

ROOT = Path(__file__).resolve().parent.parent


def git(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=False)
    if proc.returncode not in (0, 1) or "not a git repository" in proc.stderr:
        pytest.skip(f"not a git checkout: {proc.stderr.strip()}")
    return proc


def assert_untracked_and_ignored(folder: str) -> None:
    assert not Path(folder).is_absolute(), folder
    assert git("ls-files", "--", folder).stdout == "", f"{folder} holds tracked files"
    ignored = git("check-ignore", "-q", "--no-index", f"{folder}/leaderboard.md")
    assert ignored.returncode == 0, f"{folder} is not ignored by git"


def demo_out(argv: list[str]) -> str:
    parser = argparse.ArgumentParser()
    run.register(parser.add_subparsers())
    return parser.parse_args(["demo", *argv]).out


def make_target_out(target: str) -> str:
    """The --out of `lvspec-eval demo` in a Makefile target's recipe."""
    recipe = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", (ROOT / "Makefile").read_text(), re.M)
    assert recipe, f"no make target {target}"
    match = re.search(r"lvspec-eval demo\b.*--out (\S+)", recipe.group(1))
    assert match, f"make {target} does not pass --out"
    return match.group(1)


def test_the_default_demo_output_is_ignored_and_untracked():
    assert demo_out([]) == str(run.DEFAULT_OUT)
    assert_untracked_and_ignored(demo_out([]))


def test_make_demo_writes_to_an_ignored_folder():
    assert_untracked_and_ignored(make_target_out("demo"))


def test_the_reference_report_is_refreshed_only_by_its_own_target():
    assert make_target_out("demo-reference") == str(run.REFERENCE_OUT)
    assert git("ls-files", "--", f"{run.REFERENCE_OUT}/summary.json").stdout.strip()  # committed
    assert run.REFERENCE_OUT != run.DEFAULT_OUT


def test_results_files_name_no_folder_of_the_machine(tmp_path):
    """lmms-eval writes our tasks' data files with absolute paths into its results file; the demo
    makes them relative to the install folder (results/demo is committed)."""
    import lvspec_eval

    root = Path(lvspec_eval.__file__).resolve().parent.parent
    data = root / "lvspec_eval" / "tasks" / "synthvid" / "stub_synthvid_caption.jsonl"
    results = tmp_path / "x_results.json"
    results.write_text('{"data_files": {"test": "%s"}, "other": "/elsewhere/file"}' % data)
    run.strip_install_root(results)
    assert results.read_text() == '{"data_files": {"test": "lvspec_eval/tasks/synthvid/stub_synthvid_caption.jsonl"}, ' \
                                   '"other": "/elsewhere/file"}'
