"""Helpers the open-ended benchmarks' layouts share (vdc.py, vdd.py, moviechat.py): finding a layout's
files, recording a doc's provenance, and picking one task's rows."""
from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from ..schema import SOURCE_FILE, SOURCE_ROW


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


def provenance(doc: dict, path: Path, row: int | str) -> dict:
    doc[SOURCE_FILE], doc[SOURCE_ROW] = str(path), row
    return doc


def rows_of(rows: list[dict], key: str, value: str, where: str) -> list[dict]:
    """The rows of one task: those whose `key` is `value`, and those that do not say (`key` missing:
    the hub rows merged, asked by every task as lmms-eval asks them). No such row is a ValueError
    naming the values found."""
    mine = [r for r in rows if r.get(key) in (value, None)]
    if not mine:
        found = sorted({str(r.get(key)) for r in rows})
        raise ValueError(f"{where}: no rows with {key}={value!r} among the annotations (found: {', '.join(found)})")
    return mine
