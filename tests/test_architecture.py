"""The import rules that keep the package's rooms apart (docs/ARCHITECTURE.md), read from the code.

Every import statement of every module counts, wherever it stands (module level, inside a function,
under `if TYPE_CHECKING:`), and so does `importlib.import_module("...")` with a literal name:
- decoding/ imports only itself and backends/; backends/ and jsonl.py import only themselves;
- training/ is imported by nothing in the package (the command line reaches it by name);
- no import cycle between the modules of `lvspec_eval` and `judges`, nor between their rooms;
- docs/ARCHITECTURE.md's arrows between rooms are the code's.
The checker is tested on a hand-made package that breaks each rule.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("lvspec_eval", "judges")
# room -> the other rooms it may import (a room: lvspec_eval.<first part>, or judges)
MAY_IMPORT = {
    "lvspec_eval.backends": set(),
    "lvspec_eval.decoding": {"lvspec_eval.backends"},
    "lvspec_eval.jsonl": set(),  # the JSON-lines reader every room may use
}
IMPORTED_BY_NONE = ("lvspec_eval.training",)  # leaves: only the command line (by name) and tests use them


def module_names(root: Path, packages=PACKAGES) -> dict[str, Path]:
    """Dotted name -> file, for every module of `packages` under root (a package is its __init__)."""
    out = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _targets(module: str, is_package: bool, node: ast.AST, known: dict) -> list[str]:
    """The modules (or packages) one import statement names."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.Call):  # importlib.import_module("a.b")
        return [node.args[0].value]
    base = module if is_package else module.rpartition(".")[0]
    for _ in range(node.level - 1):
        base = base.rpartition(".")[0]
    source = ".".join(p for p in (base if node.level else "", node.module or "") if p)
    # `from package import name`: the submodule when `name` is one, else the package itself
    return [f"{source}.{alias.name}" if f"{source}.{alias.name}" in known else source for alias in node.names]


def _is_import(node: ast.AST) -> bool:
    if isinstance(node, (ast.Import, ast.ImportFrom)):
        return True
    return (isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and len(node.args) == 1 and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str))


def import_graph(root: Path, packages=PACKAGES) -> dict[str, set[str]]:
    """Module -> the modules of `packages` it imports (every statement, lazy ones included)."""
    known = module_names(root, packages)
    graph = {}
    for module, path in known.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        targets = (t for node in ast.walk(tree) if _is_import(node)
                   for t in _targets(module, path.name == "__init__.py", node, known))
        graph[module] = {t for t in targets if t.split(".")[0] in packages and t != module}
    return graph


