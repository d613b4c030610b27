"""MVBench: the 20 sub-tasks in one task (a `sub_task` field per row), scored by lmms-eval's code.

One task instead of lmms-eval's group of 20: the same docs, prompts and per-sample scoring, one
row in the report, and the overall accuracy equals the mean over sub-tasks (each has 200 QAs).
Each logged sample carries its sub_task for a per-sub-task breakdown. Videos are found as the
built-in task finds them (its DATA_LIST folder per sub-task, data0613/ as a second place);
episodic_reasoning's videos are frame folders, which the lvspec model cannot read: those samples
fail with a recorded error.
Note (lmms-eval's aggregation, kept for comparability): a sample answered with an empty string
is left out of mvbench_accuracy; the per-sample scores (what the report reads) count it as wrong.
"""

from lvspec_eval.tasks._common import benchmarks
from lvspec_eval.tasks._common.builtin import builtin_utils

BENCH = "mvbench"
TASK = "lvspec_mvbench"


def process_docs(dataset):
    return benchmarks.process_docs(BENCH, dataset, benchmarks.TASK_FIELDS[TASK], benchmarks.TASK_RULES[TASK])


def doc_to_visual(doc):
    return [benchmarks.video_path(benchmarks.get(BENCH), doc)]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    return builtin_utils("mvbench").mvbench_doc_to_text(doc, dict(lmms_eval_specific_kwargs or {}))


def process_results(doc, results):
    out = builtin_utils("mvbench").mvbench_process_results(doc, results)
    out["mvbench_accuracy"]["sub_task"] = doc["sub_task"]
    return out


def aggregate(results):
    return builtin_utils("mvbench").mvbench_aggregate_results(results)
