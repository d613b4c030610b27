"""CPU kernels for multi-token forwards (backends/linear_kernels.py): chosen from a measured curve,
equal to nn.Linear within float32 rounding, never touching one-token steps or prefills, and exact
methods stay token-identical to vanilla with every kind installed."""
from __future__ import annotations

import copy
import json
import os
import sys
import threading
import warnings
from pathlib import Path

import pytest
import torch

from lvspec_eval.backends import linear_kernels as lk
from lvspec_eval.decoding import loop, methods
from lvspec_eval.models.args import ModelArgs

# the issue's measured 1536 -> 8960 projection (ms): 8 rows cost more than 16 through nn.Linear
ISSUE_TORCH = {1: 2.25, 2: 2.42, 3: 4.5, 4: 6.2, 5: 7.0, 6: 7.6, 8: 8.7, 10: 6.0, 12: 5.8, 16: 5.45, 20: 6.5,
               24: 7.5, 32: 8.85, 48: 12.0, 64: 15.0}
ISSUE_ONEDNN = {2: 4.07, 3: 4.0, 4: 3.92, 5: 4.1, 6: 4.3, 8: 4.58, 10: 4.9, 12: 5.0, 16: 5.32, 20: 5.9, 24: 6.3,
                32: 6.95, 48: 9.5, 64: 12.0}


# where torch has no oneDNN the prepacked kind cannot be installed: its cases skip, the others run
KINDS = ["pad", pytest.param("onednn", marks=pytest.mark.skipif(not torch.backends.mkldnn.is_available(),
                                                                reason="this torch build has no oneDNN"))]


@pytest.fixture(autouse=True)
def _own_cache(kernel_cache):
    """Each test here starts from an empty kernel cache (conftest's kernel_cache)."""


def test_choices_follow_the_measured_curve():
    choices = lk.ShapeCurve(ISSUE_TORCH, ISSUE_ONEDNN).choices()
    assert choices[2].kind == "torch"  # nothing beats 2.42 ms by 10 %
    assert choices[4].kind == "onednn" and choices[8].kind == "onednn"  # 3.92 / 4.58 against 6.2 / 8.7
    assert choices[7].kind == "onednn"  # an unmeasured count is judged at the next measured one (8)
    no_pack = lk.ShapeCurve(ISSUE_TORCH).choices()  # without the packed copy (memory): padding
    assert (no_pack[8].kind, no_pack[8].rows) == ("pad", 16)  # 5.45 ms at 16 rows against 8.7 at 8
    assert no_pack[16].kind == "torch" and no_pack[64].kind == "torch"
    flat = lk.ShapeCurve({m: 1.0 + 0.01 * m for m in lk.ROWS}, {m: 0.95 + 0.01 * m for m in lk.ROWS[1:]}).choices()
    assert all(c.kind == "torch" for c in flat.values())  # a 5 % gain is noise, not a reason to switch


def _force(monkeypatch, kind: str):
    """Make `measure` report a curve on which `kind` wins at every row count."""
    def fake(weight, bias, with_onednn):
        torch_ms = {m: 10.0 for m in lk.ROWS}
        if kind == "pad":
            torch_ms[64] = 1.0
        return lk.ShapeCurve(torch_ms, {m: 1.0 for m in lk.ROWS} if kind == "onednn" and with_onednn else {})
    monkeypatch.setattr(lk, "measure", fake)


@pytest.mark.parametrize("kind", KINDS)
def test_installed_kernels_equal_nn_linear_and_leave_one_token_steps_alone(monkeypatch, tmp_path, kind):
    monkeypatch.setenv("LVSPEC_CACHE_DIR", str(tmp_path))
    _force(monkeypatch, kind)
    torch.manual_seed(0)
    layer = torch.nn.Linear(48, 80)
    reference = copy.deepcopy(layer)
    report = lk.install([layer], "auto")
    assert report is not None and report.shapes
    chosen = next(iter(report.shapes.values()))["choices"]
    assert chosen[8] == ("pad64" if kind == "pad" else "onednn")
    for rows in (1, 2, 5, 8, 13, 64, 100):
        x = torch.randn(1, rows, 48)
        want = reference(x)
        assert torch.equal(layer(x), want)  # outside a multi-token forward: nn.Linear itself
        with lk.multi_token():
            got = layer(x)
        if rows == 1 or rows > lk.ROWS[-1]:
            assert torch.equal(got, want)  # one row, or more than measured: nn.Linear itself
        else:
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            with lk.multi_token(), lk.disabled():
                assert torch.equal(layer(x), want)


def _curve(spread: float = 1.0) -> lk.ShapeCurve:
    """A measured-looking curve on which nn.Linear is fastest throughout."""
    return lk.ShapeCurve({m: 1.0 for m in lk.ROWS}, {m: 2.0 for m in lk.ROWS}, spread)


