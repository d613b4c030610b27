"""The kernel cache folder's machine-wide state (backends/linear_kernels.py): prepacked copies share one
memory budget across processes (issue 44, item 3), and the tests keep off the user's cache (item 5)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from lvspec_eval.backends import linear_kernels as lk


# One process: install the kernels (oneDNN wins everywhere) on six distinct weight shapes, once every
# process of the test is ready, print what it prepacked, and stay alive until told to exit, so that
# both hold their copies while the other installs.
CHILD = r"""
import json, os, sys, time
from pathlib import Path
import torch
from lvspec_eval.backends import linear_kernels as lk

folder = Path(sys.argv[1])
lk._available_bytes = lambda: int(os.environ["FAKE_AVAILABLE"])
lk.measure = lambda w, b, onednn: lk.ShapeCurve({m: 10.0 for m in lk.ROWS}, {m: 1.0 for m in lk.ROWS})
layers = [torch.nn.Linear(128, 128 + 32 * k) for k in range(6)]
(folder / f"ready-{os.getpid()}").touch()
while not (folder / "go").exists():
    time.sleep(0.01)
report = lk.install(layers, "auto")
print(json.dumps({"packed_mb": report.packed_mb if report else 0.0}), flush=True)
while not (folder / "exit").exists():
    time.sleep(0.01)
"""


def _run_two(tmp_path: Path, available: int) -> list[dict]:
    env = {**os.environ, "FAKE_AVAILABLE": str(available), "LVSPEC_CACHE_DIR": str(tmp_path / "cache"),
           "OMP_NUM_THREADS": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).parent.parent),
                                                                                 os.environ.get("PYTHONPATH")]))}
    script = tmp_path / "child.py"
    script.write_text(CHILD)
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    try:
        deadline = time.time() + 120
        while len(list(tmp_path.glob("ready-*"))) < 2 and time.time() < deadline:
            time.sleep(0.05)
        (tmp_path / "go").touch()  # both install at once
        lines = [p.stdout.readline() for p in procs]
    finally:
        (tmp_path / "exit").touch()
        outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1][-2000:] for o in outs]
    return [json.loads(line) for line in lines]


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN: nothing is prepacked")
def test_two_processes_loading_at_once_share_one_budget(tmp_path):
    """Each process alone would prepack about 60 % of its weights' bytes within half the (faked)
    available memory; two at once, each reading the same available memory, must together stay
    within that half instead of taking it each."""
    total = sum((128 + 32 * k) * 128 * 4 for k in range(6))
    available = int(1.2 * total)  # budget: PACK_SHARE (0.5) of it, 0.6 x one process's weights
    results = _run_two(tmp_path, available)
    packed = [r["packed_mb"] * 2 ** 20 for r in results]
    assert sum(packed) <= lk.PACK_SHARE * available + 1
    assert max(packed) > 0  # the budget was used, not refused to both
    ledger = json.loads((tmp_path / "cache" / "packed_ledger.json").read_text())
    assert ledger["budget"] == int(lk.PACK_SHARE * available)


def test_the_ledger_forgets_processes_that_ended(tmp_path, monkeypatch):
    monkeypatch.setenv("LVSPEC_CACHE_DIR", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    path = tmp_path / "packed_ledger.json"
    path.write_text(json.dumps({"budget": 1000, "pids": {dead.stdout.strip(): 900}}))
    with lk.ledger() as book:
        assert book.pids == {} and book.budget is None  # nobody holds memory: a budget read afresh
        held = lk._own_packed_bytes()  # this process's copies from other tests' models, if any
        assert book.allowance(4 * 10**9) == 2 * 10**9 - held


def test_tests_never_touch_the_users_kernel_cache():
    """conftest points LVSPEC_CACHE_DIR at a temporary folder for the whole session (the processes
    tests start inherit it), so the user's measured kernels are never read nor overwritten."""
    assert os.environ.get("LVSPEC_CACHE_DIR")
    assert lk.cache_dir() != Path.home() / ".cache" / "lvspec"
    assert "lvspec-cache" in lk.cache_dir().name


GIB = 1 << 30


def _ledger_holding(path: Path, pid: int, owner: dict | None = None) -> None:
    """A ledger in which process `pid` holds 8 GiB of a 8 GiB budget (with `owner`: its identity)."""
    book = {"budget": 8 * GIB, "pids": {str(pid): 8 * GIB}}
    if owner is not None:
        book["owners"] = {str(pid): owner}
    path.write_text(json.dumps(book))


def test_a_live_pid_that_is_not_the_recorded_process_does_not_zero_the_budget(tmp_path, monkeypatch):
    """PID 1 is alive (init), but it is not the lvspec process that wrote the entry: a ledger left by a
    reboot, or by another node on a shared home, must not keep prepacked kernels off for good."""
    monkeypatch.setenv("LVSPEC_CACHE_DIR", str(tmp_path))
    _ledger_holding(tmp_path / "packed_ledger.json", 1)
    with lk.ledger() as book:
        assert "1" not in book.pids
        assert book.allowance(16 * GIB) >= 8 * GIB - lk._own_packed_bytes()


@pytest.mark.parametrize("field,value", [("host", "another-node"), ("start", -5), ("boot", "another-boot")])
def test_an_entry_of_another_host_boot_or_start_time_is_dropped(field, value, tmp_path, monkeypatch):
    from lvspec_eval.backends import host

    monkeypatch.setenv("LVSPEC_CACHE_DIR", str(tmp_path))
    with subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"]) as other:
        try:
            owner = {**host.process_identity(other.pid), field: value}
            _ledger_holding(tmp_path / "packed_ledger.json", other.pid, owner)
            with lk.ledger() as book:
                assert str(other.pid) not in book.pids and book.allowance(16 * GIB) > 0
            _ledger_holding(tmp_path / "packed_ledger.json", other.pid, host.process_identity(other.pid))
            with lk.ledger() as book:  # the process itself, as recorded: it holds the budget
                assert book.pids[str(other.pid)] == 8 * GIB and book.allowance(16 * GIB) == 0
        finally:
            other.kill()


def test_the_ledger_records_who_holds_each_entry(tmp_path, monkeypatch):
    from lvspec_eval.backends import host

    monkeypatch.setenv("LVSPEC_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(lk, "_own_packed_bytes", lambda: 1000)
    with lk.ledger() as book:
        book.allowance(16 * GIB)
        book.record()
    saved = json.loads((tmp_path / "packed_ledger.json").read_text())
    me = str(os.getpid())
    assert saved["pids"][me] == 1000 and saved["owners"][me] == host.process_identity()
    with lk.ledger() as book:  # read back: this process is still this process
        assert book.pids[me] == 1000
