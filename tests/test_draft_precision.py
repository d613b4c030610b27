"""draft_dtype: the draft in another precision than the target leaves exact methods' outputs alone,
and `auto` picks bfloat16 only where torch says the CPU supports it and it measures faster."""
from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest
import torch

from lvspec_eval.backends import draft_int8, draft_precision
from lvspec_eval.backends import linear_kernels as lk
from lvspec_eval.backends.loading import load_backend, load_draft
from lvspec_eval.decoding import loop, methods
from lvspec_eval.measure.bench import make_samples
from lvspec_eval.models.args import ModelArgs

TREES = {"adaptive": {}, "chain": {"tree": "chain", "tree_depth": 5},
         "dynamic": {"tree": "dynamic", "tree_depth": 4, "tree_topk": 4, "tree_total": 12}}


@pytest.fixture(scope="module")
def demo_target():
    return load_backend("demo")


@pytest.fixture(scope="module", params=["bfloat16", "int8"])
def demo_pair(request, demo_target):
    return demo_target, load_draft("demo-draft", request.param)


def _decode(target, draft, method: str, tree: dict, sample, max_new_tokens: int = 32):
    spec = methods.resolve(method)
    drafter, verifier = methods.build(spec, methods.make_options(spec, dict(tree)), draft, target)
    return loop.generate(target, drafter, verifier, sample["prompt"], [sample["video"].request()], max_new_tokens)


@pytest.mark.parametrize("method", ["sd_tree", "specvlm"])
@pytest.mark.parametrize("tree", list(TREES))
def test_a_reduced_precision_draft_keeps_exact_methods_token_identical(demo_pair, method, tree):
    target, draft = demo_pair
    assert draft.precision.dtype in ("bfloat16", "int8") and target.model.dtype == torch.float32
    accepted = 0
    for sample in make_samples("synthvid_caption", 2):
        want = _decode(target, None, "vanilla", {}, sample).tokens
        out = _decode(target, draft, method, TREES[tree], sample)
        assert out.tokens == want, f"{method} tree={tree} sample {sample['id']}"
        accepted += sum(out.stats.accepted_lengths)
    assert accepted > 0, f"the {draft.precision.dtype} draft proposed nothing the target accepted"


@pytest.mark.parametrize("dtype", ["bfloat16", "int8"])
def test_a_reduced_precision_draft_of_every_family_stays_lossless(family, make_case, dtype):
    draft = load_draft(str(family.draft.model.name_or_path), dtype)
    for seed in range(3):
        case = make_case(seed, family.max_side, with_video=True)
        runs = {}
        for method, backend in (("vanilla", None), ("sd_tree", draft), ("specvlm", draft)):
            spec = methods.resolve(method)
            drafter, verifier = methods.build(spec, methods.make_options(spec, {"tree": "chain", "tree_depth": 4}),
                                              backend, family.target)
            runs[method] = loop.generate(family.target, drafter, verifier, case.prompt, case.videos, 10).tokens
        assert runs["sd_tree"] == runs["vanilla"] == runs["specvlm"], f"{family.name} seed {seed}"


def test_cast_keeps_the_rotary_frequencies_in_float32():
    draft = load_draft("demo-draft", "bfloat16")
    assert all(p.dtype == torch.bfloat16 for p in draft.model.parameters())
    inv = [b for n, b in draft.model.named_buffers() if n.endswith("inv_freq")]
    assert inv and all(b.dtype == torch.float32 for b in inv)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("LVSPEC_CACHE_DIR", str(tmp_path))
    return tmp_path


def _layers():
    return [torch.nn.Linear(16, 32), torch.nn.Linear(16, 32), torch.nn.Linear(32, 16)]


def test_auto_keeps_float32_where_torch_reports_no_bfloat16(cache_dir, monkeypatch):
    monkeypatch.setattr(lk, "bf16_supported", lambda device="cpu": False)
    monkeypatch.setattr(draft_precision, "measure_shape", lambda w: pytest.fail("measured without bfloat16 support"))
    decision = draft_precision.choose(_layers(), torch.device("cpu"), torch.float32)
    assert decision.dtype == "float32" and "no bfloat16" in decision.reason


