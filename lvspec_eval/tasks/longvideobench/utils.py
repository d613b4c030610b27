"""LongVideoBench (validation, video only, no interleaved subtitles), multiple choice.

Prompt layout as lmms-eval's `longvideobench_val_v` (question, "A. option" lines, the fixed
post-prompt). Options are the authors' `candidates` list; rows of the hub layout (option0..4,
"N/A" for unused ones) are converted to it at load (tasks/_common/layouts/longvideobench.py).
Scoring is ours, for two reasons: lmms-eval's module imports decord (not installed here), and its parser answers a random letter when it cannot read the reply, so two runs of the
same outputs could score differently. Ours is deterministic: an unreadable reply is wrong.
lvb_acc is the accuracy as a fraction (lmms-eval's "Overall" acc).
"""

from lvspec_eval.tasks._common import benchmarks, metrics
from lvspec_eval.tasks._common.schema import SchemaError

BENCH = "longvideobench"
TASK = "lvspec_longvideobench"


def options(doc) -> list[str]:
    """The doc's option texts (`candidates`; the hub's option0..4 columns are converted at load)."""
    found = list(doc.get("candidates") or [])
    if not found:  # process_docs rejects such rows; this guards a doc that bypassed it
        raise SchemaError(f"longvideobench: doc {doc.get('id')!r} has no options (candidates): a multiple-"
                          "choice prompt without its options is never sent")
    return found


def letters(doc) -> list[str]:
    return [chr(ord("A") + i) for i in range(len(options(doc)))]


def process_docs(dataset):
    return benchmarks.process_docs(BENCH, dataset, benchmarks.TASK_FIELDS[TASK], benchmarks.TASK_RULES[TASK])


def doc_to_visual(doc):
    return [benchmarks.video_path(benchmarks.get(BENCH), doc)]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    kwargs = lmms_eval_specific_kwargs or {}
    lines = [f"{letter}. {option}" for letter, option in zip(letters(doc), options(doc))]
    question = doc["question"] + "\n" + "\n".join(lines)
    return f"{kwargs.get('pre_prompt', '')}{question}\n{kwargs.get('post_prompt', '')}"


def process_results(doc, results):
    parsed = metrics.parse_choice(results[0], letters(doc))
    answer = chr(ord("A") + int(doc["correct_choice"]))
    return {"lvb_acc": {"id": doc["id"], "duration_group": doc["duration_group"],
                        "question_category": doc["question_category"], "answer": answer,
                        "parsed_pred": parsed, "score": float(parsed == answer)}}


def aggregate(results):
    return metrics.accuracy(results)
