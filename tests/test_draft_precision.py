"""draft_dtype: the draft in another precision than the target leaves exact methods' outputs alone,
and `auto` picks bfloat16 only where torch says the CPU supports it and it measures faster."""
from __future__ import annotations

import pytest
import torch

from lvspec_eval.backends import draft_precision
from lvspec_eval.backends.loading import load_backend, load_draft
from lvspec_eval.decoding import loop, methods
from lvspec_eval.measure.bench import make_samples
from lvspec_eval.models.args import ModelArgs

TREES = {"adaptive": {}, "chain": {"tree": "chain", "tree_depth": 5},
         "dynamic": {"tree": "dynamic", "tree_depth": 4, "tree_topk": 4, "tree_total": 12}}


@pytest.fixture(scope="module")
def demo_pair():
    return load_backend("demo"), load_draft("demo-draft", "bfloat16")


def _decode(target, draft, method: str, tree: dict, sample, max_new_tokens: int = 32):
    spec = methods.resolve(method)
    drafter, verifier = methods.build(spec, methods.make_options(spec, dict(tree)), draft, target)
    return loop.generate(target, drafter, verifier, sample["prompt"], [sample["video"].request()], max_new_tokens)


@pytest.mark.parametrize("method", ["sd_tree", "specvlm"])
@pytest.mark.parametrize("tree", list(TREES))
def test_a_bfloat16_draft_keeps_exact_methods_token_identical(demo_pair, method, tree):
    target, draft = demo_pair
    assert draft.model.dtype == torch.bfloat16 and target.model.dtype == torch.float32
    accepted = 0
    for sample in make_samples("synthvid_caption", 2):
        want = _decode(target, None, "vanilla", {}, sample).tokens
        out = _decode(target, draft, method, TREES[tree], sample)
        assert out.tokens == want, f"{method} tree={tree} sample {sample['id']}"
        accepted += sum(out.stats.accepted_lengths)
    assert accepted > 0, "the bfloat16 draft proposed nothing the target accepted"


def test_a_bfloat16_draft_of_every_family_stays_lossless(family, make_case):
    draft = load_draft(str(family.draft.model.name_or_path), "bfloat16")
    for seed in range(3):
        case = make_case(seed, family.max_side, with_video=True)
        runs = {}
        for method, backend in (("vanilla", None), ("sd_tree", draft), ("specvlm", draft)):
            spec = methods.resolve(method)
            drafter, verifier = methods.build(spec, methods.make_options(spec, {"tree": "chain", "tree_depth": 4}),
                                              backend, family.target)
            runs[method] = loop.generate(family.target, drafter, verifier, case.prompt, case.videos, 10).tokens
        assert runs["sd_tree"] == runs["vanilla"] == runs["specvlm"], f"{family.name} seed {seed}"


def test_cast_keeps_the_rotary_frequencies_in_float32(demo_pair):
    draft = demo_pair[1]
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
    monkeypatch.setattr(draft_precision, "bf16_supported", lambda device: False)
    monkeypatch.setattr(draft_precision, "measure_shape", lambda w: pytest.fail("measured without bfloat16 support"))
    decision = draft_precision.choose(_layers(), torch.device("cpu"), torch.float32)
    assert decision.dtype == "float32" and "no bfloat16" in decision.reason


@pytest.mark.parametrize("bf16_ms,want", [(0.5, "bfloat16"), (0.95, "float32")])
def test_auto_picks_bfloat16_only_where_it_measures_faster(cache_dir, monkeypatch, bf16_ms, want):
    monkeypatch.setattr(draft_precision, "bf16_supported", lambda device: True)
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
        ModelArgs.parse({"draft_dtype": "int8"})
    with pytest.raises(ValueError, match="draft_dtype"):
        load_draft("demo-draft", "int8")
    assert ModelArgs.parse({"draft_dtype": "auto"}).runner_kwargs()["draft_dtype"] == "auto"
