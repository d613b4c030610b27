"""LongVideoBench (validation): the task's fields are the authors' (`candidates` a list of option
texts, `correct_choice` the index of the right one).

- authors: `lvb_val.json` + `videos/` as released with the benchmark (github.com/longvideobench/
  LongVideoBench, longvideobench/longvideobench_dataset.py at 2aa4f91 reads di["candidates"],
  di["correct_choice"], videos/<video_path>, subtitles/<subtitle_path>).
- hub: the rows of the hub dataset lmms-eval's `longvideobench_val_v` loads (longvideobench/
  LongVideoBench, split validation), whose options are the columns option0..option4 with "N/A"
  for unused ones (lmms-eval 0.7.3 tasks/longvideobench/utils.py), saved as parquet.
"""
from __future__ import annotations

from pathlib import Path

from ..schema import Layout, globbed, reader

MAX_OPTIONS = 5  # option0 .. option4
UNUSED = "N/A"


def from_option_columns(row: dict, path: Path | None = None) -> dict:
    """Hub row -> the authors' fields: option0..4 (minus "N/A") become `candidates`."""
    if "candidates" not in row:
        found = [row.pop(f"option{i}", None) for i in range(MAX_OPTIONS)]
        row["candidates"] = [o for o in found if o is not None and o != UNUSED]
    return row


AUTHORS = Layout(
    "authors",
    "github.com/longvideobench/LongVideoBench @2aa4f91 (lvb_val.json, read by longvideobench_dataset.py)",
    "<root>/\n  lvb_val.json        [{video_path, question, candidates: [..], correct_choice: int, id, ...}]\n"
    "  videos/<video_path>\n  subtitles/ (unused: video only)",
    globbed("lvb_val.json"),
    reader(),
)
HUB = Layout(
    "hub",
    "hub dataset longvideobench/LongVideoBench, split validation (lmms-eval 0.7.3 longvideobench_val_v)",
    "<root>/\n  validation-*.parquet | data/validation-*.parquet   [{..., option0..option4, correct_choice}]\n"
    "  videos/<video_path>",
    globbed("validation-*.parquet", "data/validation-*.parquet"),
    reader(from_option_columns),
)
LAYOUTS = (AUTHORS, HUB)
