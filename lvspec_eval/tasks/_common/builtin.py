"""lmms-eval's built-in task modules, imported for their scoring functions and prompt lists.

Several of them read os.environ["HF_HOME"] at import time and raise KeyError when it is unset;
we import them with HF_HOME defaulted to lmms-eval's own default for the duration of the import.
"""
from __future__ import annotations

import importlib
import os
import sys
from types import ModuleType

DEFAULT_HF_HOME = "~/.cache/huggingface"


def builtin_utils(task_dir: str) -> ModuleType:
    """lmms_eval.tasks.<task_dir>.utils (e.g. "videomme", "vdc", "mvbench")."""
    name = f"lmms_eval.tasks.{task_dir}.utils"
    if name in sys.modules:
        return sys.modules[name]
    added = "HF_HOME" not in os.environ
    if added:
        os.environ["HF_HOME"] = os.path.expanduser(DEFAULT_HF_HOME)
    try:
        return importlib.import_module(name)
    finally:
        if added:
            os.environ.pop("HF_HOME", None)


def builtin_task_file(task_dir: str, name: str) -> str:
    """The text of lmms_eval/tasks/<task_dir>/<name> (a task YAML), read without importing anything."""
    import importlib.util

    spec = importlib.util.find_spec("lmms_eval")
    with open(os.path.join(os.path.dirname(spec.origin), "tasks", task_dir, name), encoding="utf-8") as f:
        return f.read()


def builtin_constant(task_dir: str, name: str):
    """A literal constant (e.g. a prompt list) of lmms_eval/tasks/<task_dir>/utils.py, read from
    its source without running it: some of those modules cannot be imported here (VDC's applies
    an sglang decorator at import time and fails without sglang)."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec("lmms_eval")
    path = os.path.join(os.path.dirname(spec.origin), "tasks", task_dir, "utils.py")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), filename=path)
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return ast.literal_eval(node.value)
    raise ValueError(f"{path} defines no literal {name!r}")