@pytest.mark.parametrize("bf16_ms,want", [(0.5, "bfloat16"), (0.95, "float32")])
def test_auto_picks_bfloat16_only_where_it_measures_faster(cache_dir, monkeypatch, bf16_ms, want):
    monkeypatch.setattr(lk, "bf16_supported", lambda device="cpu": True)
    calls = []

    def fake(weight):
        calls.append(tuple(weight.shape))
        return {"float32_ms": 1.0, "bfloat16_ms": bf16_ms}

    monkeypatch.setattr(draft_precision, "measure_shape", fake)
    decision = draft_precision.choose(_layers(), torch.device("cpu"), torch.float32)
    assert decision.dtype == want
    assert sorted(calls) == [(16, 32), (32, 16)]  # one measurement per distinct shape
    assert decision.float32_ms == pytest.approx(3.0)  # weighted by the layers of each shape
    again = draft_precision.choose(_layers(), torch.device("cpu"), torch.float32)  # from the cache
    assert again.dtype == want and len(calls) == 2
    assert (cache_dir / "draft_dtype.json").exists()


def test_auto_on_an_accelerator_or_a_reduced_dtype_keeps_the_load_dtype():
    assert draft_precision.choose(_layers(), torch.device("cuda"), torch.bfloat16).dtype == "bfloat16"
    assert draft_precision.choose(_layers(), torch.device("cpu"), torch.float16).dtype == "float16"


def test_measure_shape_times_both_dtypes():
    out = draft_precision.measure_shape(torch.randn(8, 8))
    assert set(out) == {"float32_ms", "bfloat16_ms"} and all(v > 0 for v in out.values())


def test_draft_dtype_is_checked():
    with pytest.raises(ValueError, match="draft_dtype"):
        ModelArgs.parse({"draft_dtype": "int4"})
    with pytest.raises(ValueError, match="draft_dtype"):
        load_draft("demo-draft", "int4")
    assert ModelArgs.parse({"draft_dtype": "int8"}).runner_kwargs()["draft_dtype"] == "int8"
    assert ModelArgs.parse({"draft_dtype": "auto"}).runner_kwargs()["draft_dtype"] == "auto"


def test_int8_layers_compute_the_rounded_weights_and_free_the_float_ones():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 48), torch.nn.ReLU(), torch.nn.Linear(48, 32, bias=False))
    x = torch.randn(5, 64)
    want = model(x)
    w0 = model[0].weight.detach().clone()
    assert draft_int8.quantize([model]) == 2
    first, last = model[0], model[2]
    assert isinstance(first, draft_int8.Int8Linear) and isinstance(last, draft_int8.Int8Linear)
    # the stand-in weight keeps shape and dtype for readers, and holds one element, not 48 x 64
    assert first.weight.shape == (48, 64) and first.weight.dtype == torch.float32
    assert first.weight.untyped_storage().nbytes() == 4
    # the weights it computes with: each row rounded to 1/127 of its largest magnitude
    deq = first.dequantized()
    assert deq.shape == (48, 64)
    assert ((deq - w0).abs().amax(1) <= w0.abs().amax(1) / 127 / 2 + 1e-6).all()
    got = model(x)
    assert got.shape == want.shape and got.dtype == torch.float32
    # each layer within what rounding its weights and (dynamically) its input can move it; the kernel
    # (fbgemm, oneDNN; 7- or 8-bit activations) differs between CPUs, so the bound allows 7 bits
    hidden = model[1](first(x))
    for layer, inputs in ((first, x), (last, hidden)):
        exact = torch.nn.functional.linear(inputs, layer.dequantized())
        step = (inputs.amax() - inputs.amin().clamp(max=0)) / 127
        bound = step / 2 * layer.dequantized().abs().sum(1) + 1e-5
        out = layer(inputs) - (layer.bias if layer.bias is not None else 0)
        assert ((out - exact).abs() <= bound).all(), ((out - exact).abs() - bound).max()
    assert not torch.equal(got, want)  # int8 products, not the float layer
    assert model(x[None]).shape == (1, 5, 32)  # any leading shape


