"""MLVU (dev split, multiple choice), prompted and scored per sample by lmms-eval's `mlvu_dev` code.

The doc's question lists its options (the authors' `candidates` are written into it at load,
tasks/_common/layouts/mlvu.py); the fixed post-prompt is lmms-eval's. lmms-eval's per-sample value
has no numeric score, so we add "score" (1 when the parsed letter is the answer) for the report's
paired statistics.

The aggregate is the mean of the per-task-type accuracies (M-Avg, as the authors report it) over
the seven multiple-choice task types. It equals lmms-eval's mlvu_aggregate_results_dev when every
type has samples; ours averages over the types present, where lmms-eval's counts an absent type as
0% (so a --limit run there reports a fraction of the real mean), and ours raises on a task type it
does not know instead of a KeyError deep in the aggregation. The open-ended task types (sub_scene,
summary) are generation tasks judged by a GPT model in the authors' scripts: not part of this task.
"""

from loguru import logger

from lvspec_eval.tasks._common import benchmarks
from lvspec_eval.tasks._common.builtin import builtin_utils
from lvspec_eval.tasks._common.layouts.mlvu import TASK_TYPES

BENCH = "mlvu"
TASK = "lvspec_mlvu"


def process_docs(dataset):
    return benchmarks.process_docs(BENCH, dataset, benchmarks.TASK_FIELDS[TASK], benchmarks.TASK_RULES[TASK])


def doc_to_visual(doc):
    return [benchmarks.video_path(benchmarks.get(BENCH), doc)]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    return builtin_utils("mlvu").mlvu_doc_to_text(doc, dict(lmms_eval_specific_kwargs or {}))


def process_results(doc, results):
    out = builtin_utils("mlvu").mlvu_process_results(doc, results)
    value = out["mlvu_percetion_score"]
    value["score"] = float(value["pred_answer"] == value["answer"])
    return out


def aggregate(results):
    """Mean over the task types present of their accuracy in percent."""
    by_type: dict[str, list[float]] = {}
    for r in results:
        if r["task_type"] not in TASK_TYPES:
            raise ValueError(f"mlvu: task_type {r['task_type']!r} is not a multiple-choice type; expected one of "
                             f"{', '.join(TASK_TYPES)}")
        by_type.setdefault(r["task_type"], []).append(float(r["pred_answer"] == r["answer"]))
    accuracy = {t: 100 * sum(v) / len(v) for t, v in by_type.items()}
    logger.info("mlvu accuracy per task type: " + ", ".join(f"{t} {a:.1f}%" for t, a in sorted(accuracy.items())))
    return sum(accuracy.values()) / len(accuracy) if accuracy else 0.0
