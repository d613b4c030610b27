"""The README and docs a reader meets first: current figures first, and every file they name exists.

docs/RESULTS_HISTORY.md is exempt from the path check: it keeps superseded records as they were written.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
CURRENT_FIRST = ("RESULTS.md", "JUDGE.md", "GPU.md", "DEMO.md", "METHODS.md")  # the docs that quote figures
CHECKED = [ROOT / "README.md", ROOT / "results" / "README.md", ROOT / "scripts" / "realpair" / "README.md"] + [
    p for p in sorted(DOCS.glob("*.md")) if p.name != "RESULTS_HISTORY.md"]
# A file in the project named in prose: lvspec_eval/demo/world.py, scripts/gpu_check.py, decoding/loop.py, ...
PATH = re.compile(r"(?<![\w./-])((?:lvspec_eval|scripts|judges|tests|decoding|backends|measure|reporting|models|"
                  r"training|demo)/[\w/.-]*\.(?:py|sh))\b")
LINK = re.compile(r"\]\(([^)#\s]+)(?:#[^)]*)?\)")


def headings(text: str) -> list[str]:
    return [line[3:].strip() for line in text.splitlines() if line.startswith("## ")]


def named_paths(text: str) -> set[str]:
    return set(PATH.findall(text))


def test_named_paths_finds_project_files_in_prose():
    text = "see `lvspec_eval/demo/run.py`, decoding/loop.py and (scripts/realpair/build.sh); not a/scripts/x.py"
    assert named_paths(text) == {"lvspec_eval/demo/run.py", "decoding/loop.py", "scripts/realpair/build.sh"}


@pytest.mark.parametrize("name", CURRENT_FIRST)
def test_a_doc_that_quotes_figures_opens_with_its_current_figures(name):
    text = (DOCS / name).read_text()
    first = headings(text)[:1]
    if first:  # sectioned docs: "Current figures" is the first section
        assert first == ["Current figures"], f"docs/{name}: first section {first}, not 'Current figures'"
    else:  # a one-section page: a current-figures paragraph within its opening lines
        assert "Current figures" in "\n".join(text.splitlines()[:12]), f"docs/{name}: no current figures at the top"
    block = text.split("Current figures", 1)[1].split("\n## ", 1)[0]
    assert re.search(r"20\d\d-\d\d-\d\d", block), f"docs/{name}: current figures without a date"


def test_results_is_short_and_links_its_history():
    text = (DOCS / "RESULTS.md").read_text()
    assert len(text.splitlines()) <= 200 and "(RESULTS_HISTORY.md)" in text
    assert (DOCS / "RESULTS_HISTORY.md").is_file()


@pytest.mark.parametrize("doc", CHECKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_file_a_doc_names_exists(doc):
    missing = sorted(p for p in named_paths(doc.read_text())
                     if not (ROOT / p).exists() and not (ROOT / "lvspec_eval" / p).exists())
    assert not missing, f"{doc.relative_to(ROOT)} names files that do not exist: {missing}"


@pytest.mark.parametrize("doc", CHECKED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(doc):
    links = [t for t in LINK.findall(doc.read_text()) if "://" not in t and not t.startswith("mailto:")]
    broken = sorted(t for t in links if not (doc.parent / t).exists())
    assert not broken, f"{doc.relative_to(ROOT)} links to missing files: {broken}"
