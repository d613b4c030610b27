"""Video-MME (multiple choice, no subtitles) on a local data root; scored by lmms-eval's own code.

Prompt and scoring are lmms-eval's `videomme` task's (imported, not copied): the same option
prompt and post-prompt lmms-eval's videomme gives the model's family (its `qwen3_vl` variant for a
Qwen3-VL checkpoint, the default otherwise; model_arg prompt_variant picks another), so numbers
compare with lmms-eval's own class's.
What differs: the data root (LVSPEC_VIDEOMME_ROOT, see tasks/_common/benchmarks.py) and a missing
video, which fails its sample in the model instead of exiting the run.
"""

from lvspec_eval.tasks._common import benchmarks, prompts
from lvspec_eval.tasks._common.builtin import builtin_utils

BENCH = "videomme"
TASK = "lvspec_videomme"


def process_docs(dataset):
    return benchmarks.process_docs(BENCH, dataset, benchmarks.TASK_FIELDS[TASK], benchmarks.TASK_RULES[TASK])


def doc_to_visual(doc):
    return [benchmarks.video_path(benchmarks.get(BENCH), doc)]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    """lmms-eval's prompt, in the variant lmms-eval's videomme gives the run's model family
    (tasks/_common/prompts.py: Qwen3-VL's `qwen3_vl`, else the default)."""
    kwargs = prompts.variant_kwargs("videomme", "videomme.yaml", lmms_eval_specific_kwargs)
    return builtin_utils("videomme").videomme_doc_to_text(doc, kwargs)


def process_results(doc, results):
    """{"videomme_perception_score": {..., "score": 0/1}} (lmms-eval's)."""
    return builtin_utils("videomme").videomme_process_results(doc, results)


def aggregate(results):
    """Accuracy in percent, with the per-duration/category breakdown logged (lmms-eval's)."""
    return builtin_utils("videomme").videomme_aggregate_results(results)
