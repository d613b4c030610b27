"""Shared helpers of this project's benchmark tasks (tasks/<benchmark>/utils.py import them).

lmms-eval loads a task's utils.py by file path (as a module named `utils`, outside any package),
so each utils.py imports these helpers by their absolute name, `lvspec_eval.tasks._common`.
Nothing here calls sys.exit: a sample whose video is missing fails alone, in the model, with the
path in its error (see benchmarks.py).
"""