def room(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "lvspec_eval" else parts[0]


def room_graph(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """Room -> the other rooms its modules import (the drawing in docs/ARCHITECTURE.md)."""
    out: dict[str, set[str]] = {}
    for module, targets in graph.items():
        out.setdefault(room(module), set()).update(room(t) for t in targets)
    return {r: targets - {r} for r, targets in out.items()}


def rule_violations(graph: dict[str, set[str]], may_import=MAY_IMPORT, imported_by_none=IMPORTED_BY_NONE) -> list[str]:
    """One line per import that breaks a rule."""
    out = []
    for module, targets in sorted(graph.items()):
        home = room(module)
        for target in sorted(targets):
            there = room(target)
            if there == home:
                continue
            if home in may_import and there not in may_import[home]:
                allowed = ", ".join(sorted(may_import[home])) or "nothing outside it"
                out.append(f"{module} imports {target}: {home} may import {allowed}")
            if there in imported_by_none:
                out.append(f"{module} imports {target}: nothing in the package imports {there}")
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles: strongly connected groups of more than one module (Tarjan, iterative)."""
    index, low, stack, on_stack, out, counter = {}, {}, [], set(), [], [0]

    def visit(start: str) -> None:
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter[0]
        counter[0] += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    group = []
                    while not group or group[-1] != node:
                        group.append(stack.pop())
                        on_stack.discard(group[-1])
                    if len(group) > 1:
                        out.append(sorted(group))
            elif child not in index:
                index[child] = low[child] = counter[0]
                counter[0] += 1
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph.get(child, ())))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(out)


# ---- the package ----------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def graph():
    return import_graph(ROOT)


def test_the_graph_sees_lazy_imports(graph):
    """A sanity check of the reader: imports inside functions are edges (training/sparrow.py reads
    the demo world inside demo_tasks)."""
    assert "lvspec_eval.demo.world" in graph["lvspec_eval.training.sparrow"]
    assert "lvspec_eval.backends.base" in graph["lvspec_eval.decoding.loop"]


def test_decoding_and_backends_keep_to_their_rooms(graph):
    assert rule_violations(graph) == []


def test_no_import_cycles(graph):
    assert cycles(graph) == []


def test_no_cycles_between_rooms(graph):
    """The rooms form layers: no room imports, even through others, a room that imports it."""
    assert cycles(room_graph(graph)) == []


def documented_arrows(path: Path) -> dict[str, set[str]]:
    """The `room -> rooms` block of docs/ARCHITECTURE.md (the fenced block after "checks them")."""
    text = path.read_text(encoding="utf-8")
    block = text[text.index("checks them"):].split("```")[1]
    arrows = {}
    for line in filter(None, (x.strip() for x in block.splitlines())):
        name, _, targets = line.partition("->")
        arrows[name.strip()] = {t.strip() for t in targets.split(",") if t.strip()}
    return arrows


def test_the_documented_drawing_is_the_code(graph):
    """docs/ARCHITECTURE.md's arrows are the code's: an import that adds or removes an arrow between
    rooms must be written there (and so be seen in review)."""
    code = {r: t for r, t in room_graph(graph).items() if t}
    documented = documented_arrows(ROOT / "docs" / "ARCHITECTURE.md")
    assert {r: t for r, t in documented.items() if t} == code, "update docs/ARCHITECTURE.md's arrows block"
    assert all(r in room_graph(graph) for r in documented), "a room in docs/ARCHITECTURE.md that has no module"


def test_the_judge_types_import_without_openai():
    """judges/types.py (shared by client.py and facts.py) and facts.py need no HTTP client."""
    code = "import sys, judges.types, judges.facts; print('openai' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT)
    assert out.stdout.strip() == "False"


def test_nothing_shipped_uses_the_research_scripts():
    """scripts/research/ is outside the product: no module, test or build file names it."""
    files = [*ROOT.joinpath("lvspec_eval").rglob("*.py"), *ROOT.joinpath("judges").rglob("*.py"),
             *ROOT.joinpath("tests").glob("*.py"), ROOT / "Makefile", ROOT / "pyproject.toml"]
    named = [f for f in files if f.name != Path(__file__).name and "scripts/research" in f.read_text(encoding="utf-8")]
    assert named == []


# ---- the checker, on a package made to break the rules ---------------------------------------------

def _write(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


BROKEN = {
    "lvspec_eval/__init__.py": "",
    "lvspec_eval/backends/__init__.py": "",
    "lvspec_eval/backends/base.py": "from ..decoding.types import Draft\n",
    "lvspec_eval/decoding/__init__.py": "",
    "lvspec_eval/decoding/types.py": "Draft = object\n",
    "lvspec_eval/decoding/loop.py": ("from ..backends import base\n\n\ndef run():\n"
                                     "    from ..demo import world  # lazy: still an import\n"),
    "lvspec_eval/demo/__init__.py": "",
    "lvspec_eval/demo/world.py": "import importlib\n\nmodels = importlib.import_module('lvspec_eval.training.demo')\n",
    "lvspec_eval/training/__init__.py": "",
    "lvspec_eval/training/demo.py": "",
    "judges/__init__.py": "",
    "judges/client.py": "def score():\n    from judges.facts import score_facts\n",
    "judges/facts.py": "from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from judges.client import score\n",
}


def test_the_checker_finds_each_broken_rule(tmp_path):
    _write(tmp_path, BROKEN)
    graph = import_graph(tmp_path)
    assert rule_violations(graph) == [
        "lvspec_eval.backends.base imports lvspec_eval.decoding.types: lvspec_eval.backends may import nothing outside it",
        "lvspec_eval.decoding.loop imports lvspec_eval.demo.world: lvspec_eval.decoding may import lvspec_eval.backends",
        "lvspec_eval.demo.world imports lvspec_eval.training.demo: nothing in the package imports lvspec_eval.training",
    ]
    assert cycles(graph) == [["judges.client", "judges.facts"]]  # one lazy import, one under TYPE_CHECKING
    assert cycles(room_graph(graph)) == [["lvspec_eval.backends", "lvspec_eval.decoding"]]


def test_the_checker_passes_a_package_that_keeps_the_rules(tmp_path):
    fixed = {**BROKEN, "lvspec_eval/backends/base.py": "", "lvspec_eval/demo/world.py": "",
             "lvspec_eval/decoding/loop.py": "from ..backends import base\nfrom . import types\n",
             "judges/facts.py": "", "judges/client.py": "from judges.facts import *  # noqa\n"}
    _write(tmp_path, fixed)
    graph = import_graph(tmp_path)
    assert rule_violations(graph) == [] and cycles(graph) == []
    assert graph["lvspec_eval.decoding.loop"] == {"lvspec_eval.backends.base", "lvspec_eval.decoding.types"}
