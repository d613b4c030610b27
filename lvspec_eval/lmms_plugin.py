"""lmms-eval entry point (group `lmms_eval.models`, declared in pyproject.toml).

lmms-eval 0.7.3 calls `manifests()` when it builds its model registry, so `--model lvspec`
resolves to the chat class (or to the simple class with --force_simple). Only class paths are
named here: torch and the model code load when the model is actually chosen.

ModelManifest is imported inside the function on purpose: importing lmms_eval.models builds the
registry, which loads this module; a module-level import would make that load circular (and
lmms-eval would silently drop the plugin) whenever this module is imported first.
"""
from __future__ import annotations


def manifests() -> list:
    from lmms_eval.models.registry_v2 import ModelManifest

    return [ModelManifest(
        model_id="lvspec",
        chat_class_path="lvspec_eval.models.lvspec.LVSpecChat",
        simple_class_path="lvspec_eval.models.lvspec.LVSpecSimple",
    )]
