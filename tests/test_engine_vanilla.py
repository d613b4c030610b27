"""The one-token step on the engine's measured CPU kernels, as an opt-in (issue 43, item 5): model_arg
one_token_kernels=engine and `lvspec-eval bench --engine-vanilla`, beside transformers' one-token path,
which stays the default."""
from __future__ import annotations

import json

import pytest
import torch

from lvspec_eval.backends import linear_kernels as lk
from lvspec_eval.decoding.runner import Runner
from lvspec_eval.measure import bench
from lvspec_eval.models.args import ModelArgs


@pytest.fixture
def kernels_win(monkeypatch, kernel_cache) -> list[int]:
    """Measurements on which padded rows beat nn.Linear at every row count; returns the row counts
    of the calls that took an installed kernel."""
    def fake(weight, bias, with_onednn):
        return lk.ShapeCurve({**{m: 10.0 for m in lk.ROWS}, 64: 1.0})

    monkeypatch.setattr(lk, "measure", fake)
    taken, real = [], lk._row_choice

    def spy(choices, rows, always=False):
        choice = real(choices, rows, always)
        if choice is not None and choice.kind != "torch":
            taken.append(rows)
        return choice

    monkeypatch.setattr(lk, "_row_choice", spy)
    return taken


def test_one_token_kernels_is_a_checked_model_arg():
    assert ModelArgs.parse({}).one_token_kernels == "torch"  # transformers' own step by default
    args = ModelArgs.parse({"one_token_kernels": "engine"})
    assert args.runner_kwargs()["one_token_kernels"] == "engine"
    with pytest.raises(ValueError, match="one_token_kernels='fast'.*torch, engine"):
        ModelArgs.parse({"one_token_kernels": "fast"})
    with pytest.raises(ValueError, match="one_token_kernels='fast'"):
        Runner("demo", "vanilla", one_token_kernels="fast")


def test_engine_vanilla_steps_on_the_kernel_and_says_what_vanilla_says(kernels_win):
    torch.set_num_threads(1)
    s = bench.make_samples("synthvid_caption", 1)[0]
    plain = Runner("demo", "vanilla", cpu_kernels="auto")
    want = plain.generate(s["prompt"], [s["video"]], 12)
    assert 1 not in kernels_win  # the default: one-token steps are nn.Linear's
    engine = Runner("demo", "vanilla", cpu_kernels="auto", one_token_kernels="engine")
    kernels_win.clear()
    got = engine.generate(s["prompt"], [s["video"]], 12)
    assert got.tokens == want.tokens and len(got.tokens) > 5  # float32: token-identical
    assert kernels_win.count(1) >= len(got.tokens)  # every step's layers took the one-row kernel
    kernels_win.clear()
    plain.generate(s["prompt"], [s["video"]], 12)  # the other runner's context does not leak
    assert 1 not in kernels_win


def test_bench_times_engine_vanilla_beside_vanilla(kernels_win, tmp_path, capsys):
    from lvspec_eval.cli import build_parser

    args = build_parser().parse_args(["bench", "--threads", "1", "--max-new-tokens", "8", "--limit", "2",
                                      "--methods", "vanilla,sd_tree", "--engine-vanilla", "--out",
                                      str(tmp_path / "out.json")])
    assert bench._main(args) == 0
    result = json.loads((tmp_path / "out.json").read_text())
    engine = result["methods"][bench.ENGINE_VANILLA]
    assert engine["exact_match_rate"] == 1.0 and engine["n"] == 2
    assert set(result["over_engine_vanilla"]) == {"vanilla", "sd_tree"}
    assert result["over_engine_vanilla"]["sd_tree"]["e2e_speedup"] > 0
    assert 1 in kernels_win  # the engine arm's one-token steps ran the kernel
    assert f"sd_tree over {bench.ENGINE_VANILLA}: decode" in capsys.readouterr().out
