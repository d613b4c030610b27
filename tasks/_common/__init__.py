"""Shared helpers of this project's benchmark tasks (tasks/<benchmark>/utils.py import them).

lmms-eval loads a task's utils.py by file path, so this folder is not importable as a package
from there: each utils.py puts tasks/ on sys.path first and then imports `_common`. Nothing here
calls sys.exit: a sample whose video is missing fails alone, in the model, with the path in its
error (see benchmarks.py).
"""
