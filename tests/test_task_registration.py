"""The project's tasks ship inside the package and lmms-eval finds them without --include_path.

lvspec_eval.lmms_plugin registers lvspec_eval/tasks/ with lmms-eval's TaskManager when lmms-eval
loads its model entry points; built-in task names (and the user's --include_path) keep precedence.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lvspec_eval import lmms_plugin
from lvspec_eval.demo import tasks_data
from lvspec_eval.tasks import TASKS_DIR

ROOT = Path(__file__).resolve().parent.parent
LMMS_EVAL = Path(sys.executable).parent / "lmms-eval"


def test_project_tasks_come_after_the_given_include_paths():
    ours = TASKS_DIR
    assert lmms_plugin.with_project_tasks(None, ours) == [str(ours)]
    assert lmms_plugin.with_project_tasks("a", ours) == ["a", str(ours)]
    assert lmms_plugin.with_project_tasks(["a", "b"], ours) == ["a", "b", str(ours)]
    # given explicitly (an old command line with --include_path): indexed once, where the user put it
    assert lmms_plugin.with_project_tasks([str(ours), "b"], ours) == [str(ours), "b"]


def test_loading_lmms_eval_models_registers_the_task_folder():
    import lmms_eval.models  # noqa: F401  (builds the model registry, which calls manifests())
    from lmms_eval.tasks import TaskManager

    assert hasattr(TaskManager.initialize_tasks, "__wrapped__"), "the plugin did not register its tasks"
    lmms_plugin.register_tasks()  # a second registration wraps lmms-eval's method, not our wrapper
    assert not hasattr(TaskManager.initialize_tasks.__wrapped__, "__wrapped__")


def test_the_tasks_folder_is_inside_the_package():
    assert TASKS_DIR.parent == Path(lmms_plugin.__file__).parent
    assert (TASKS_DIR / "synthvid" / "synthvid_caption.yaml").is_file()
    assert (TASKS_DIR / "vdc" / "vdc.yaml").is_file() and (TASKS_DIR / "vdd" / "vdd.yaml").is_file()


def write_task(folder: Path, name: str) -> None:
    """A minimal lmms-eval task YAML named `name` (indexing reads only its `task` key)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(f"task: {name}\ndataset_path: json\noutput_type: generate_until\n")


@pytest.mark.slow
def test_builtin_names_and_include_paths_win_over_project_tasks(tmp_path):
    """A project task named like a built-in (videomme) must not shadow it; a --include_path task of
    the same name as ours wins too. A real TaskManager indexes lmms-eval's ~2,000 built-in tasks."""
    import lmms_eval
    from lmms_eval.tasks import TaskManager

    ours, user = tmp_path / "ours", tmp_path / "user"
    for name in ("videomme", "lvspec_probe_only_ours", "lvspec_probe_both"):
        write_task(ours, name)
    write_task(user, "lvspec_probe_both")
    lmms_plugin.register_tasks(ours)
    try:
        index = TaskManager("ERROR", include_path=str(user)).task_index
    finally:
        lmms_plugin.register_tasks()
    assert Path(index["videomme"]["yaml_path"]).is_relative_to(Path(lmms_eval.__file__).parent / "tasks")
    assert Path(index["lvspec_probe_only_ours"]["yaml_path"]).parent == ours
    assert Path(index["lvspec_probe_both"]["yaml_path"]).parent == user


@pytest.mark.slow
def test_headline_command_runs_without_include_path(tmp_path):
    """`lmms-eval --model lvspec --model_args pretrained=demo --tasks synthvid_caption`, as typed in
    the README, from a folder that is not the checkout. lmms-eval exits 0 even when the task is not
    found, so the results file is what counts."""
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           tasks_data.ENV_DIR: str(tmp_path / "data"), tasks_data.ENV_DOCS: "1"}
    cmd = [str(LMMS_EVAL), "--model", "lvspec", "--model_args", "pretrained=demo", "--tasks", "synthvid_caption",
           "--limit", "1", "--output_path", str(tmp_path / "out")]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800, check=False)
    log = proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "Tasks not found" not in proc.stdout + proc.stderr, log
    results = sorted((tmp_path / "out").rglob("*_results.json"))
    assert results, log
    assert "fidelity_f1,none" in json.loads(results[-1].read_text())["results"]["synthvid_caption"]


def tracked_task_files() -> set[str]:
    out = subprocess.run(["git", "ls-files", "lvspec_eval/tasks"], cwd=ROOT, capture_output=True, text=True,
                         check=False)
    if out.returncode != 0 or not out.stdout:
        pytest.skip("not a git checkout")
    return set(out.stdout.split())


@pytest.mark.slow
def test_the_wheel_ships_every_task_file(tmp_path):
    """A non-editable install gets the YAMLs, stub files and utils.py (package data in pyproject)."""
    import zipfile

    expected = tracked_task_files()
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "checkpoints")  # 28 MB of weights, not under test here
    for package in ("lvspec_eval", "judges"):
        shutil.copytree(ROOT / package, src / package, ignore=skip)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w",
                    str(tmp_path / "wheel"), str(src)], check=True, capture_output=True, timeout=600)
    (wheel,) = (tmp_path / "wheel").glob("*.whl")
    shipped = {n for n in zipfile.ZipFile(wheel).namelist() if n.startswith("lvspec_eval/tasks/")}
    assert expected <= shipped, sorted(expected - shipped)
