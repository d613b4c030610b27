"""MovieChat-1K open-ended QA, global mode (whole video) and breakpoint mode (one moment).

Answers are judged by this project's judges/ with the Video-ChatGPT QA question (yes/no and a
0-5 score against the reference answer): qa_acc is the share of "yes", qa_score the mean score,
as lmms-eval's moviechat tasks report them (gpt_eval_acc / gpt_eval_score).

Each task asks only its own questions: the authors' per-video json and the hub snapshot say which
question is global and which a breakpoint (doc "mode", tasks/_common/layouts/moviechat.py); rows that do
not say (one merged file) are asked by both tasks, as lmms-eval's two tasks ask its merged split.

Breakpoint mode: the doc's `time` is a frame index, as in the authors' json (their eval code divides
it by info.fps). The lvspec model takes whole video files, so the moment is named in the prompt
("... at 1:23 of the video"), converted to seconds with the release's fps (doc "fps", the authors'
info.fps) or else the file's frame rate; this approximates MovieChat's breakpoint setting (where the
model has seen the video up to that frame), it does not reproduce it.
"""

from lvspec_eval.tasks._common import benchmarks, judge, metrics
from lvspec_eval.tasks._common.layouts import moviechat

BENCH = "moviechat"


def docs_of(task: str):
    """process_docs of `task`: its mode's questions only (benchmarks.TASK_PART)."""
    def process_docs(dataset):
        return benchmarks.process_docs(BENCH, dataset, benchmarks.TASK_FIELDS[task], task=task)
    return process_docs


process_docs_global, process_docs_breakpoint = (docs_of(f"lvspec_moviechat_{m}") for m in moviechat.MOVIECHAT_MODES)


def doc_to_visual(doc):
    return [benchmarks.video_path(benchmarks.get(BENCH), doc)]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    kwargs = lmms_eval_specific_kwargs or {}
    return f"{kwargs.get('pre_prompt', '')}{doc['question']}{kwargs.get('post_prompt', '')}"


def file_rate(doc) -> float | None:
    """The frame rate of the doc's video file, or None when it cannot be read."""
    import av

    try:
        with av.open(benchmarks.video_path(benchmarks.get(BENCH), doc)) as container:
            rate = container.streams.video[0].average_rate
    except (av.FFmpegError, OSError, IndexError):
        return None
    return float(rate) if rate else None


def moment(doc) -> str:
    """The breakpoint as m:ss (frame index / the release's fps, else the file's), or "frame N"."""
    frame = int(doc["time"])
    rate = doc.get("fps") or file_rate(doc)
    if not rate:
        return f"frame {frame}"
    seconds = int(frame / float(rate))
    return f"{seconds // 60}:{seconds % 60:02d}"


def doc_to_text_breakpoint(doc, lmms_eval_specific_kwargs=None):
    kwargs = lmms_eval_specific_kwargs or {}
    question = f"At {moment(doc)} of the video: {doc['question']}"
    return f"{kwargs.get('pre_prompt', '')}{question}{kwargs.get('post_prompt', '')}"


def process_results(doc, results):
    key = f"moviechat/{doc['video_name']}/{doc.get('time', '')}/{doc['question']}"
    result = judge.score_answer(key, doc["question"], doc["answer"], results[0])
    where = {"video_name": doc["video_name"]}
    return {"qa_acc": judge.judged(result["acc"], result["error"], **where),
            "qa_score": judge.judged(result["score"], result["error"], **where)}


def aggregate(results):
    return metrics.mean_judged(results)
