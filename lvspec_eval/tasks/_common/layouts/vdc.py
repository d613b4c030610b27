"""VDC (video detailed captions, AuroraCap), five caption dimensions.

- authors: the files the official VDCscore reads (rese1f/aurora post_eval/: one QA file per
  dimension, `{video_id: [{question, answer, category}]}` per line, and the captions file
  `{video_id, captions: {<dimension>_caption}}`; the hub release wchai/Video-Detailed-Caption holds the
  same files as VDCScore_qa/ and VDC_1k.jsonl).
- hub: a snapshot of wchai/lmms_VDC_test, one parquet folder per dimension
  (`<dimension>_test/test-00000-of-00001.parquet`, rows video_name, caption, qa_list).
Both give every doc its "dimension"; a row without one (the hub rows merged, as lmms-eval's YAML
loads them: it names no config) is asked by every dimension task and judged against its own
qa_list, as lmms-eval does: protocol VDC_LMMS_EVAL_HUB.
"""
from __future__ import annotations

from pathlib import Path

from ..schema import Layout, SchemaError, read_rows
from .files import first_folder, provenance


def qa_items(items, where: str) -> list[dict]:
    """[{question, answer}] from a list of QA records (extra keys such as AuroraCap's category dropped)."""
    if not isinstance(items, list) or not all(isinstance(q, dict) for q in items):
        raise SchemaError(f"{where}: expected a list of {{question, answer}} records, got {type(items).__name__}")
    out = [{"question": q.get("question"), "answer": q.get("answer")} for q in items]
    bad = [i for i, q in enumerate(out) if q["question"] in (None, "") or q["answer"] in (None, "")]
    if bad:
        raise SchemaError(f"{where}: QA item(s) {bad} lack a question or an answer")
    return out


VDC_DIMENSIONS = ("detailed", "camera", "short", "background", "main_object")
# How a vdc_<dimension> task judged its captions (logged per sample and shown in the report):
VDC_PER_DIMENSION = "vdcscore-per-dimension"  # the dimension's own questions and reference caption (VDCscore)
VDC_LMMS_EVAL_HUB = "lmms-eval-hub"  # every row, each against its own qa_list, whatever its dimension (lmms-eval)
AURORACAP = "rese1f/aurora@2bf68d5779ddd98e44ce5bc66c17a6d1525ce204"
VDC_CAPTION_FILES = ("VDC_1k_captions.jsonl", "VDC_1k.jsonl")  # AuroraCap's post_eval/ name, the hub release's


def vdc_protocol(doc: dict) -> str:
    return VDC_PER_DIMENSION if doc.get("dimension") else VDC_LMMS_EVAL_HUB


def vdc_dimension(name: str, where: str) -> str:
    if name not in VDC_DIMENSIONS:
        raise SchemaError(f"{where}: {name!r} is not a VDC dimension; expected one of {', '.join(VDC_DIMENSIONS)}")
    return name


def vdc_caption_file(qa_path: Path) -> Path:
    """The captions file of an AuroraCap QA file: beside it (post_eval/) or one folder up (VDCScore_qa/)."""
    for folder in (qa_path.parent, qa_path.parent.parent):
        for name in VDC_CAPTION_FILES:
            if (folder / name).is_file():
                return folder / name
    raise SchemaError(f"{qa_path}: no VDC captions file ({' or '.join(VDC_CAPTION_FILES)}) in "
                      f"{qa_path.parent} or {qa_path.parent.parent}; VDCscore judges each dimension against "
                      "its reference caption, so the QA files need it")


def vdc_captions(path: Path) -> dict[str, dict]:
    """video_id -> its captions record: {"video_id", "captions": {"<dimension>_caption": text}} per line
    (AuroraCap's post_eval/process_vdc_result.py reads data['captions']['main_object_caption'])."""
    out = {}
    for record in read_rows(path):
        out[str(record.get("video_id"))] = record.get("captions") or record
    return out


def read_vdc_auroracap(path: Path) -> list[dict]:
    """One AuroraCap QA file (<dimension>.jsonl: one {video_id: [{question, answer, category}]} per line)."""
    dimension = vdc_dimension(path.stem, str(path))
    captions = vdc_captions(vdc_caption_file(path))
    docs = []
    for row, record in enumerate(read_rows(path)):
        for video_id, items in record.items():
            caption = (captions.get(str(video_id)) or {}).get(f"{dimension}_caption")
            doc = {"video_name": str(video_id), "caption": caption, "dimension": dimension,
                   "qa_list": qa_items(items, f"{path} row {row}")}
            docs.append(provenance(doc, path, row))
    return docs


def read_vdc_hub(path: Path) -> list[dict]:
    """One parquet of the hub snapshot, <dimension>_test/test-*.parquet: rows video_name, caption, qa_list."""
    dimension = vdc_dimension(path.parent.name.removesuffix("_test"), str(path))
    docs = []
    for row, record in enumerate(read_rows(path)):
        doc = {"video_name": record.get("video_name"), "caption": record.get("caption"), "dimension": dimension,
               "qa_list": qa_items(record.get("qa_list") or [], f"{path} row {row}")}
        docs.append(provenance(doc, path, row))
    return docs


LAYOUTS = (
    Layout("authors", f"AuroraCap's VDCscore files ({AURORACAP} post_eval/; the same files as "
                        "VDCScore_qa/ + VDC_1k.jsonl in the hub release wchai/Video-Detailed-Caption)",
           "<root>/\n  post_eval/ (or VDCScore_qa/, or the root itself)\n"
           "    detailed.jsonl camera.jsonl short.jsonl background.jsonl main_object.jsonl\n"
           "    VDC_1k_captions.jsonl (or VDC_1k.jsonl here or one folder up)\n  Test_Videos/ or videos/\n"
           "    <video_id>.mp4",
           first_folder(("post_eval", "VDCScore_qa", ""), [f"{d}.jsonl" for d in VDC_DIMENSIONS]),
           read_vdc_auroracap),
    Layout("hub", "a snapshot of wchai/lmms_VDC_test (lmms-eval's VDC tasks)",
           "<root>/\n  detailed_test/test-00000-of-00001.parquet (and camera_test/, short_test/,\n"
           "    background_test/, main_object_test/)\n  Test_Videos/<video_name>.mp4",
           first_folder(("",), [f"{d}_test/test-*.parquet" for d in VDC_DIMENSIONS]), read_vdc_hub),
)
