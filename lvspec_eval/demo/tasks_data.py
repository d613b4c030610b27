"""Data of the synthvid lmms-eval tasks (tasks/synthvid/): demo-world videos and their docs.

Generated on first use into a cache folder ($LVSPEC_DATA, default ~/.cache/lvspec_eval/synthvid),
one sub-folder per task: `videos/NNNNN.mp4` (world.render, encoded with libx264 in yuv444p at
CRF 12 so that colours survive the codec) and `docs.jsonl` (one doc per line: video path relative
to the task folder, the scene record, prompt, answer). `meta.json` records what was generated; a
change of version, size, seeds or of the demo world's output regenerates the task. Everything is a pure function of the seeds:
the same seeds give byte-identical docs.jsonl files and identical decoded frames.

Scenes come from seeds at data.TEST_SEED and above, which training never uses.
$LVSPEC_SYNTHVID_DOCS caps the number of docs per task (tests use it to stay fast).
"""
from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from dataclasses import asdict, dataclass
from fractions import Fraction
from pathlib import Path

import av
import numpy as np
from filelock import FileLock
from tqdm import tqdm

from . import data, models, world

VERSION = 1
CRF = 12
ENV_DIR, ENV_DOCS = "LVSPEC_DATA", "LVSPEC_SYNTHVID_DOCS"
MCQ_KINDS = ("count", "background", "colour", "shape", "motion", "order")  # cycled for balance


@dataclass(frozen=True)
class TaskSpec:
    kind: str  # caption | mcq
    num_docs: int
    num_frames: int
    first_seed: int  # doc i shows the scene of seed first_seed + i


TASKS = {
    "synthvid_caption": TaskSpec("caption", 50, models.FRAMES, data.TEST_SEED),
    "synthvid_mcq": TaskSpec("mcq", 100, models.FRAMES, data.TEST_SEED + 10_000),
    "synthvid_caption_long": TaskSpec("caption", 10, models.LONG_FRAMES, data.TEST_SEED + 20_000),
    # more lengths for the speedup-vs-visual-tokens curve (`lvspec-eval demo`'s length stage):
    # 8 visual tokens per frame at 112x112, so 32 / 128 / 512 frames = 256 / 1,024 / 4,096 tokens
    "synthvid_caption_f32": TaskSpec("caption", 4, 32, data.TEST_SEED + 30_000),
    "synthvid_caption_f128": TaskSpec("caption", 4, 128, data.TEST_SEED + 40_000),
    "synthvid_caption_f512": TaskSpec("caption", 4, 512, data.TEST_SEED + 50_000),
}


def cache_root() -> Path:
    return Path(os.environ.get(ENV_DIR) or Path.home() / ".cache" / "lvspec_eval" / "synthvid").expanduser()


def spec_for(task: str) -> TaskSpec:
    """The task's spec, its size capped by $LVSPEC_SYNTHVID_DOCS when set."""
    if task not in TASKS:
        raise ValueError(f"unknown synthvid task {task!r}; expected one of {', '.join(TASKS)}")
    spec = TASKS[task]
    cap = os.environ.get(ENV_DOCS)
    if cap:
        if not cap.isdigit() or int(cap) < 1:
            raise ValueError(f"{ENV_DOCS}={cap!r} must be a positive integer")
        spec = TaskSpec(spec.kind, min(spec.num_docs, int(cap)), spec.num_frames, spec.first_seed)
    return spec


# ---- docs (pure) ------------------------------------------------------------------------------

def _mcq_question(scene: world.Scene, index: int) -> dict:
    """Question kinds cycle with the doc index; a kind the scene lacks (order of a single
    object) gives way to the next one. Which object is asked about follows the scene's seed."""
    questions = world.make_questions(scene)
    for step in range(len(MCQ_KINDS)):
        kind = MCQ_KINDS[(index + step) % len(MCQ_KINDS)]
        of_kind = [q for q in questions if q["kind"] == kind]
        if of_kind:
            return random.Random(scene.seed).choice(of_kind)
    raise RuntimeError(f"scene {scene.seed} has no question")  # make_questions always has count


