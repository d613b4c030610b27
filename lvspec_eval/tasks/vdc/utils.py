"""VDC (video detailed captions), five dimensions, judged by this project's judges/ (VDCscore).

Which questions judge a dimension (tasks/_common/layouts/vdc.py reads the layouts):
- "vdcscore-per-dimension": AuroraCap's per-dimension QA files (or the hub snapshot's per-dimension
  parquet folders): task vdc_<dimension> asks only its dimension's rows, each judged against that
  dimension's own questions and reference caption, as the official VDCscore (AuroraCap's post_eval) does.
- "lmms-eval-hub": rows that do not say their dimension (the hub rows as lmms-eval loads them, all
  five folders merged into one split): every dimension task asks every row, each judged against its
  own qa_list, as lmms-eval's VDC tasks do.
The protocol is logged with every sample ("vdc_protocol", and in each metric's dict) and shown in
the report beside the metric.

lmms-eval's VDC tasks pick a random instruction per sample and judge with an sglang server
(CUDA only). Ours ask each dimension's first (canonical) instruction from lmms-eval's own lists
(read from its source: the module cannot be imported without sglang), every time, and judge
through judges.client in mode "vdc": the judge answers each reference
question from the caption alone, then marks the answer (yes/no and 0-5). vdc_score is the mean
mark (0-5), vdc_acc the share of "yes", both per sample and averaged, as VDCscore reports them.
The reference questions are logged with each sample (qa_list) so `lvspec-eval judge --mode vdc`
can score a run again later.
"""

from lvspec_eval.tasks._common import benchmarks, judge, metrics
from lvspec_eval.tasks._common.builtin import builtin_constant
from lvspec_eval.tasks._common.layouts import vdc

BENCH = "vdc"
# dimension -> lmms-eval's list of instructions for it (we always ask entry `prompt_index`)
PROMPT_LISTS = {
    "detailed": "DETAILED_CAPTION_PROMPTS",
    "camera": "CAMERA_CAPTION_PROMPTS",
    "short": "SHORT_CAPTION_PROMPTS",
    "background": "BACKGROUND_CAPTION_PROMPTS",
    "main_object": "MAIN_OBJECT_CAPTION_PROMPTS",
}


def instruction(dimension: str, index: int = 0) -> str:
    if dimension not in PROMPT_LISTS:
        raise ValueError(f"VDC dimension {dimension!r}; expected one of {', '.join(PROMPT_LISTS)}")
    return builtin_constant("vdc", PROMPT_LISTS[dimension])[index]


def docs_of(task: str):
    """process_docs of `task`: its dimension's rows (benchmarks.TASK_PART; all rows when they do not say)."""
    def process_docs(dataset):
        return benchmarks.process_docs(BENCH, dataset, benchmarks.TASK_FIELDS[task], task=task)
    return process_docs


process_docs_detailed, process_docs_camera, process_docs_short, process_docs_background, process_docs_main_object = (
    docs_of(f"vdc_{d}") for d in vdc.VDC_DIMENSIONS)


def doc_to_visual(doc):
    return [benchmarks.video_path(benchmarks.get(BENCH), doc)]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    kwargs = lmms_eval_specific_kwargs or {}
    return instruction(kwargs.get("dimension", "detailed"), int(kwargs.get("prompt_index", 0)))


def qa_pairs(doc) -> tuple:
    return tuple((str(qa["question"]), str(qa["answer"])) for qa in doc["qa_list"])


def process_results(doc, results):
    caption, protocol = results[0], vdc.vdc_protocol(doc)
    parts = [doc["dimension"]] if doc.get("dimension") else []  # one dimension's QA is not another's
    key = "/".join(["vdc", *parts, str(doc["video_name"])])
    result = judge.score_caption("vdc", key, caption, doc["caption"], "", qa_pairs(doc))
    where = {"video_name": doc["video_name"], "protocol": protocol}
    return {
        "vdc_score": judge.judged(result["score"], result["error"], **where),
        "vdc_acc": judge.judged(result["acc"], result["error"], **where),
        "qa_list": [{"question": q, "answer": a} for q, a in qa_pairs(doc)],  # logged, not aggregated
        "vdc_protocol": protocol,  # logged, not aggregated
    }


def process_results_facts(doc, results):
    """vdc_*_facts: fact F1 of the caption against VDC's reference caption (judge mode facts), 0-5."""
    result = judge.score_caption("facts", f"vdc/{doc['video_name']}", results[0], doc["caption"], "")
    return {"facts_score": judge.judged(result["score"], result["error"], video_name=doc["video_name"])}


def aggregate(results):
    """Mean over judged samples (missing judgments left out and counted in the log)."""
    return metrics.mean_judged(results)
