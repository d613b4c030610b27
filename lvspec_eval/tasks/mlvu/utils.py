"""MLVU (dev split, multiple choice), scored by lmms-eval's `mlvu_dev` code.

The doc's question already lists its options; the fixed post-prompt is lmms-eval's. lmms-eval's
per-sample value has no numeric score, so we add "score" (1 when the parsed letter is the answer)
for the report's paired statistics; the aggregate is lmms-eval's (mean accuracy over task types).
"""

from lvspec_eval.tasks._common import benchmarks
from lvspec_eval.tasks._common.builtin import builtin_utils

BENCH = "mlvu"


def process_docs(dataset):
    return benchmarks.process_docs(BENCH, dataset, benchmarks.TASK_FIELDS["lvspec_mlvu"])


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
    return builtin_utils("mlvu").mlvu_aggregate_results_dev(results)