def _counting(monkeypatch, spread: float = 1.0) -> list:
    calls = []

    def counting(weight, bias, with_onednn):
        calls.append(tuple(weight.shape))
        return _curve(spread)

    monkeypatch.setattr(lk, "measure", counting)
    return calls


def test_measurements_are_cached_per_machine_and_shape(monkeypatch):
    calls = _counting(monkeypatch)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 16), torch.nn.Linear(16, 32))
    lk.install([model], "auto")
    assert sorted(calls) == [(16, 32), (32, 16)]  # one measurement per shape, not per layer
    saved = json.loads(lk.cache_file().read_text())
    assert saved["schema"] == lk.SCHEMA and len(saved["machines"][lk.machine_key()]) == 2
    lk.install([copy.deepcopy(model)], "auto")
    assert len(calls) == 2  # read back
    lk.install([copy.deepcopy(model)], "measure")
    assert len(calls) == 4  # measured anew
    assert lk.install([copy.deepcopy(model)], "torch") is None


def test_a_real_measurement_is_read_back(monkeypatch):
    monkeypatch.setattr(lk, "LOADED_SPREAD", float("inf"))  # this test's machine may be busy
    layer = torch.nn.Linear(8, 8)
    lk.install([layer], "auto")
    saved = json.loads(lk.cache_file().read_text())["machines"][lk.machine_key()]
    (raw,) = saved.values()
    assert set(map(int, raw["torch_ms"])) == set(lk.ROWS) and raw["spread"] >= 1.0
    monkeypatch.setattr(lk, "measure", lambda *a: pytest.fail("measured again"))
    lk.install([copy.deepcopy(layer)], "auto")


def test_the_machine_key_holds_flags_and_cores_beside_the_model_name():
    key = lk.machine_key()
    assert "|flags=" in key and f"|cores={os.cpu_count()}|" in key and f"threads={torch.get_num_threads()}" in key


ARM_CPUINFO = """processor\t: 0
BogoMIPS\t: 50.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41

processor\t: 1
BogoMIPS\t: 50.00
Features\t: fp asimd

Hardware\t: some board
"""


