"""VDD (VideoDetailDescription): Video-ChatGPT's detail-orientation benchmark.

- authors: the authors' benchmark QA, Benchmarking_QA/generic_qa.json, a list of
  {video_name, Q, A} (Q and A become question and answer).
- hub: a snapshot of lmms-lab/VideoDetailDescription, data/test-*.parquet with rows
  video_name, question, answer (lmms-eval's video_dc499).
"""
from __future__ import annotations

from pathlib import Path

from ..schema import Layout, read_rows
from .files import first_folder, provenance

VIDEO_CHATGPT = "mbzuai-oryx/Video-ChatGPT@69ea1db32aa8a6406620e615f227754f0f967c08"


def read_vdd_video_chatgpt(path: Path) -> list[dict]:
    """Video-ChatGPT's generic_qa.json: a list of {video_name, Q, A} (read by its
    video_chatgpt/eval/run_inference_benchmark_general.py and scored for detail orientation by
    quantitative_evaluation/evaluate_benchmark_2_detailed_orientation.py)."""
    docs = []
    for row, record in enumerate(read_rows(path)):
        doc = {"video_name": record.get("video_name"), "question": record.get("Q"), "answer": record.get("A")}
        docs.append(provenance(doc, path, row))
    return docs


def read_plain(path: Path) -> list[dict]:
    """Rows already in the task's fields (a hub parquet), with their provenance."""
    return [provenance(dict(record), path, row) for row, record in enumerate(read_rows(path))]


LAYOUTS = (
    Layout("authors", f"Video-ChatGPT's benchmark QA ({VIDEO_CHATGPT}, the generic_qa.json its "
                            "detail-orientation evaluation reads)",
           "<root>/\n  Benchmarking_QA/generic_qa.json (or generic_qa.json)\n  Test_Videos/<video_name>.mp4",
           first_folder(("Benchmarking_QA", ""), ["generic_qa.json"]), read_vdd_video_chatgpt),
    Layout("hub", "a snapshot of lmms-lab/VideoDetailDescription (lmms-eval's video_dc499)",
           "<root>/\n  data/test-00000-of-00001.parquet\n  Test_Videos/<video_name>.mp4",
           first_folder(("data",), ["test-*.parquet"]), read_plain),
)
