"""Video-MME (multiple choice, no subtitles) on a local data root; scored by lmms-eval's own code.

Prompt and scoring are lmms-eval's `videomme` task's (imported, not copied): the same option
prompt and the same fixed post-prompt whatever the model, so numbers compare with lmms-eval's.
What differs: the data root (LVSPEC_VIDEOMME_ROOT, see tasks/_common/benchmarks.py) and a missing
video, which fails its sample in the model instead of exiting the run.
"""

from lvspec_eval.tasks._common import benchmarks
from lvspec_eval.tasks._common.builtin import builtin_utils

BENCH = "videomme"


def process_docs(dataset):
    return benchmarks.process_docs(BENCH, dataset, benchmarks.TASK_FIELDS["lvspec_videomme"])


def doc_to_visual(doc):
    return [benchmarks.video_path(benchmarks.get(BENCH), doc)]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    return builtin_utils("videomme").videomme_doc_to_text(doc, dict(lmms_eval_specific_kwargs or {}))


def process_results(doc, results):
    """{"videomme_perception_score": {..., "score": 0/1}} (lmms-eval's)."""
    return builtin_utils("videomme").videomme_process_results(doc, results)


def aggregate(results):
    """Accuracy in percent, with the per-duration/category breakdown logged (lmms-eval's)."""
    return builtin_utils("videomme").videomme_aggregate_results(results)
