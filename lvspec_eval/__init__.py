"""lvspec-eval: speculative decoding for Video-LLMs, as an lmms-eval plugin.

The package's layout is its architecture:
- the engine: decoding/ (one loop, drafters, verifiers, the adaptive policy; runner.py loads a
  target and draft and generates one request at a time) and backends/ (what differs per model family);
- the lmms-eval face: models/ (the `lvspec` model class), tasks/ (the project's tasks), lmms_plugin.py;
- measure/: bench, its prompts, the cost model, sweep, dry-run, `lvspec-eval demo` (demo_run.py);
- reporting/: report (from saved runs only), its pages, plots, policy and divergence sections, check;
- demo/: the offline demo world (scenes, data, tokenizer, models, checkpoints);
- training/: what makes the checkpoints (`lvspec-eval build-demo`, `lvspec-eval train-sparrow`);
- cli.py: the `lvspec-eval` command.

Modules that moved keep working under their old dotted names (MOVED): importing one imports the new
module and warns (DeprecationWarning) with the name to use instead.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

MOVED = {  # old dotted name -> new one
    "lvspec_eval.report": "lvspec_eval.reporting.report",
    "lvspec_eval.report_runs": "lvspec_eval.reporting.runs",
    "lvspec_eval.report_overview": "lvspec_eval.reporting.overview",
    "lvspec_eval.report_html": "lvspec_eval.reporting.page",
    "lvspec_eval.report_plots": "lvspec_eval.reporting.plots",
    "lvspec_eval.report_policy": "lvspec_eval.reporting.policy",
    "lvspec_eval.divergence": "lvspec_eval.reporting.divergence",
    "lvspec_eval.check": "lvspec_eval.reporting.check",
    "lvspec_eval.baseline_run": "lvspec_eval.reporting.baseline_run",
    "lvspec_eval.bench": "lvspec_eval.measure.bench",
    "lvspec_eval.bench_prompts": "lvspec_eval.measure.prompts",
    "lvspec_eval.cost_model": "lvspec_eval.measure.cost_model",
    "lvspec_eval.sweep": "lvspec_eval.measure.sweep",
    "lvspec_eval.dry_run": "lvspec_eval.measure.dry_run",
    "lvspec_eval.runner": "lvspec_eval.decoding.runner",
    "lvspec_eval.decoding.drafters.sparrow_train": "lvspec_eval.training.sparrow",
    "lvspec_eval.demo.train": "lvspec_eval.training.demo",
    "lvspec_eval.demo.build": "lvspec_eval.training.build_demo",
    "lvspec_eval.demo.run": "lvspec_eval.measure.demo_run",
}


class _Alias(importlib.abc.Loader):
    """Loads an old name as the module it moved to (the same object, not a copy)."""

    def __init__(self, new: str) -> None:
        self.new = new
        self._spec = None

    def create_module(self, spec):
        warnings.warn(f"{spec.name} moved to {self.new}: import {self.new} instead", DeprecationWarning, stacklevel=2)
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self._spec  # the import system set the old name's spec on it: restore the real one


class _MovedFinder(importlib.abc.MetaPathFinder):
    """First on sys.meta_path (an editable install's finder may point at another checkout that still
    has the old file), so it answers for a MOVED name only when its parent package has no such file
    (`path`: the parent's __path__, given for a dotted name)."""

    def find_spec(self, fullname, path=None, target=None):
        new = MOVED.get(fullname)
        if new is None or importlib.machinery.PathFinder.find_spec(fullname, path or __path__) is not None:
            return None
        return importlib.util.spec_from_loader(fullname, _Alias(new))


if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedFinder())
