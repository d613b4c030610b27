"""CPU kernels for multi-token forwards (backends/linear_kernels.py): chosen from a measured curve,
equal to nn.Linear within float32 rounding, never touching one-token steps or prefills, and exact
methods stay token-identical to vanilla with every kind installed."""
from __future__ import annotations

import copy
import json

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
        return lk.ShapeCurve(torch_ms, {m: 1.0 for m in lk.ROWS[1:]} if kind == "onednn" and with_onednn else {})
    monkeypatch.setattr(lk, "measure", fake)


@pytest.mark.parametrize("kind", ["pad", "onednn"])
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


def test_measurements_are_cached_per_machine_and_shape(monkeypatch, tmp_path):
    monkeypatch.setenv("LVSPEC_CACHE_DIR", str(tmp_path))
    calls = []
    real = lk.measure

    def counting(weight, bias, with_onednn):
        calls.append(tuple(weight.shape))
        return real(weight, bias, with_onednn)

    monkeypatch.setattr(lk, "measure", counting)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Linear(32, 16), torch.nn.Linear(16, 32))
    lk.install([model], "auto")
    assert sorted(calls) == [(16, 32), (32, 16)]  # one measurement per shape, not per layer
    saved = json.loads(lk.cache_file().read_text())
    assert lk.machine_key() in saved and len(saved[lk.machine_key()]) == 2
    lk.install([copy.deepcopy(model)], "auto")
    assert len(calls) == 2  # read back
    lk.install([copy.deepcopy(model)], "measure")
    assert len(calls) == 4  # measured anew
    assert lk.install([copy.deepcopy(model)], "torch") is None


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


@pytest.mark.parametrize("kind", ["pad", "onednn"])
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
