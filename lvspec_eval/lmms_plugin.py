"""lmms-eval entry point (group `lmms_eval.models`, declared in pyproject.toml).

lmms-eval 0.7.3 calls `manifests()` when it builds its model registry, so `--model lvspec`
resolves to the chat class (or to the simple class with --force_simple). Only class paths are
named here: torch and the model code load when the model is actually chosen.

lmms-eval has no entry point for tasks, but the model registry is built while `lmms_eval.models`
is imported, and its CLI imports that module (through lmms_eval.evaluator) before it builds its
TaskManager. So `manifests()` also registers this package's task folder (lvspec_eval/tasks/) with
TaskManager: `--tasks vdc` works without --include_path. The folder is indexed after lmms-eval's
own tasks and after any --include_path, and lmms-eval keeps the first-indexed task of a name, so
built-in names (and the user's own folders) win on a collision.

ModelManifest is imported inside the function on purpose: importing lmms_eval.models builds the
registry, which loads this module; a module-level import would make that load circular (and
lmms-eval would silently drop the plugin) whenever this module is imported first.
"""
from __future__ import annotations

import functools
from pathlib import Path

from lvspec_eval.tasks import TASKS_DIR


def manifests() -> list:
    from lmms_eval.models.registry_v2 import ModelManifest

    register_tasks()
    return [ModelManifest(
        model_id="lvspec",
        chat_class_path="lvspec_eval.models.lvspec.LVSpecChat",
        simple_class_path="lvspec_eval.models.lvspec.LVSpecSimple",
    )]


def with_project_tasks(include_path: str | list | None, tasks_dir: Path) -> list[str]:
    """The include paths lmms-eval was given, then `tasks_dir` (once): indexed last, it loses
    every name collision."""
    paths = [include_path] if isinstance(include_path, (str, Path)) else list(include_path or [])
    paths = [str(p) for p in paths]
    resolved = {str(Path(p).resolve()) for p in paths}
    if str(tasks_dir.resolve()) not in resolved:
        paths.append(str(tasks_dir))
    return paths


def register_tasks(tasks_dir: Path | None = None) -> None:
    """Make every lmms-eval TaskManager index `tasks_dir` (default: this package's tasks) too.

    Wraps TaskManager.initialize_tasks once per process; a later call only changes the folder
    (the tests point it at a scratch folder)."""
    from lmms_eval.tasks import TaskManager

    current = TaskManager.initialize_tasks
    original = getattr(current, "__wrapped__", current)

    @functools.wraps(original)
    def initialize_tasks(self, include_path=None, include_defaults=True):
        paths = with_project_tasks(include_path, tasks_dir or TASKS_DIR)
        return original(self, include_path=paths, include_defaults=include_defaults)

    TaskManager.initialize_tasks = initialize_tasks
