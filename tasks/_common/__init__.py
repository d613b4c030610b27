"""Shared helpers of this project's benchmark tasks (tasks/<benchmark>/utils.py import them).

lmms-eval loads a task's utils.py by file path, so these helpers are not reachable as a package
from there: each utils.py puts tasks/ on sys.path and imports `_common` (see `tasks/README` in
docs/GPU.md). Nothing here calls sys.exit: a sample whose video is missing fails alone, in the
model, with the path in its error.
"""
