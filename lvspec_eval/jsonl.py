"""The package's one reader of JSON-lines files: stats files (resume, the report), lmms-eval's samples
files (the report, the judge), train-sparrow's file of target answers.

These files are appended a line at a time by processes that may be killed mid-write, and their writers
keep non-ASCII text raw (json.dumps(ensure_ascii=False)). So the bytes are split on b"\\n" only
(str.splitlines would also cut at U+2028, U+2029 and U+0085 inside an answer), each line is decoded on
its own (a last line cut inside a multi-byte character cannot fail the lines before it), and a last line
without its newline is no record (that sample never completed): it is skipped, with one warning naming
the file. Damage inside the file (a line that is not UTF-8 or not JSON) is a ValueError naming the line.
It imports nothing of the package, so every room may use it (docs/ARCHITECTURE.md).
"""
from __future__ import annotations

import json
import logging
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)


def complete_lines(data: bytes, path, warn: Callable[[str], object] = log.warning) -> list[str]:
    """The newline-terminated lines of a file's bytes, each decoded as UTF-8; `warn` (the caller's logger)
    says once that an unterminated last line was left out."""
    lines = data.split(b"\n")
    if lines[-1]:
        warn(f"{path} ends with an incomplete line ({len(lines[-1])} bytes, what a killed writer leaves): not read")
    return [_decoded(line, path, number) for number, line in enumerate(lines[:-1], 1)]


def _decoded(line: bytes, path, number: int) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}:{number}: not UTF-8 ({err.reason} at byte {err.start})") from err


def parse_lines(lines: list[str], path) -> list[tuple[int, dict]]:
    """(line number, object) of each non-blank line; a ValueError naming the line that is not JSON."""
    out = []
    for number, line in enumerate(lines, 1):
        if line.strip():
            try:
                out.append((number, json.loads(line)))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not JSON ({err.msg}); expected one JSON object per line") from err
    return out


def read_jsonl(path: str | Path, warn: Callable[[str], object] = log.warning) -> list[dict]:
    """The objects of a JSON-lines file, one per complete line (see the module's docstring)."""
    return [obj for _, obj in parse_lines(complete_lines(Path(path).read_bytes(), path, warn), path)]
