"""lmms-eval entry point (group `lmms_eval.models`, declared in pyproject.toml).

lmms-eval 0.7.3 calls `manifests()` when it builds its model registry, so `--model lvspec`
resolves to the chat class (or to the simple class with --force_simple). Only class paths are
named here: importing torch and the model code waits until the model is actually chosen.
"""
from __future__ import annotations

from lmms_eval.models.registry_v2 import ModelManifest


def manifests() -> list[ModelManifest]:
    return [ModelManifest(
        model_id="lvspec",
        chat_class_path="lvspec_eval.models.lvspec.LVSpecChat",
        simple_class_path="lvspec_eval.models.lvspec.LVSpecSimple",
    )]