def test_an_int8_draft_quantizes_its_language_model_and_head():
    draft = load_draft("demo-draft", "int8", cpu_kernels="auto")
    int8 = [m for m in draft.text_model().modules() if isinstance(m, draft_int8.Int8Linear)]
    assert int8 and not [m for m in draft.text_model().modules() if isinstance(m, torch.nn.Linear)]
    head = draft.model.lm_head
    assert isinstance(head, draft_int8.Int8Linear) or hasattr(head, "_int8"), head
    assert draft.precision.dtype == "int8" and draft.kernels is None  # no float kernels on top


def test_a_draft_takes_its_measured_one_row_kernel_everywhere_the_target_only_when_asked(monkeypatch):
    from lvspec_eval.backends import linear_kernels
    x = torch.randn(1, 16)
    real_linear = torch.nn.functional.linear
    seen = []
    monkeypatch.setattr(torch.nn.functional, "linear", lambda a, *rest: (seen.append(a.shape[0]), real_linear(a, *rest))[1])
    # one row padded to two: the row count F.linear sees tells which path a call took
    for one_token, want in ((False, [1, 1]), (True, [1, 2]), ("always", [2, 2])):
        layer = torch.nn.Linear(16, 8)
        choices = {m: linear_kernels.Choice("pad", m + 1) for m in (1, 2) if m > 1 or one_token}
        linear_kernels._wrap(layer, choices, None, always=one_token == "always")
        seen.clear()
        plain = real_linear(x, layer.weight, layer.bias)
        layer(x)
        with linear_kernels.one_token_steps():
            out = layer(x)
        assert seen == want, (one_token, seen)
        assert torch.allclose(out, plain, atol=1e-6)


def test_bfloat16_support_is_asked_in_one_place(cache_dir, monkeypatch):
    """draft_dtype=auto and the CPU kernels ask the same function (linear_kernels.bf16_supported)."""
    monkeypatch.setattr(lk, "bf16_supported", lambda device="cpu": True)
    monkeypatch.setattr(draft_precision, "measure_shape", lambda w: {"float32_ms": 1.0, "bfloat16_ms": 0.5})
    assert draft_precision.choose(_layers(), torch.device("cpu"), torch.float32).dtype == "bfloat16"
    assert not hasattr(draft_precision, "bf16_supported")


HOLD_LOCK = """
import sys, time
from pathlib import Path
from filelock import FileLock
lock = FileLock(sys.argv[1])
with lock:
    Path(sys.argv[2]).touch()
    while not Path(sys.argv[3]).exists():
        time.sleep(0.01)
"""


def test_draft_dtype_json_is_written_under_the_cache_folders_lock(cache_dir, monkeypatch, tmp_path):
    """Another process holds the lock every writer of the cache folder takes (the kernel ledger's, held
    while cpu_kernels.json is measured and written): draft_dtype.json waits for it."""
    monkeypatch.setattr(lk, "bf16_supported", lambda device="cpu": True)
    monkeypatch.setattr(draft_precision, "measure_shape", lambda w: {"float32_ms": 1.0, "bfloat16_ms": 0.5})
    held, release = tmp_path / "held", tmp_path / "release"
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(cache_dir / "packed_ledger.json.lock"), str(held),
                               str(release)])
    try:
        deadline = time.monotonic() + 60
        while not held.exists() and time.monotonic() < deadline:
            time.sleep(0.01)
        chooser = threading.Thread(target=draft_precision.choose, args=(_layers(), torch.device("cpu"), torch.float32))
        chooser.start()
        time.sleep(1.0)
        assert chooser.is_alive() and not (cache_dir / "draft_dtype.json").exists()  # waiting for the lock
    finally:
        release.touch()
        holder.wait(timeout=60)
    chooser.join(timeout=60)
    assert not chooser.is_alive() and (cache_dir / "draft_dtype.json").exists()
