"""The annotation layouts of the open-ended benchmarks: VDC, VDD and MovieChat-1K.

Each benchmark has its authors' release and the layout of the hub dataset lmms-eval's built-in task
reads (a local snapshot of that repository); docs/DATA.md shows both as trees. The readers turn one
annotation file into docs with the task's fields, each carrying its provenance (schema.SOURCE_FILE,
SOURCE_ROW). A doc that belongs to one task of several records it:
- VDC: "dimension" (detailed, camera, short, background, main_object). AuroraCap's release has one
  QA file per dimension and one captions file; the hub snapshot one parquet folder per dimension.
  A row without a dimension (the hub rows merged, as lmms-eval loads them) is asked by every
  dimension task and judged against its own qa_list, as lmms-eval does: protocol LMMS_EVAL_HUB.
- MovieChat-1K: "mode" (global or breakpoint). A breakpoint's "time" is a frame index in the authors'
  json (their eval code divides it by info.fps: eval_code/result_prepare/run_inference_qa_moviechat.py);
  "fps" carries info.fps where the release gives it (None: the video file's rate is used).

Nothing here opens a video: a missing video stays a per-sample failure (benchmarks.video_path).
"""
from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path

from .schema import SOURCE_FILE, SOURCE_ROW, Layout, SchemaError, read_rows

# ---- shared -----------------------------------------------------------------------------------------


def first_folder(folders: Iterable[str], patterns: Iterable[str]) -> Callable[[Path], list[Path]]:
    """A `find`: the files matching `patterns` in the first of `folders` (under the root) that has any."""
    folders, patterns = tuple(folders), tuple(patterns)

    def find(root: Path) -> list[Path]:
        for folder in folders:
            found = sorted({p for pattern in patterns for p in (root / folder).glob(pattern) if p.is_file()})
            if found:
                return found
        return []
    return find


def provenance(doc: dict, path: Path, row: int) -> dict:
    doc[SOURCE_FILE], doc[SOURCE_ROW] = str(path), row
    return doc


def records(path: Path) -> list:
    """A .jsonl file's records, or a .json/.parquet file's rows, as written (no field is changed)."""
    if path.suffix == ".jsonl":
        lines = path.read_text(encoding="utf-8").split("\n")
        return [json.loads(line) for line in lines if line.strip()]
    return read_rows(path)


def qa_items(items, where: str) -> list[dict]:
    """[{question, answer}] from a list of QA records (extra keys such as AuroraCap's category dropped)."""
    if not isinstance(items, list) or not all(isinstance(q, dict) for q in items):
        raise SchemaError(f"{where}: expected a list of {{question, answer}} records, got {type(items).__name__}")
    out = [{"question": q.get("question"), "answer": q.get("answer")} for q in items]
    bad = [i for i, q in enumerate(out) if q["question"] in (None, "") or q["answer"] in (None, "")]
    if bad:
        raise SchemaError(f"{where}: QA item(s) {bad} lack a question or an answer")
    return out


# ---- VDC ------------------------------------------------------------------------------------------------

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
    for record in records(path):
        out[str(record.get("video_id"))] = record.get("captions") or record
    return out


def read_vdc_auroracap(path: Path) -> list[dict]:
    """One AuroraCap QA file (<dimension>.jsonl: one {video_id: [{question, answer, category}]} per line)."""
    dimension = vdc_dimension(path.stem, str(path))
    captions = vdc_captions(vdc_caption_file(path))
    docs = []
    for row, record in enumerate(records(path)):
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
    for row, record in enumerate(records(path)):
        doc = {"video_name": record.get("video_name"), "caption": record.get("caption"), "dimension": dimension,
               "qa_list": qa_items(record.get("qa_list") or [], f"{path} row {row}")}
        docs.append(provenance(doc, path, row))
    return docs


