"""This project's lmms-eval tasks (one folder per benchmark: YAMLs + utils.py), shipped with the
package. lvspec_eval.lmms_plugin registers this folder with lmms-eval's TaskManager when
lmms-eval loads its model entry points, so `--tasks vdc` needs no --include_path.

TASKS_DIR is the folder to give lmms-eval (or `--include_path`) when it is not loaded that way.
"""
from pathlib import Path

TASKS_DIR = Path(__file__).resolve().parent
