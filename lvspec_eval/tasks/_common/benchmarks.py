"""Where each benchmark's annotations and videos live, and which video file a doc names.

One environment variable per benchmark, LVSPEC_<NAME>_ROOT, names a local folder holding the
benchmark in one of its real layouts (schema.Layout; each benchmark's in layouts/<name>.py): the
authors' own release, or a local snapshot of the hub dataset lmms-eval's built-in task reads.
The first layout found under the root is read (the log says which); every doc is checked for the
fields its task needs before any model runs (schema.check_rows, from process_docs). Without the
variable the folder is $HF_HOME/<cache_dir> and the annotations come from the hub dataset through
the local datasets cache, as the built-in tasks read them, at the revision lmms-eval's YAML pins
(HF_DATASETS_OFFLINE=1 keeps that offline once cached). docs/DATA.md shows every layout.

Why our own tasks at all: the built-in ones exit the whole run (sys.exit) on one missing video,
need a hub download, and some pick a random instruction per sample. Ours return the expected
path of a missing video, so the model fails that sample alone with the path in its error.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from .builtin import DEFAULT_HF_HOME, builtin_utils
from .layouts import files, longvideobench, mlvu, moviechat, mvbench, vdc, vdd, videomme
from .schema import Layout, Rule, accepted, answer_among, check_rows, index_within, letter_within, reader, tag

# other names a video may have on disk: what the built-in tasks also try (.MP4, .mkv), and
# MVBench's releases, whose records name some videos .webm that are stored as .mp4 and back
VIDEO_SUFFIX_SWAPS = ((".mp4", ".MP4"), (".mp4", ".mkv"), (".webm", ".mp4"), (".mp4", ".webm"))


@dataclass(frozen=True)
class Benchmark:
    name: str
    env_var: str  # LVSPEC_<NAME>_ROOT
    hub_id: str  # the dataset the built-in task loads
    split: str
    cache_dir: str  # the built-in task's dataset_kwargs.cache_dir, under $HF_HOME
    video_dir: str  # sub-folder of the root that the doc's video names are relative to
    video_key: str  # doc field naming the video file (or its stem, see video_ext)
    video_ext: str = ""  # appended to the doc's value when it is a stem (".mp4")
    configs: tuple[str | None, ...] = (None,)  # hub dataset configs (MVBench: one per sub-task)
    config_key: str = "sub_task"  # doc field that records a row's config when there are several
    layouts: tuple[Layout, ...] = ()  # local annotation layouts, tried in order; () = flat_layout(split)
    revision: str | None = None  # the hub revision lmms-eval's YAML pins (None: it pins none)
    hub_convert: Callable[[dict], dict] | None = None  # hub row -> the task's fields, if they differ
    folder_of: Callable[[str], str] | None = None  # config -> video sub-folder (MVBench)
    alt_prefixes: tuple[str, ...] = ()  # other sub-folders a video may sit under (MVBench's data0613)
    alt_video_dirs: tuple[str, ...] = ()  # other folders of the root holding the videos (an authors' videos/)


def flat_layout(split: str) -> Layout:
    """Rows of the hub dataset saved as one file beside the videos (what the docs asked for before)."""
    return Layout("flat", "the hub dataset's rows saved as one file (any exporter)",
                  f"<root>/\n  {split}.jsonl | {split}.json | {split}.parquet",
                  _first_of(f"{split}.jsonl", f"{split}.json", f"{split}.parquet"), reader())


def _first_of(*names: str):
    def find(root: Path) -> list[Path]:
        return next(([root / n] for n in names if (root / n).is_file()), [])
    return find


def _mvbench_folder(config: str) -> str:
    return builtin_utils("mvbench").DATA_LIST[config]


# The 20 MVBench sub-tasks, in the order of lmms-eval's `mvbench` group.
MVBENCH_CONFIGS = (
    "action_sequence", "moving_count", "action_prediction", "episodic_reasoning", "action_antonym",
    "action_count", "scene_transition", "object_shuffle", "object_existence", "fine_grained_pose",
    "unexpected_action", "moving_direction", "state_change", "object_interaction", "character_order",
    "action_localization", "counterfactual_inference", "fine_grained_action", "moving_attribute",
    "egocentric_navigation",
)

BENCHMARKS = {b.name: b for b in (
    Benchmark("videomme", "LVSPEC_VIDEOMME_ROOT", "lmms-eval/Video-MME", "test", "videomme", "data", "videoID",
              ".mp4", layouts=videomme.LAYOUTS),
    Benchmark("vdc", "LVSPEC_VDC_ROOT", "wchai/lmms_VDC_test", "test", "vdc_test", "Test_Videos", "video_name",
              ".mp4", layouts=(*vdc.LAYOUTS, flat_layout("test")), alt_video_dirs=("videos",)),
    Benchmark("vdd", "LVSPEC_VDD_ROOT", "lmms-lab/VideoDetailDescription", "test", "videochatgpt", "Test_Videos",
              "video_name", ".mp4", layouts=(*vdd.LAYOUTS, flat_layout("test"))),
    Benchmark("moviechat", "LVSPEC_MOVIECHAT_ROOT", "Enxin/lmms_MovieChat_test", "test", "moviechat_1k_test",
              "Test_Videos", "video_name", layouts=(*moviechat.LAYOUTS, flat_layout("test")),
              alt_video_dirs=("videos",)),
    Benchmark("mvbench", "LVSPEC_MVBENCH_ROOT", "OpenGVLab/MVBench", "train", "mvbench_video", "", "video",
              configs=MVBENCH_CONFIGS, layouts=mvbench.layouts(MVBENCH_CONFIGS), folder_of=_mvbench_folder,
              alt_prefixes=("data0613",), revision="video"),
    Benchmark("mlvu", "LVSPEC_MLVU_ROOT", "sy1998/MLVU_dev", "test", "mlvu", "", "video_name",
              layouts=mlvu.LAYOUTS, hub_convert=mlvu.from_hub),
    Benchmark("longvideobench", "LVSPEC_LONGVIDEOBENCH_ROOT", "longvideobench/LongVideoBench", "validation",
              "datasets/longvideobench", "videos", "video_path", layouts=longvideobench.LAYOUTS,
              hub_convert=longvideobench.from_option_columns),
)}

# task name (ours) -> benchmark; groups expand to their tasks
TASKS = {
    "lvspec_videomme": "videomme",
    **{f"vdc_{d}": "vdc" for d in ("detailed", "camera", "short", "background", "main_object")},
    "vdd": "vdd",
    # the same data judged in mode facts (a small local judge's mode; docs/JUDGE.md)
    "vdd_facts": "vdd",
    "vdc_detailed_facts": "vdc",
    "lvspec_moviechat_global": "moviechat",
    "lvspec_moviechat_breakpoint": "moviechat",
    "lvspec_mvbench": "mvbench",
    "lvspec_mlvu": "mlvu",
    "lvspec_longvideobench": "longvideobench",
}
# The fields each task's prompt and score read: process_docs (and `lvspec-eval dry-run`) check that
# every row has them before any model runs. A multiple-choice task lists its options' field, so a
# prompt without options cannot be built.
TASK_FIELDS = {
    "lvspec_videomme": ("videoID", "question", "options", "answer", "question_id", "duration", "domain",
                        "sub_category", "task_type"),
    **{f"vdc_{d}": ("video_name", "caption", "qa_list") for d in ("detailed", "camera", "short", "background",
                                                                    "main_object")},
    "vdd": ("video_name", "question", "answer"),
    "vdd_facts": ("video_name", "question", "answer"),
    "vdc_detailed_facts": ("video_name", "caption"),
    "lvspec_moviechat_global": ("video_name", "question", "answer"),
    "lvspec_moviechat_breakpoint": ("video_name", "question", "answer", "time"),
    "lvspec_mvbench": ("video", "question", "candidates", "answer", "sub_task"),
    "lvspec_mlvu": ("video_name", "question", "candidates", "answer", "task_type"),
    "lvspec_longvideobench": ("video_path", "question", "candidates", "correct_choice", "id", "duration_group",
                              "question_category"),
}
# Tasks that read part of their benchmark's rows: task -> (doc field, value). The layouts set the field
# (VDC's dimension, MovieChat's mode); rows without it (the hub rows merged, as lmms-eval loads them)
# belong to every task of the benchmark, as lmms-eval asks them.
TASK_PART = {
    **{f"vdc_{d}": ("dimension", d) for d in vdc.VDC_DIMENSIONS},
    "vdc_detailed_facts": ("dimension", "detailed"),
    **{f"lvspec_moviechat_{m}": ("mode", m) for m in moviechat.MOVIECHAT_MODES},
}
# What else a task's rows must satisfy: the answer names one of the options (else no reply scores).
TASK_RULES = {
    "lvspec_videomme": (letter_within("answer", "options"),),
    "lvspec_mvbench": (answer_among("candidates", "answer"),),
    "lvspec_mlvu": (letter_within("answer", "candidates"),),
    "lvspec_longvideobench": (index_within("correct_choice", "candidates"),),
}
GROUPS = {"vdc": tuple(t for t in TASKS if t.startswith("vdc_") and not t.endswith("_facts"))}


def get(name: str) -> Benchmark:
    if name not in BENCHMARKS:
        raise ValueError(f"unknown benchmark {name!r}; known: {', '.join(BENCHMARKS)}")
    return BENCHMARKS[name]


def hf_home() -> Path:
    return Path(os.path.expanduser(os.environ.get("HF_HOME", DEFAULT_HF_HOME)))


def data_root(bench: Benchmark) -> tuple[Path, bool]:
    """(the benchmark's folder, whether it came from its environment variable)."""
    value = os.environ.get(bench.env_var, "").strip()
    if value:
        return Path(value).expanduser(), True
    return hf_home() / bench.cache_dir, False


def video_candidates(bench: Benchmark, doc: dict) -> list[Path]:
    """Paths the doc's video may have, the expected one first."""
    name = str(doc[bench.video_key])
    if bench.video_ext and not name.endswith(bench.video_ext):
        name += bench.video_ext
    root = data_root(bench)[0] / bench.video_dir
    folder = bench.folder_of(doc[bench.config_key]) if bench.folder_of else ""
    bases = [root / folder] + [root / prefix / folder for prefix in bench.alt_prefixes]
    bases += [data_root(bench)[0] / alt / folder for alt in bench.alt_video_dirs]
    paths = [base / name for base in bases]
    for old, new in VIDEO_SUFFIX_SWAPS:
        if name.endswith(old):
            paths.append(bases[0] / (name[: -len(old)] + new))
    return paths


def video_path(bench: Benchmark, doc: dict) -> str:
    """The doc's video file: the first candidate that exists, else the expected path.

    A missing video is returned anyway (never sys.exit): the model then fails this sample alone
    with "<path>: no such file" in its error and stats, and the run goes on.
    """
    candidates = video_candidates(bench, doc)
    return str(next((p for p in candidates if p.is_file()), candidates[0]))


# ---- annotations ---------------------------------------------------------------------------------

def layouts_of(bench: Benchmark) -> tuple[Layout, ...]:
    return bench.layouts or (flat_layout(bench.split),)


def local_rows(bench: Benchmark, root: Path) -> list[dict]:
    """All rows under an environment-variable root, read by the first of the benchmark's layouts found.

    No annotations at all is a ValueError naming the layouts looked for.
    """
    for layout in layouts_of(bench):
        files = layout.find(root)
        if files:
            logger.info(f"{bench.name}: {root} read as the {layout.name} layout ({layout.source}): "
                        f"{len(files)} annotation file(s)")
            return [doc for path in files for doc in layout.read(path)]
    raise ValueError(f"{bench.env_var}={str(root)!r}: no annotations for {bench.name}; "
                     + accepted(layouts_of(bench)))


def hub_rows(bench: Benchmark) -> list[dict]:
    """All rows of the hub dataset, as the built-in task loads it (the local datasets cache first),
    at the revision lmms-eval's YAML pins, if it pins one."""
    import datasets

    rows = []
    for config in bench.configs:
        data = datasets.load_dataset(bench.hub_id, config, split=bench.split, revision=bench.revision)
        source = f"{bench.hub_id}@{bench.revision or 'main'} {config or ''}/{bench.split}".replace(" /", " ")
        rows += tag([_with_config(dict(row), bench, config) for row in data], source)
    return [bench.hub_convert(row) for row in rows] if bench.hub_convert else rows


def _with_config(row: dict, bench: Benchmark, config: str | None) -> dict:
    if config is not None:
        row[bench.config_key] = config
    return row


def load_rows(bench: Benchmark) -> list[dict]:
    root, from_env = data_root(bench)
    if from_env:
        if not root.is_dir():
            raise ValueError(f"{bench.env_var}={str(root)!r} is not a folder")
        return local_rows(bench, root)
    return hub_rows(bench)


def task_rows(task: str, rows: list[dict]) -> list[dict]:
    """The rows task `task` asks (TASK_PART); all of them for a task that reads its benchmark whole."""
    if task not in TASK_PART:
        return rows
    key, value = TASK_PART[task]
    return files.rows_of(rows, key, value, task)


def process_docs(bench_name: str, dataset, required: tuple[str, ...], rules: tuple[Rule, ...] = (),
                 task: str | None = None):
    """lmms-eval process_docs: replace the YAML's placeholder split by this benchmark's rows,
    checked against the fields the task needs (`required`) and its `rules` before any model runs. `task` keeps
    that task's rows where a benchmark's files serve several (task_rows), before the check.

    The task YAMLs load a one-line placeholder file (a YAML cannot read an environment
    variable); the real rows are read here, where the environment is known. lmms-eval calls
    process_docs while it builds the tasks, before the model generates anything, so a SchemaError
    here stops the run at start.
    """
    import datasets

    bench = get(bench_name)
    rows = load_rows(bench)
    rows = task_rows(task, rows) if task and rows else rows
    if not rows:
        raise ValueError(f"{bench_name}: the annotations hold no rows")
    check_rows(bench_name, rows, required, layouts_of(bench), rules)
    return datasets.Dataset.from_list(rows)
