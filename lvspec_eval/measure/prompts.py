"""Text-only prompts for `lvspec-eval bench --prompts`: a built-in set, or a file of the user's.

Text prompts let the bench run on a checkpoint pair whose language models are real but whose
vision towers are not (such as the one `scripts/realpair/build.sh` builds): only the text
path means anything there. A text sample has no reference answer; the bench checks only that a
method says exactly what vanilla greedy decoding says.
"""
from __future__ import annotations

import json
from pathlib import Path

# Coding and explanation requests of the kind a code-instruct model answers at length: long
# enough answers (hundreds of tokens) that 128 new tokens never run out on an early EOS.
BUILTIN = (
    "Write a Python function that checks whether a string is a palindrome, ignoring case and punctuation.",
    "Explain how a hash table handles collisions, and compare chaining with open addressing.",
    "Write a Python function that merges two sorted lists into one sorted list without using sort().",
    "Explain how binary search works and why it runs in logarithmic time.",
    "Write a Python class for a stack with push, pop, peek and is_empty methods, with docstrings.",
    "Explain the difference between a process and a thread, with an example of when to use each.",
    "Write a Python function that returns the n-th Fibonacci number using memoization.",
    "Explain how garbage collection by reference counting works in Python and where it fails.",
    ("Write a SQL query that returns the five customers with the highest total order value, "
     "given tables customers(id, name) and orders(id, customer_id, amount)."),
    "Explain what a race condition is and show how a lock prevents one in Python.",
    "Write a Python function that parses a CSV line with quoted fields into a list of strings.",
    "Explain how gradient descent finds the minimum of a function, step by step.",
)

_FILE_FORMATS = "one prompt per line, or JSONL with a string 'prompt' field per line"
# named sets shipped with the package (prompt_sets/<name>.jsonl): `heldout` was written before the
# adaptive policy was tuned and is never tuned on (issue 53); speed headlines come from it
SETS_DIR = Path(__file__).parent / "prompt_sets"


def set_names() -> list[str]:
    """`builtin` and the shipped sets, by the names --prompts takes."""
    return ["builtin", *sorted(p.stem for p in SETS_DIR.glob("*.jsonl"))]


def load(source: str) -> list[str]:
    """`builtin`, a shipped set's name (`heldout`), or a file path: one prompt per line, or JSONL (one
    object with a `prompt` per line).

    A file whose first non-blank line starts with '{' is read as JSONL. Blank lines are skipped.
    Raises ValueError naming the file (and line) when it is missing, empty or malformed.
    """
    if source == "builtin":
        return list(BUILTIN)
    path = SETS_DIR / f"{source}.jsonl" if source in set_names() else Path(source)
    if not path.is_file():
        raise ValueError(f"--prompts {source!r}: no such file; expected one of {', '.join(set_names())} "
                         f"or a file ({_FILE_FORMATS})")
    lines = [(k, line.strip()) for k, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)]
    lines = [(k, line) for k, line in lines if line]
    if not lines:
        raise ValueError(f"--prompts {source!r}: the file holds no prompts ({_FILE_FORMATS})")
    if lines[0][1].startswith("{"):
        return [_jsonl_prompt(source, k, line) for k, line in lines]
    return [line for _, line in lines]


def _jsonl_prompt(source: str, line_no: int, line: str) -> str:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as err:
        raise ValueError(f"--prompts {source!r} line {line_no}: not valid JSON ({err.msg}); the file was read "
                         f"as JSONL because its first line starts with '{{'") from None
    prompt = record.get("prompt") if isinstance(record, dict) else None
    if not isinstance(prompt, str) or not prompt.strip():
        raise ValueError(f"--prompts {source!r} line {line_no}: expected an object with a non-empty string "
                         f"'prompt' field, got {line[:80]!r}")
    return prompt.strip()
