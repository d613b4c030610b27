"""docs/ARGS.md, the model_args reference, names every argument the code accepts and no other."""
from __future__ import annotations

import re
from pathlib import Path

from lvspec_eval.models.args import documented_arguments

ARGS_DOC = Path(__file__).resolve().parent.parent / "docs" / "ARGS.md"
README = ARGS_DOC.parent.parent / "README.md"


def table_arguments(text: str) -> set[str]:
    """The `names` in the first column of every markdown table row."""
    names = set()
    for line in text.splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([a-z_0-9]+)`", line.split("|")[1]))
    return names


def test_the_reference_lists_exactly_the_arguments_the_code_accepts():
    documented, accepted = table_arguments(ARGS_DOC.read_text()), set(documented_arguments())
    assert not accepted - documented, f"accepted but not in docs/ARGS.md: {sorted(accepted - documented)}"
    assert not documented - accepted, f"in docs/ARGS.md but not accepted: {sorted(documented - accepted)}"


def test_the_readme_first_run_table_is_a_subset_and_links_the_reference():
    readme = README.read_text()
    assert table_arguments(readme.split("## Commands")[0]) <= set(documented_arguments())
    assert "docs/ARGS.md" in readme and len(readme.splitlines()) <= 200