VDC_LAYOUTS = (
    Layout("auroracap", f"AuroraCap's VDCscore files ({AURORACAP} post_eval/; the same files as "
                        "VDCScore_qa/ + VDC_1k.jsonl in the hub release wchai/Video-Detailed-Caption)",
           "<root>/\n  post_eval/ (or VDCScore_qa/, or the root itself)\n"
           "    detailed.jsonl camera.jsonl short.jsonl background.jsonl main_object.jsonl\n"
           "    VDC_1k_captions.jsonl (or VDC_1k.jsonl here or one folder up)\n  Test_Videos/ or videos/\n"
           "    <video_id>.mp4",
           first_folder(("post_eval", "VDCScore_qa", ""), [f"{d}.jsonl" for d in VDC_DIMENSIONS]),
           read_vdc_auroracap),
    Layout("lmms-eval-hub", "a snapshot of wchai/lmms_VDC_test (lmms-eval's VDC tasks)",
           "<root>/\n  detailed_test/test-00000-of-00001.parquet (and camera_test/, short_test/,\n"
           "    background_test/, main_object_test/)\n  Test_Videos/<video_name>.mp4",
           first_folder(("",), [f"{d}_test/test-*.parquet" for d in VDC_DIMENSIONS]), read_vdc_hub),
)


# ---- VDD (Video-ChatGPT's detail orientation) ---------------------------------------------------------

VIDEO_CHATGPT = "mbzuai-oryx/Video-ChatGPT@69ea1db32aa8a6406620e615f227754f0f967c08"


def read_vdd_video_chatgpt(path: Path) -> list[dict]:
    """Video-ChatGPT's generic_qa.json: a list of {video_name, Q, A} (read by its
    video_chatgpt/eval/run_inference_benchmark_general.py and scored for detail orientation by
    quantitative_evaluation/evaluate_benchmark_2_detailed_orientation.py)."""
    docs = []
    for row, record in enumerate(records(path)):
        doc = {"video_name": record.get("video_name"), "question": record.get("Q"), "answer": record.get("A")}
        docs.append(provenance(doc, path, row))
    return docs


def read_plain(path: Path) -> list[dict]:
    """Rows already in the task's fields (a hub parquet), with their provenance."""
    return [provenance(dict(record), path, row) for row, record in enumerate(records(path))]


VDD_LAYOUTS = (
    Layout("video-chatgpt", f"Video-ChatGPT's benchmark QA ({VIDEO_CHATGPT}, the generic_qa.json its "
                            "detail-orientation evaluation reads)",
           "<root>/\n  Benchmarking_QA/generic_qa.json (or generic_qa.json)\n  Test_Videos/<video_name>.mp4",
           first_folder(("Benchmarking_QA", ""), ["generic_qa.json"]), read_vdd_video_chatgpt),
    Layout("lmms-eval-hub", "a snapshot of lmms-lab/VideoDetailDescription (lmms-eval's video_dc499)",
           "<root>/\n  data/test-00000-of-00001.parquet\n  Test_Videos/<video_name>.mp4",
           first_folder(("data",), ["test-*.parquet"]), read_plain),
)


# ---- MovieChat-1K ------------------------------------------------------------------------------------------

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
            for row, r in enumerate(records(path))]


MOVIECHAT_LAYOUTS = (
    Layout("moviechat-1k", f"the authors' test release, Enxin/MovieChat-1K-test (annotations/ and videos/), "
                           f"as read by {MOVIECHAT} eval_code/result_prepare/run_inference_qa_moviechat.py",
           "<root>/\n  annotations/<n>.json   (info, global[], breakpoint[] with time = frame index)\n"
           "  videos/<n>.mp4         (info.video_path)",
           first_folder(("annotations",), ["*.json"]), read_moviechat_authors),
    Layout("lmms-eval-hub", "a snapshot of Enxin/lmms_MovieChat_test (lmms-eval's moviechat tasks)",
           "<root>/\n  moviechat_global/test-00000-of-00001.parquet\n"
           "  moviechat_breakpoint/test-00000-of-00001.parquet\n  Test_Videos/<video_name>",
           first_folder(("",), [f"moviechat_{m}/test-*.parquet" for m in MOVIECHAT_MODES]), read_moviechat_hub),
)


# ---- one task's rows ----------------------------------------------------------------------------------------


def rows_of(rows: list[dict], key: str, value: str, where: str) -> list[dict]:
    """The rows of one task: those whose `key` is `value`, and those that do not say (`key` missing:
    the hub rows merged, asked by every task as lmms-eval asks them). No such row is a ValueError
    naming the values found."""
    mine = [r for r in rows if r.get(key) in (value, None)]
    if not mine:
        found = sorted({str(r.get(key)) for r in rows})
        raise ValueError(f"{where}: no rows with {key}={value!r} among the annotations (found: {', '.join(found)})")
    return mine
