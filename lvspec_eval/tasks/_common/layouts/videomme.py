"""Video-MME (no subtitles): the task's fields are those of the hub dataset lmms-eval's `videomme`
reads (lmms-eval/Video-MME, split test; fields videoID, question, options ["A. ..", ..], answer: a
letter, duration, domain, sub_category, task_type, question_id), as its repository stores them
(`videomme/test-00000-of-00001.parquet`) or saved as one file beside `data/`.
"""
from __future__ import annotations

from ..schema import Layout, globbed, reader

HUB = Layout(
    "hub",
    "hub dataset lmms-eval/Video-MME, split test (lmms-eval 0.7.3 videomme)",
    "<root>/\n  videomme/test-*.parquet | test.jsonl|json|parquet   "
    "[{videoID, question, options: [\"A. ..\", ..], answer: letter, duration, task_type, ...}]\n"
    "  data/<videoID>.mp4",
    globbed("videomme/test-*.parquet", "test.jsonl", "test.json", "test.parquet"),
    reader(),
)
LAYOUTS = (HUB,)
