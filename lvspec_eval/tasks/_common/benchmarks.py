"""Where each benchmark's annotations and videos live, and which video file a doc names.

One environment variable per benchmark, LVSPEC_<NAME>_ROOT, names a local folder laid out like
lmms-eval's own cache folder for that benchmark ($HF_HOME/<cache_dir>: the videos under the same
sub-folder the built-in task reads), with the annotations put beside them as <split>.jsonl,
<split>.json or <split>.parquet (or in the hub repository's own layout, e.g. Video-MME's
videomme/test-*.parquet). Without the variable the folder is $HF_HOME/<cache_dir> and the
annotations come from the hub dataset through the local datasets cache, as the built-in tasks
read them (HF_DATASETS_OFFLINE=1 keeps that offline once cached).

Why our own tasks at all: the built-in ones exit the whole run (sys.exit) on one missing video,
need a hub download, and some pick a random instruction per sample. Ours return the expected
path of a missing video, so the model fails that sample alone with the path in its error.
"""
from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from loguru import logger

from .builtin import DEFAULT_HF_HOME, builtin_utils

VIDEO_SUFFIX_SWAPS = ((".mp4", ".MP4"), (".mp4", ".mkv"))  # what the built-in tasks also try


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
    annotation_globs: tuple[str, ...] = ()  # extra layouts under the root; {config} and {split} filled
    folder_of: Callable[[str], str] | None = None  # config -> video sub-folder (MVBench)
    alt_prefixes: tuple[str, ...] = ()  # other sub-folders a video may sit under (MVBench's data0613)


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
              ".mp4", annotation_globs=("videomme/{split}-*.parquet",)),
    Benchmark("vdc", "LVSPEC_VDC_ROOT", "wchai/lmms_VDC_test", "test", "vdc_test", "Test_Videos", "video_name",
              ".mp4"),
    Benchmark("vdd", "LVSPEC_VDD_ROOT", "lmms-lab/VideoDetailDescription", "test", "videochatgpt", "Test_Videos",
              "video_name", ".mp4"),
    Benchmark("moviechat", "LVSPEC_MOVIECHAT_ROOT", "Enxin/lmms_MovieChat_test", "test", "moviechat_1k_test",
              "Test_Videos", "video_name"),
    Benchmark("mvbench", "LVSPEC_MVBENCH_ROOT", "OpenGVLab/MVBench", "train", "mvbench_video", "", "video",
              configs=MVBENCH_CONFIGS, annotation_globs=("json/{config}.json",), folder_of=_mvbench_folder,
              alt_prefixes=("data0613",)),
    Benchmark("mlvu", "LVSPEC_MLVU_ROOT", "sy1998/MLVU_dev", "test", "mlvu", "", "video_name"),
    Benchmark("longvideobench", "LVSPEC_LONGVIDEOBENCH_ROOT", "longvideobench/LongVideoBench", "validation",
              "datasets/longvideobench", "videos", "video_path", annotation_globs=("lvb_val.json",)),
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

def _local_files(bench: Benchmark, root: Path, config: str | None) -> list[Path]:
    patterns = [f"{bench.split}.jsonl", f"{bench.split}.json", f"{bench.split}.parquet"] if config is None else []
    patterns += [g.format(config=config, split=bench.split) for g in bench.annotation_globs]
    for pattern in patterns:
        found = sorted(root.glob(pattern))
        if found:
            return found
    return []


def read_rows(path: Path) -> list[dict]:
    """Rows of a .jsonl, .json (a list, or {"data": [...]}) or .parquet annotation file."""
    if path.suffix == ".jsonl":
        with open(path, encoding="utf-8") as f:
            return [json.loads(line) for line in f if line.strip()]
    if path.suffix == ".json":
        data = json.loads(path.read_text(encoding="utf-8"))
        return data["data"] if isinstance(data, dict) and "data" in data else data
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return pq.read_table(path).to_pylist()
    raise ValueError(f"{path}: annotation files must be .jsonl, .json or .parquet")


def local_rows(bench: Benchmark, root: Path) -> list[dict]:
    """All rows under an environment-variable root.

    A benchmark with several configs (MVBench's sub-tasks) may hold only some of them: the absent
    ones are skipped with a warning. No annotations at all is a ValueError naming what was looked for.
    """
    rows, absent = [], []
    for config in bench.configs:
        files = _local_files(bench, root, config)
        absent += [] if files else [config]
        for path in files:
            rows += [_tag(row, bench, config) for row in read_rows(path)]
    if not rows and absent:
        looked = ([f"{bench.split}.jsonl|json|parquet"] if bench.configs == (None,) else []) + [
            g.format(config="<config>" if bench.configs != (None,) else None, split=bench.split)
            for g in bench.annotation_globs]
        raise ValueError(f"{bench.env_var}={str(root)!r}: no annotations for {bench.name}; looked for "
                         f"{', '.join(looked)}")
    if absent and bench.configs != (None,):
        logger.warning(f"{bench.name}: no annotations for {len(absent)} of {len(bench.configs)} parts under "
                       f"{root} ({', '.join(map(str, absent))}); running the others")
    return rows


def hub_rows(bench: Benchmark) -> list[dict]:
    """All rows of the hub dataset, as the built-in task loads it (the local datasets cache first)."""
    import datasets

    rows = []
    for config in bench.configs:
        data = datasets.load_dataset(bench.hub_id, config, split=bench.split)
        rows += [_tag(dict(row), bench, config) for row in data]
    return rows


def _tag(row: dict, bench: Benchmark, config: str | None) -> dict:
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


def process_docs(bench_name: str, dataset):
    """lmms-eval process_docs: replace the YAML's placeholder split by this benchmark's rows.

    The task YAMLs load a one-line placeholder file (a YAML cannot read an environment
    variable); the real rows are read here, where the environment is known.
    """
    import datasets

    rows = load_rows(get(bench_name))
    if not rows:
        raise ValueError(f"{bench_name}: the annotations hold no rows")
    return datasets.Dataset.from_list(rows)
