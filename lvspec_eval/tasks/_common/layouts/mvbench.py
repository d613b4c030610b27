"""MVBench: one annotation file per sub-task, `json/<sub_task>.json`, records {video, question,
candidates, answer: option text} (the sub-task is the file's name). The authors publish the
annotations only in their hub dataset (OpenGVLab/MVBench, linked from github.com/OpenGVLab/
Ask-Anything video_chat2), and lmms-eval's `mvbench` reads that same dataset (one config per
sub-task, its data_files json/<sub_task>.json): the two layouts are one.
"""
from __future__ import annotations

from pathlib import Path

from loguru import logger

from ..schema import Layout, reader

SUB_TASK_KEY = "sub_task"


def finder(configs: tuple[str, ...]):
    """json/<sub_task>.json for each sub-task present; a warning names the absent ones."""
    def find(root: Path) -> list[Path]:
        files = [root / "json" / f"{c}.json" for c in configs]
        present = [p for p in files if p.is_file()]
        absent = [p.stem for p in files if not p.is_file()]
        if present and absent:
            logger.warning(f"mvbench: no annotations for {len(absent)} of {len(configs)} sub-tasks under {root} "
                           f"({', '.join(absent)}); running the others")
        return present
    return find


def with_sub_task(row: dict, path: Path) -> dict:
    row[SUB_TASK_KEY] = path.stem
    return row


def layouts(configs: tuple[str, ...]) -> tuple[Layout, ...]:
    return (Layout(
        "authors",
        "hub dataset OpenGVLab/MVBench, revision `video` as lmms-eval 0.7.3's mvbench YAML pins "
        "(json/<sub_task>.json; the authors' release, which lmms-eval reads too)",
        "<root>/\n  json/<sub_task>.json   [{video, question, candidates, answer: option text}]\n"
        "  <sub-task folder>/<video>   lmms-eval's DATA_LIST: ssv2_video_mp4/, clevrer/video_validation/, ...",
        finder(configs),
        reader(with_sub_task),
    ),)