def test_one_reading_of_proc_cpuinfo_for_the_kernel_cache_and_the_resume_keys(tmp_path, monkeypatch):
    """An Arm CPU names its flags `Features` and has no `model name`: the kernel cache's key and the
    records' machine.cpu_flags come from the same reading (backends/host.py), the first processor's."""
    from lvspec_eval.backends import host
    from lvspec_eval.models import resume

    real = Path.read_text

    def read_text(self, *args, **kwargs):  # /proc/cpuinfo of an Arm machine, whoever reads it
        return ARM_CPUINFO if str(self).endswith("proc/cpuinfo") else real(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    flags = resume.machine_settings()["machine.cpu_flags"]
    assert flags and f"|flags={flags}|" in lk.machine_key()
    assert host.cpuinfo()["Features"].endswith("atomics") and "Hardware" not in host.cpuinfo()


@pytest.mark.parametrize("old", [
    {"some cpu|threads=1|torch=x": {"float32|16x32|bias=True|onednn=True": {"torch_ms": {"2": 1.0}}}},  # schema 1
    {"schema": lk.SCHEMA, "machines": "garbage"},
])
def test_a_cache_of_another_schema_is_measured_anew_not_a_key_error(monkeypatch, old):
    lk.cache_file().parent.mkdir(parents=True, exist_ok=True)
    lk.cache_file().write_text(json.dumps(old))
    calls = _counting(monkeypatch)
    lk.install([torch.nn.Linear(32, 16)], "auto")
    assert calls == [(16, 32)]
    assert json.loads(lk.cache_file().read_text())["schema"] == lk.SCHEMA


def test_an_entry_missing_a_row_count_is_measured_anew(monkeypatch):
    calls = _counting(monkeypatch)
    lk.install([torch.nn.Linear(32, 16)], "auto")
    data = json.loads(lk.cache_file().read_text())
    (entry,) = data["machines"][lk.machine_key()].values()
    del entry["torch_ms"]["1"]  # as a cache written before one row was measured
    lk.cache_file().write_text(json.dumps(data))
    lk.install([torch.nn.Linear(32, 16)], "auto")
    assert len(calls) == 2


def test_a_measurement_taken_under_load_is_taken_again_and_the_calmer_kept(monkeypatch):
    calls = _counting(monkeypatch, spread=3.0)
    lk.install([torch.nn.Linear(32, 16)], "auto")
    lk.install([torch.nn.Linear(32, 16)], "auto")
    assert len(calls) == 2  # the busy measurement was not reused
    calls = _counting(monkeypatch, spread=1.1)
    lk.install([torch.nn.Linear(32, 16)], "auto")
    (entry,) = json.loads(lk.cache_file().read_text())["machines"][lk.machine_key()].values()
    assert entry["spread"] == 1.1
    lk.install([torch.nn.Linear(32, 16)], "auto")
    assert len(calls) == 1  # calm: read back


def test_cpu_kernels_is_validated():
    assert ModelArgs.parse({"cpu_kernels": "torch"}).cpu_kernels == "torch"
    with pytest.raises(ValueError, match="cpu_kernels"):
        ModelArgs.parse({"cpu_kernels": "fast"})


def _installed(backend, monkeypatch, kind, tmp_path):
    monkeypatch.setenv("LVSPEC_CACHE_DIR", str(tmp_path / kind))
    _force(monkeypatch, kind)
    clone = copy.deepcopy(backend)
    clone.kernels = lk.install([clone.text_model(), clone.model.lm_head], "auto")
    assert clone.kernels is not None
    return clone


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_5"], indirect=True)
def test_exact_methods_stay_lossless_with_cpu_kernels(family, make_case, monkeypatch, tmp_path, kind):
    """float32: with every linear layer's multi-token forwards on another kernel, vanilla is untouched
    (its steps are one token) and sd_tree / specvlm still give vanilla's tokens."""
    target = _installed(family.target, monkeypatch, kind, tmp_path)
    draft = _installed(family.draft, monkeypatch, kind, tmp_path)
    for seed in (0, 1, 2):
        case = make_case(seed, family.max_side)

        def run(method, tgt, drf, tree, case=case):
            spec = methods.resolve(method)
            drafter, verifier = methods.build(spec, methods.make_options(spec, tree), drf, tgt)
            return loop.generate(tgt, drafter, verifier, case.prompt, case.videos, 12).tokens

        want = run("vanilla", family.target, None, {})
        assert run("vanilla", target, None, {}) == want
        for method, tree in [("sd_tree", {"tree": "dynamic", "tree_depth": 4, "tree_topk": 3, "tree_total": 10}),
                             ("specvlm", {"tree": "chain", "tree_depth": 5})]:
            assert run(method, target, draft, tree) == want, (method, seed)


def test_forward_cost_curve_on_the_demo_target():
    """`bench --forward-cost`'s curve: one row per token count, the one-token step as the unit, a floor."""
    from lvspec_eval.backends.loading import load_backend
    from lvspec_eval.measure import forward_cost

    result = forward_cost.curve(load_backend("demo"), cache_len=32, counts=(1, 2, 4), repeats=1)
    rows = result["rows"]
    assert [r["tokens"] for r in rows] == [1, 2, 4] and rows[0]["ratio"] == 1.0
    assert all(r["ms"] > 0 and r["floor_ms"] > 0 for r in rows) and result["weight_mb"] > 0
    assert "nn_linear_ms" not in rows[0]  # no kernels installed (load_backend's default): one column
    assert "| 4 |" in forward_cost.format_curve("demo", result)


# ---- bf16 where oneDNN cannot run it, and kernels that fail (issue 44, item 1) --------------------
def _raise(*_args, **_kwargs):
    raise RuntimeError("mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw")


@pytest.mark.parametrize("case", ["bf16 unsupported", "pack raises", "measure raises"])
def test_bf16_loads_and_decodes_where_onednn_cannot_pack_it(monkeypatch, case):
    """A CPU without oneDNN bf16 (AVX2-only Intel, AMD before Zen 4): torch's reorder raises. The
    support check keeps bf16 weights off oneDNN; a pack or measurement that raises anyway leaves
    that weight on nn.Linear with one warning; the model loads and decodes in bf16 either way."""
    from lvspec_eval.backends.loading import load_backend

    _force(monkeypatch, "onednn")
    monkeypatch.setattr(lk, "pack", _raise)
    monkeypatch.setattr(lk, "bf16_supported", lambda: case != "bf16 unsupported")
    if case == "measure raises":
        monkeypatch.setattr(lk, "measure", _raise)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        backend = load_backend("demo", dtype="bfloat16", cpu_kernels="auto")
    failed = [w for w in caught if "CPU kernels" in str(w.message)]
    shapes = {(tuple(l.weight.shape), l.bias is None) for l in lk.linear_layers([backend.text_model(), backend.model.lm_head])}
    assert len(failed) == (0 if case == "bf16 unsupported" else len(shapes))  # one warning per weight shape
    assert backend.kernels is None  # nothing beat nn.Linear without the prepacked copy
    spec = methods.resolve("sd_tree")
    drafter, verifier = methods.build(spec, methods.make_options(spec, {}), load_backend("demo-draft", dtype="bfloat16"),
                                      backend)
    out = loop.generate(backend, drafter, verifier, "describe the video", [], 6)
    assert len(out.tokens) > 0


def test_bf16_support_follows_torch():
    assert lk.bf16_supported() == bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    weight = torch.zeros(4, 4, dtype=torch.bfloat16)
    assert lk.onednn_available(weight) == (torch.backends.mkldnn.is_available() and lk.bf16_supported())


# ---- activation state from several threads (issue 44, item 6) ---------------------------------------
def test_activation_is_per_thread_and_never_left_on(monkeypatch):
    """A thread inside multi_token() must not switch another thread's forwards onto the kernels, and
    entering and leaving from many threads at once (the old global counters lost updates) leaves
    every thread's state off."""
    _force(monkeypatch, "pad")
    layer = torch.nn.Linear(16, 16)
    lk.install([layer], "auto")
    padded = []
    real = torch.Tensor.new_zeros
    monkeypatch.setattr(torch.Tensor, "new_zeros", lambda self, *a, **k: padded.append(1) or real(self, *a, **k))
    inside, release = threading.Event(), threading.Event()

    def hold():
        with lk.multi_token():
            inside.set()
            release.wait(10)

    holder = threading.Thread(target=hold)
    holder.start()
    inside.wait(10)
    layer(torch.randn(4, 16))  # this thread is not inside multi_token(): nn.Linear, no padding
    release.set()
    holder.join()
    assert padded == []

    def churn():
        for _ in range(2000):
            with lk.multi_token(), lk.disabled(), lk.one_token_steps():
                pass

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as possible: lost updates show within a run
    try:
        threads = [threading.Thread(target=churn) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(switch)
    assert (lk._multi.get(), lk._off.get(), lk._one.get()) == (False, False, False)
    layer(torch.randn(4, 16))
    assert padded == []


# ---- the one-token step on the measured kernel, opt-in (issue 43, item 5) ----------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_one_token_steps_take_the_measured_kernel_only_when_opted_in(monkeypatch, kind):
    _force(monkeypatch, kind)
    torch.manual_seed(0)
    plain_install, opted = torch.nn.Linear(48, 80), torch.nn.Linear(48, 80)
    opted.load_state_dict(plain_install.state_dict())
    reference = copy.deepcopy(plain_install)
    lk.install([plain_install], "auto")
    report = lk.install([opted], "auto", one_token=True)
    assert report.one_token and next(iter(report.shapes.values()))["choices"][1] == \
        ("pad64" if kind == "pad" else "onednn")
    calls = []
    real = lk.packed_linear if kind == "onednn" else torch.Tensor.new_zeros
    spy = lambda *a, **k: calls.append(1) or real(*a, **k)  # noqa: E731
    monkeypatch.setattr(*((lk, "packed_linear", spy) if kind == "onednn" else (torch.Tensor, "new_zeros", spy)))
    x = torch.randn(1, 1, 48)
    assert torch.equal(opted(x), reference(x)) and not calls  # outside one_token_steps(): nn.Linear's step
    with lk.one_token_steps():
        assert torch.equal(plain_install(x), reference(x)) and not calls  # installed without one_token
        torch.testing.assert_close(opted(x), reference(x), rtol=1e-5, atol=1e-6)
        assert len(calls) == 1
        with lk.disabled():
            assert torch.equal(opted(x), reference(x)) and len(calls) == 1


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("family", ["qwen2_5_vl", "qwen3_5"], indirect=True)
def test_engine_vanilla_stays_token_identical_to_vanilla(family, make_case, monkeypatch, tmp_path, kind):
    """float32: vanilla with every one-token step on the measured kernel (one_token_kernels=engine)
    gives transformers' vanilla tokens, and so does sd_tree whose catch-up steps take it too."""
    _force(monkeypatch, kind)
    target, draft = copy.deepcopy(family.target), copy.deepcopy(family.draft)
    for backend in (target, draft):
        backend.kernels = lk.install([backend.text_model(), backend.model.lm_head], "auto", one_token=True)
        assert backend.kernels.shapes and all(s["choices"][1] != "torch" for s in backend.kernels.shapes.values())
    for seed in (0, 1, 2):
        case = make_case(seed, family.max_side)

        def run(method, tgt, drf, tree, case=case):
            spec = methods.resolve(method)
            drafter, verifier = methods.build(spec, methods.make_options(spec, tree), drf, tgt)
            return loop.generate(tgt, drafter, verifier, case.prompt, case.videos, 12).tokens

        want = run("vanilla", family.target, None, {})
        with lk.one_token_steps():
            assert run("vanilla", target, None, {}) == want, seed
            assert run("sd_tree", target, draft, {"tree": "chain", "tree_depth": 3}) == want, seed
