"""Old module paths users type keep working after the package's reorganisation: the same module
object, with a DeprecationWarning naming the new path."""
from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import lvspec_eval


@pytest.mark.parametrize("old,new", sorted(lvspec_eval.MOVED.items()))
def test_every_old_name_is_the_new_module(old, new):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {new}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(new) and module.__name__ == new and module.__spec__.name == new


def test_a_fresh_interpreter_warns_with_the_new_name():
    code = ("import warnings; warnings.simplefilter('error', DeprecationWarning)\n"
            "try:\n    import lvspec_eval.check\nexcept DeprecationWarning as w:\n    print(w)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "lvspec_eval.check moved to lvspec_eval.reporting.check: import lvspec_eval.reporting.check instead"


def test_from_import_of_an_old_name_works():
    sys.modules.pop("lvspec_eval.check", None)
    vars(lvspec_eval).pop("check", None)  # an earlier test's import left it as the package's attribute
    with pytest.warns(DeprecationWarning, match="lvspec_eval.reporting.check"):
        from lvspec_eval import check
    from lvspec_eval.reporting import check as new
    assert check is new and check.Gate is new.Gate


def test_unknown_names_are_still_errors():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("lvspec_eval.no_such_module")


def test_a_moved_name_in_a_subpackage_is_looked_up_in_that_subpackage(monkeypatch):
    """`lvspec_eval.demo.cli` (made up) is no file of demo/, so its alias answers, although the top
    package has a cli.py: the finder looks for the old file where the old name put it."""
    monkeypatch.setitem(lvspec_eval.MOVED, "lvspec_eval.demo.cli", "lvspec_eval.reporting.check")
    monkeypatch.delitem(sys.modules, "lvspec_eval.demo.cli", raising=False)
    with pytest.warns(DeprecationWarning, match="lvspec_eval.demo.cli moved to lvspec_eval.reporting.check"):
        module = importlib.import_module("lvspec_eval.demo.cli")
    assert module is importlib.import_module("lvspec_eval.reporting.check")
    sys.modules.pop("lvspec_eval.demo.cli", None)
