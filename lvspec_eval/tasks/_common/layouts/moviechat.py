"""MovieChat-1K, global and breakpoint questions.

- authors: the authors' test release (Enxin/MovieChat-1K-test): annotations/<n>.json per video,
  {"info": {"video_path", "fps", "num_frame", ...}, "global": [{question, answer}],
  "breakpoint": [{time, question, answer}]}, videos under videos/.
- hub: a snapshot of Enxin/lmms_MovieChat_test, moviechat_global/ and moviechat_breakpoint/
  (test-00000-of-00001.parquet each), videos under Test_Videos/.
Every doc records its "mode"; a breakpoint's "time" is a frame index, as the authors' eval code
reads it (total_sec = time / info.fps: eval_code/result_prepare/run_inference_qa_moviechat.py), and
"fps" carries info.fps where the release gives it (None: the task uses the video file's rate).
"""
from __future__ import annotations

import json
from pathlib import Path

from ..schema import Layout, SchemaError, read_rows
from .files import first_folder, provenance

MOVIECHAT = "rese1f/MovieChat@ba9bb802ea209c6d8e8b4333ec917ae3aee55b1d"
MOVIECHAT_MODES = ("global", "breakpoint")


def moviechat_doc(video: str, qa: dict, mode: str, fps) -> dict:
    """The task's fields; "time" (a frame index) only for breakpoint questions, None for global ones."""
    time = qa.get("time") if mode == "breakpoint" else None
    return {"video_name": video, "question": qa.get("question"), "answer": qa.get("answer"), "mode": mode,
            "time": time, "fps": fps}


def read_moviechat_authors(path: Path) -> list[dict]:
    """One per-video json of the authors' release: {"info": {"video_path", "fps", "num_frame", ...},
    "global": [{question, answer}], "breakpoint": [{time, question, answer}]}."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(data, dict) or not isinstance(data.get("info"), dict):
        raise SchemaError(f"{path}: expected the MovieChat-1K per-video json with an 'info' object")
    info = data["info"]
    docs = []
    for mode in MOVIECHAT_MODES:
        for k, qa in enumerate(data.get(mode) or []):
            doc = moviechat_doc(info.get("video_path"), qa, mode, info.get("fps"))
            docs.append(provenance(doc, path, f"{mode}[{k}]"))
    return docs


def read_moviechat_hub(path: Path) -> list[dict]:
    """One parquet of the hub snapshot, moviechat_<mode>/test-*.parquet: rows video_name, question, answer
    (and time, a frame index, in the breakpoint folder)."""
    mode = path.parent.name.removeprefix("moviechat_")
    if mode not in MOVIECHAT_MODES:
        raise SchemaError(f"{path}: folder {path.parent.name!r} is neither moviechat_global nor moviechat_breakpoint")
    return [provenance(moviechat_doc(r.get("video_name"), r, mode, None), path, row)
            for row, r in enumerate(read_rows(path))]


LAYOUTS = (
    Layout("authors", f"the authors' test release, Enxin/MovieChat-1K-test (annotations/ and videos/), "
                      f"as read by {MOVIECHAT} eval_code/result_prepare/run_inference_qa_moviechat.py",
           "<root>/\n  annotations/<n>.json   (info, global[], breakpoint[] with time = frame index)\n"
           "  videos/<n>.mp4         (info.video_path)",
           first_folder(("annotations",), ["*.json"]), read_moviechat_authors),
    Layout("hub", "a snapshot of Enxin/lmms_MovieChat_test (lmms-eval's moviechat tasks)",
           "<root>/\n  moviechat_global/test-00000-of-00001.parquet\n"
           "  moviechat_breakpoint/test-00000-of-00001.parquet\n  Test_Videos/<video_name>",
           first_folder(("",), [f"moviechat_{m}/test-*.parquet" for m in MOVIECHAT_MODES]), read_moviechat_hub),
)