def make_doc(task: str, spec: TaskSpec, index: int) -> dict:
    """Doc `index` of a task (without its video)."""
    scene = world.make_scene(spec.first_seed + index)
    doc = {"doc_id": index, "task": task, "seed": scene.seed, "video": f"videos/{index:05d}.mp4",
           "num_frames": spec.num_frames, "fps": models.FPS, "scene": scene.to_dict()}
    if spec.kind == "caption":
        doc.update(kind="caption", prompt=world.CAPTION_PROMPT, answer=world.make_caption(scene))
    else:
        q = _mcq_question(scene, index)
        doc.update(kind=q["kind"], question=q["question"], options=q["options"], prompt=world.format_mcq(q),
                   answer=q["answer"])
    return doc


# ---- files --------------------------------------------------------------------------------------

def write_video(path: Path, frames: np.ndarray, fps: float) -> None:
    """uint8 [T, H, W, 3] -> mp4 (H.264 4:4:4, near-lossless, single-threaded so it is reproducible)."""
    rate = Fraction(fps).limit_denominator(1000)
    with av.open(str(path), "w", format="mp4") as container:
        stream = container.add_stream("libx264", rate=rate, options={"crf": str(CRF), "threads": "1"})
        stream.width, stream.height, stream.pix_fmt = frames.shape[2], frames.shape[1], "yuv444p"
        for i, array in enumerate(frames):
            frame = av.VideoFrame.from_ndarray(np.ascontiguousarray(array), format="rgb24")
            frame.pts = i
            container.mux(stream.encode(frame))
        container.mux(stream.encode(None))


def fingerprint(task: str, spec: TaskSpec) -> str:
    """Hash of every doc and of the first video's frames: a change to the demo world (scenes,
    captions, questions, rendering) makes a cached copy stale even when the spec is unchanged."""
    digest = hashlib.sha256()
    for i in range(spec.num_docs):
        digest.update(json.dumps(make_doc(task, spec, i), sort_keys=True).encode())
    scene = world.make_scene(spec.first_seed)
    digest.update(world.render(scene, spec.num_frames, models.FRAME_SIZE, models.FRAME_SIZE).tobytes())
    return digest.hexdigest()


def _meta(task: str, spec: TaskSpec) -> dict:
    return {"version": VERSION, "task": task, "spec": asdict(spec), "frame_size": models.FRAME_SIZE,
            "fps": models.FPS, "crf": CRF, "fingerprint": fingerprint(task, spec)}


def _is_complete(folder: Path, meta: dict) -> bool:
    meta_path, docs_path = folder / "meta.json", folder / "docs.jsonl"
    if not (meta_path.is_file() and docs_path.is_file()):
        return False
    if json.loads(meta_path.read_text(encoding="utf-8")) != meta:
        return False
    docs = [json.loads(line) for line in docs_path.read_text(encoding="utf-8").splitlines() if line]
    return all((folder / d["video"]).is_file() for d in docs)


def _generate(task: str, spec: TaskSpec, folder: Path) -> None:
    """Videos first, then docs.jsonl, then meta.json: an interrupted run is redone next time."""
    if folder.exists():
        shutil.rmtree(folder)
    (folder / "videos").mkdir(parents=True)
    lines = []
    for i in tqdm(range(spec.num_docs), desc=f"generating {task}", unit="video"):
        doc = make_doc(task, spec, i)
        frames = world.render(world.Scene.from_dict(doc["scene"]), spec.num_frames, models.FRAME_SIZE,
                              models.FRAME_SIZE)
        write_video(folder / doc["video"], frames, models.FPS)
        lines.append(json.dumps(doc, sort_keys=True))
    (folder / "docs.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / "meta.json").write_text(json.dumps(_meta(task, spec), sort_keys=True, indent=1), encoding="utf-8")


def ensure(task: str, root: Path | None = None) -> Path:
    """The task's folder, generated first if missing or stale (under a lock: ranks may race)."""
    spec = spec_for(task)
    root = Path(root) if root else cache_root()
    folder = root / task
    root.mkdir(parents=True, exist_ok=True)
    with FileLock(str(root / f".{task}.lock")):
        if not _is_complete(folder, _meta(task, spec)):
            _generate(task, spec, folder)
    return folder


def load_docs(task: str, root: Path | None = None) -> list[dict]:
    """The task's docs, generated if needed, with `video` made an absolute path."""
    folder = ensure(task, root)
    docs = [json.loads(line) for line in (folder / "docs.jsonl").read_text(encoding="utf-8").splitlines() if line]
    for doc in docs:
        doc["video"] = str((folder / doc["video"]).resolve())
    return docs
