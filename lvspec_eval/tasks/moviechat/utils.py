"""MovieChat-1K open-ended QA, global mode (whole video) and breakpoint mode (one moment).

Answers are judged by this project's judges/ with the Video-ChatGPT QA question (yes/no and a
0-5 score against the reference answer): qa_acc is the share of "yes", qa_score the mean score,
as lmms-eval's moviechat tasks report them (gpt_eval_acc / gpt_eval_score).

Breakpoint mode: the doc's `time` is a frame index. The lvspec model takes whole video files, so
the moment is named in the prompt ("... at 1:23 of the video"), converted to seconds with the
file's frame rate; this approximates MovieChat's breakpoint setting (where the model has seen the
video up to that frame), it does not reproduce it.
"""

from lvspec_eval.tasks._common import benchmarks, judge, metrics

BENCH = "moviechat"


def process_docs(dataset):
    return benchmarks.process_docs(BENCH, dataset, benchmarks.TASK_FIELDS["lvspec_moviechat_global"])


def doc_to_visual(doc):
    return [benchmarks.video_path(benchmarks.get(BENCH), doc)]


def doc_to_text(doc, lmms_eval_specific_kwargs=None):
    kwargs = lmms_eval_specific_kwargs or {}
    return f"{kwargs.get('pre_prompt', '')}{doc['question']}{kwargs.get('post_prompt', '')}"


def moment(doc) -> str:
    """The breakpoint as m:ss (frame index / the video's frame rate), or "frame N" if unreadable."""
    import av

    frame = int(doc["time"])
    try:
        with av.open(benchmarks.video_path(benchmarks.get(BENCH), doc)) as container:
            rate = container.streams.video[0].average_rate
    except (av.FFmpegError, OSError, IndexError):
        rate = None
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
