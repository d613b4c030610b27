"""Per-model prompt variants, as lmms-eval's own tasks give them.

lmms-eval gives a task's doc_to_text the task's lmms_eval_specific_kwargs[<--model name>], else its
"default" entry. Under `--model lvspec` the name is never a family's, so a Qwen3-VL checkpoint
would get the default prompt where `--model qwen3_vl` gets the `qwen3_vl` one (Video-MME). The
lvspec model therefore names, in LVSPEC_PROMPT_VARIANT, the lmms-eval model whose prompts the run
gets (its model_arg prompt_variant: auto = the family's class, models/parity.py), and a task with
variants looks that name up in lmms-eval's own task YAML. A task YAML of ours may also carry
`<model>: {variant: <model>}` entries, so that lmms-eval's own class run on our task (a baseline
run) gets the same variant.
"""
from __future__ import annotations

import functools
import os

import yaml

from .builtin import builtin_task_file

PROMPT_VARIANT_VAR = "LVSPEC_PROMPT_VARIANT"  # set by models/lvspec.py (models/parity.py, same name)
DEFAULT = "default"


def variant_name(kwargs: dict) -> str:
    """The variant asked for: the task YAML's `variant` entry, else the lvspec model's, else default."""
    return str(kwargs.get("variant") or os.environ.get(PROMPT_VARIANT_VAR, "").strip() or DEFAULT)


@functools.cache
def builtin_variants(task_dir: str, yaml_name: str) -> dict:
    """lmms-eval's lmms_eval_specific_kwargs of one of its task YAMLs (`!function` lines left out)."""
    text = builtin_task_file(task_dir, yaml_name)
    config = yaml.safe_load("\n".join(line for line in text.splitlines() if "!function" not in line))
    return config.get("lmms_eval_specific_kwargs") or {}


def variant_kwargs(task_dir: str, yaml_name: str, kwargs: dict | None) -> dict:
    """The prompt kwargs for this run: lmms-eval's entry for the variant when its task has one, else
    the kwargs lmms-eval passed (our YAML's default, which is lmms-eval's)."""
    kwargs = dict(kwargs or {})
    name = variant_name(kwargs)
    table = builtin_variants(task_dir, yaml_name)
    if name != DEFAULT and name in table:
        return dict(table[name])
    kwargs.pop("variant", None)
    return kwargs
