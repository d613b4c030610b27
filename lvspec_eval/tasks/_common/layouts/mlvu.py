"""MLVU dev, multiple choice: the task's fields are those of the hub dataset lmms-eval's `mlvu_dev`
reads (`video_name`, `question` with its options listed in it as "(A) text" lines, `answer` a
letter, `task_type`), plus `candidates`, the option texts, which the schema check requires.

- authors: `MLVU/json/<n>_<task>.json` + `MLVU/video/<n>_<task>/` as the authors release them (the
  hub dataset MLVU/MVLU; annotation files also in github.com/FlagOpen/FlagEmbedding MLVU/data @71cbc1f:
  fields video, duration, question, candidates, answer given as the option TEXT, question_type).
  Only the multiple-choice files are read; the open-ended ones (sub_scene, summary) are generation
  tasks scored by a GPT judge in the authors' own scripts, not by lvspec_mlvu, and are skipped with
  a log line.
- hub: the rows of the hub dataset lmms-eval 0.7.3's `mlvu_dev` loads (sy1998/MLVU_dev, split
  test), as its repository stores them (`mlvu/test-00000-of-00001.parquet`) or saved as one file.
"""
from __future__ import annotations

import re
from pathlib import Path

from loguru import logger

from ..schema import Layout, globbed, reader

# The multiple-choice task types, as the authors' files name them (1_plotQA.json .. 7_topic_reasoning.json)
# and as the hub rows' task_type and lmms-eval's mlvu_dev aggregation name them. Inside 2_needle.json
# the records' question_type says findNeedle; the task type is the file's, as in the authors' scripts.
TASK_TYPES = ("plotQA", "needle", "ego", "count", "order", "anomaly_reco", "topic_reasoning")
OPEN_ENDED = ("sub_scene", "summary")  # the authors' generation tasks (8_sub_scene, 9_summary)
OPTION_MARK = re.compile(r"\(([A-H])\)\s*")  # "(A) " before each option, on its own line or inline


def letter(index: int) -> str:
    return chr(ord("A") + index)


def task_of(path: Path) -> str:
    """`2_needle.json` -> "needle"."""
    return path.stem.split("_", 1)[-1]


def authors_files(root: Path) -> list[Path]:
    files = globbed("MLVU/json/*.json")(root)
    skipped = [p.name for p in files if task_of(p) in OPEN_ENDED]
    if skipped:
        logger.info(f"mlvu: open-ended files not part of the multiple-choice task, skipped: {', '.join(skipped)}")
    return [p for p in files if task_of(p) not in OPEN_ENDED]


def from_authors(row: dict, path: Path) -> dict:
    """An authors' record -> the hub fields: options listed in the question, the answer as a letter."""
    candidates = list(row.get("candidates") or [])
    answer = row.get("answer")
    lines = [f"({letter(i)}) {c}" for i, c in enumerate(candidates)]
    return {
        "video_name": f"MLVU/video/{path.stem}/{row.get('video', '')}" if row.get("video") else "",
        "duration": row.get("duration"),
        "question": "\n".join([row.get("question") or ""] + lines) if row.get("question") else "",
        "candidates": candidates,
        "answer": letter(candidates.index(answer)) if answer in candidates else "",
        "question_type": row.get("question_type"),
        "task_type": task_of(path),
    }


def listed_options(question: str) -> list[str]:
    """The options a question lists as "(A) text (B) text ..." (one per line or inline), A first."""
    parts = OPTION_MARK.split(question)  # [question, "A", text, "B", text, ...]
    letters, texts = parts[1::2], [t.strip() for t in parts[2::2]]
    expected = [letter(i) for i in range(len(letters))]
    return texts if letters == expected and all(texts) else []


def from_hub(row: dict, path: Path | None = None) -> dict:
    """A hub row: its options are listed in the question; list them as `candidates` for the check."""
    if "candidates" not in row:
        row["candidates"] = listed_options(str(row.get("question") or ""))
    return row


AUTHORS = Layout(
    "authors",
    "MLVU as released by its authors (hub dataset MLVU/MVLU; github.com/FlagOpen/FlagEmbedding @71cbc1f "
    "MLVU/data/<n>_<task>.json)",
    "<root>/MLVU/\n  json/1_plotQA.json 2_needle.json ... 7_topic_reasoning.json   "
    "[{video, duration, question, candidates, answer: option text, question_type}]\n"
    "  video/1_plotQA/<video> ...",
    authors_files,
    reader(from_authors),
)
HUB = Layout(
    "hub",
    "hub dataset sy1998/MLVU_dev, split test (lmms-eval 0.7.3 mlvu_dev)",
    "<root>/\n  mlvu/test-00000-of-00001.parquet | test-*.parquet | test.jsonl|json|parquet   "
    "[{video_name, question: text + \"(A) ..\" lines, answer: letter, task_type}]\n  <video_name>",
    globbed("*/test-*.parquet", "test-*.parquet", "test.jsonl", "test.json", "test.parquet"),
    reader(from_hub),
)
LAYOUTS = (AUTHORS, HUB)
