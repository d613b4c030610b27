"""Annotation layouts and the schema check that runs before any model does.

A benchmark's annotations come in more than one real layout: the authors' own release (their
GitHub or hub files, field names and folders as they publish them) and the hub dataset that
lmms-eval's built-in task reads (a local snapshot of that repository). A `Layout` says where one
layout's annotation files sit under a data root (`find`) and turns one file into docs with the
task's field names (`read`), each doc carrying its provenance (file and row).

`check_rows` then makes sure every doc has the fields its task's prompt and score need, before
lmms-eval builds a single request: a multiple-choice row without options, a row without an
answer or a video name stops the run with a SchemaError naming the benchmark, the file, the row,
the missing fields and the layouts the task accepts. A missing *video file* is not a schema
problem: it fails its sample alone, in the model (benchmarks.video_path).
"""
from __future__ import annotations

import json
import textwrap
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

# Every doc carries where it came from (shown in SchemaErrors and logged with each sample).
SOURCE_FILE, SOURCE_ROW = "lvspec_file", "lvspec_row"
MAX_LISTED = 5  # problems quoted in one SchemaError


class SchemaError(ValueError):
    """A row lacks a field its task needs (or holds it in a form the task cannot read)."""


@dataclass(frozen=True)
class Layout:
    name: str  # short: "authors", "hub"
    source: str  # the exact release followed: repository, commit, path
    tree: str  # the folder layout under the data root, as a small text tree
    find: Callable[[Path], list[Path]]  # this layout's annotation files under a root; [] if absent
    read: Callable[[Path], list[dict]]  # one file -> docs in the task's fields, with provenance

    def describe(self) -> str:
        return f"- {self.name}: {self.source}\n{textwrap.indent(self.tree.strip(chr(10)), '    ')}"


def globbed(*patterns: str) -> Callable[[Path], list[Path]]:
    """A `find` that returns the files matching any pattern under the root, sorted, once each."""
    def find(root: Path) -> list[Path]:
        return sorted({p for pattern in patterns for p in root.glob(pattern) if p.is_file()})
    return find


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


def reader(convert: Callable[[dict, Path], dict] | None = None) -> Callable[[Path], list[dict]]:
    """A `read` for files of row records: each row converted (row, file -> doc), then tagged."""
    def read(path: Path) -> list[dict]:
        rows = read_rows(path)
        if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
            raise SchemaError(f"{path}: expected a list of records, got {type(rows).__name__}")
        return tag([convert(dict(r), path) if convert else dict(r) for r in rows], str(path))
    return read


def tag(docs: list[dict], source: str) -> list[dict]:
    """Record each doc's provenance: the file (or hub dataset) and its row number there."""
    for row, doc in enumerate(docs):
        doc[SOURCE_FILE], doc[SOURCE_ROW] = source, row
    return docs


def is_missing(value) -> bool:
    """Absent, None, blank or an empty list: nothing a prompt or a score could use."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    return isinstance(value, (list, tuple, dict)) and len(value) == 0


def missing_fields(doc: dict, required: Iterable[str]) -> list[str]:
    return [field for field in required if is_missing(doc.get(field))]


Rule = Callable[[dict], "str | None"]  # a doc -> what is wrong with it, or None


def answer_among(options: str, answer: str) -> Rule:
    """The answer, given as an option's text, is one of the options (else no letter is right)."""
    def rule(doc: dict) -> str | None:
        if doc.get(answer) not in list(doc.get(options) or []):
            return f"{answer} {doc.get(answer)!r} is not one of its {options}"
        return None
    return rule


def index_within(index: str, options: str) -> Rule:
    """The answer, given as an option's index, points at one of the options."""
    def rule(doc: dict) -> str | None:
        value, count = doc.get(index), len(doc.get(options) or [])
        if not isinstance(value, int) or not 0 <= value < count:
            return f"{index} {value!r} is not an index of its {count} {options}"
        return None
    return rule


def letter_within(letter: str, options: str) -> Rule:
    """The answer, given as a letter, names one of the options (A for the first)."""
    def rule(doc: dict) -> str | None:
        value, count = str(doc.get(letter)), len(doc.get(options) or [])
        if len(value) != 1 or not 0 <= ord(value.upper()) - ord("A") < count:
            return f"{letter} {value!r} is not the letter of one of its {count} {options}"
        return None
    return rule


def row_problems(rows: Sequence[dict], required: Sequence[str], limit: int | None = None,
                 rules: Sequence[Rule] = ()) -> list[str]:
    """One line per row that lacks a required field ('file row N: missing a, b') or breaks a rule
    (checked once the fields are there); the first `limit` of them."""
    problems = []
    for i, doc in enumerate(rows):
        missing = missing_fields(doc, required)
        found = [f"missing {', '.join(missing)}"] if missing else [p for p in (r(doc) for r in rules) if p]
        if found:
            problems.append(f"{where(doc, i)}: {'; '.join(found)}")
            if limit is not None and len(problems) >= limit:
                break
    return problems


def where(doc: dict, index: int) -> str:
    return f"{doc.get(SOURCE_FILE, '<rows>')} row {doc.get(SOURCE_ROW, index)}"


def accepted(layouts: Sequence[Layout]) -> str:
    return "accepted layouts:\n" + "\n".join(layout.describe() for layout in layouts)


def check_rows(benchmark: str, rows: Sequence[dict], required: Sequence[str], layouts: Sequence[Layout],
               rules: Sequence[Rule] = ()) -> None:
    """Raise SchemaError if any row lacks a field of `required` (the task's prompt and score fields)
    or breaks one of `rules` (an answer that is none of the options)."""
    problems = row_problems(rows, required, rules=rules)
    if not problems:
        return
    shown = "\n".join(f"  {p}" for p in problems[:MAX_LISTED])
    more = f"\n  ... and {len(problems) - MAX_LISTED} more rows" if len(problems) > MAX_LISTED else ""
    raise SchemaError(f"{benchmark}: {len(problems)} of {len(rows)} rows do not fit the task (it needs "
                      f"{', '.join(required)}):\n{shown}{more}\n{accepted(layouts)}")
