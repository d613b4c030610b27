"""VideoDetailDescription (VDD, Video-ChatGPT's 499 detailed-description questions).

The question is the doc's own (fixed per sample, as in lmms-eval's `video_dc499`); the caption is
judged by this project's judges/ in mode "detail" (detail orientation, 0-5) instead of the
built-in task's direct requests to OpenAI. A missing judgment is None, not 0.

Layouts (tasks/_common/layouts/vdd.py): Video-ChatGPT's own generic_qa.json (`video_name, Q, A`, the
questions its detail-orientation evaluation asks) or a snapshot of lmms-eval's hub dataset
(`video_name, question, answer`); both become the fields below.
"""

from lvspec_eval.tasks._common import benchmarks, judge, metrics

BENCH = "vdd"


def process_docs(dataset):
    return benchmarks.process_docs(BENCH, dataset, benchmarks.TASK_FIELDS["vdd"])


def doc_to_visual(doc):
    return [benchmarks.video_path(benchmarks.get(BENCH), doc)]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    kwargs = lmms_eval_specific_kwargs or {}
    return f"{kwargs.get('pre_prompt', '')}{doc['question']}{kwargs.get('post_prompt', '')}"


def process_results(doc, results):
    caption = results[0]
    result = judge.score_caption("detail", f"vdd/{doc['video_name']}", caption, doc["answer"], doc["question"])
    return {"detail_score": judge.judged(result["score"], result["error"], video_name=doc["video_name"])}


def aggregate(results):
    """Mean detail score (0-5) over judged samples."""
    return metrics.mean_judged(results)


def process_results_facts(doc, results):
    """vdd_facts: fact F1 of the caption against the reference answer (judge mode facts), 0-5."""
    result = judge.score_caption("facts", f"vdd/{doc['video_name']}", results[0], doc["answer"], doc["question"])
    return {"facts_score": judge.judged(result["score"], result["error"], video_name=doc["video_name"])}
