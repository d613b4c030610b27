"""Divergence of exact methods from vanilla (issue 17: "divergence is reported, not hidden"):
the tolerance per dtype, the first differing slot, near-tie vs bug, pairing, and the check lines."""
from __future__ import annotations

import pytest
import torch

from lvspec_eval.reporting import divergence as dv
from lvspec_eval.reporting import report


def rec(method, doc, tokens, margins=None, dtype="bfloat16", task="cap", **extra):
    return {"method": method, "task": task, "doc_id": doc, "error": None, "tokens": tokens, "margins": margins,
            "dtype": dtype, **extra}


def test_tolerances_follow_the_stated_formula():
    assert dv.tolerance("float32") == pytest.approx(1e-3)  # the floor: 4 * 2^-23 * 16 = 7.6e-6 is below it
    assert dv.tolerance("float16") == pytest.approx(4 * 2**-10 * 16)  # 0.0625
    assert dv.tolerance("bfloat16") == pytest.approx(4 * 2**-7 * 16)  # 0.5
    assert dv.tolerance("torch.bfloat16") == dv.tolerance("bfloat16")
    assert dv.tolerance("bfloat16", logit_scale=6.0) == pytest.approx(4 * 2**-7 * 6)  # rounding grows with the logit
    assert dv.tolerance("float32", logit_scale=6.0) == pytest.approx(1e-3)
    assert dv.TOLERANCES["bfloat16"] > dv.TOLERANCES["float16"] > dv.TOLERANCES["float32"]
    with pytest.raises(ValueError, match="dtype 'int8'.*known: float64, float32, float16, bfloat16"):
        dv.tolerance("int8")


@pytest.mark.parametrize("a, b, expected", [
    ([1, 2, 3], [1, 2, 3], None),
    ([1, 2, 3], [1, 5, 3], 1),
    ([4], [5], 0),
    ([1, 2], [1, 2, 3], 2),  # one run stopped (EOS) where the other went on
    ([], [7], 0),
])
def test_first_difference(a, b, expected):
    assert dv.first_difference(a, b) == expected


@pytest.mark.parametrize("margins, tol, kind", [
    ((0.1, 0.3), 0.5, dv.NEAR_TIE),  # together within 2 x tolerance: rounding can swap them
    ((0.5, 0.5), 0.5, dv.NEAR_TIE),
    ((0.1, 3.0), 0.5, dv.ELSEWHERE),  # one run was 3 logits sure: rounding of 0.5 cannot undo that
    ((0.6, 0.6), 0.5, dv.ELSEWHERE),
    ((None, 2.0), 0.5, dv.ELSEWHERE),  # one run stopped there (no margin: counts 0), the other decides
    ((None, 0.01), 0.5, dv.NEAR_TIE),
    ((None, None), 0.5, dv.UNCLASSIFIED),  # records from before margins existed
    ((0.1, 0.1), None, dv.UNCLASSIFIED),  # no dtype, no tolerance
])
def test_classify(margins, tol, kind):
    assert dv.classify(margins, tol) == kind


def test_a_near_tie_at_the_first_differing_slot_is_numerics():
    vanilla = rec("vanilla", 0, [5, 6, 7, 8], [4.0, 3.0, 0.2, 2.0])
    method = rec("sd_tree", 0, [5, 6, 9, 9], [4.0, 3.0, 0.3, 1.0])
    basis, div = dv.compare(method, vanilla)
    assert basis == "runs" and (div.index, div.margin, div.vanilla_margin, div.kind) == (2, 0.3, 0.2, dv.NEAR_TIE)
    assert (div.logit_scale, div.tolerance) == (16.0, 0.5)
    # the same slot in fp32: margins of 0.2 and 0.3 logits are far above the 1e-3 tolerance -> a bug
    basis, div = dv.compare({**method, "dtype": "float32"}, {**vanilla, "dtype": "float32"})
    assert div.kind == dv.ELSEWHERE and div.tolerance == pytest.approx(1e-3)
    # bf16 logits of size 4 round in steps of 2^-5: a tolerance of 0.125, and 0.3 + 0.2 > 0.25 -> a bug
    assert dv.compare(method, vanilla, logit_scale=4.0)[1].kind == dv.ELSEWHERE


def test_top_logits_in_the_records_set_the_scale_per_slot():
    vanilla = rec("vanilla", 0, [5, 7], [3.0, 0.2], top_logits=[30.0, 32.0])
    method = rec("sd_tree", 0, [5, 9], [3.0, 0.3], top_logits=[30.0, 31.0])
    div = dv.compare(method, vanilla, logit_scale=4.0)[1]  # the records' own scale wins over the given one
    assert div.logit_scale == 32.0 and div.tolerance == pytest.approx(4 * 2**-7 * 32) and div.kind == dv.NEAR_TIE


def test_a_large_margin_at_the_first_differing_slot_is_a_bug_even_after_earlier_near_ties():
    vanilla = rec("vanilla", 0, [5, 6, 7], [0.01, 0.01, 5.0])  # near-ties before the divergence do not count
    method = rec("sd_tree", 0, [5, 6, 9], [0.01, 0.01, 4.0])
    assert dv.compare(method, vanilla)[1].kind == dv.ELSEWHERE


def test_paired_vanilla_tokens_take_precedence_over_the_vanilla_run():
    vanilla_run = rec("vanilla", 0, [1, 2, 3], [1.0, 1.0, 1.0])  # another process: differs at slot 1
    method = rec("sd_tree", 0, [1, 4, 3], [1.0, 0.05, 1.0], vanilla_tokens=[1, 4, 3], vanilla_margins=[1.0, 0.05, 1.0])
    assert dv.compare(method, vanilla_run) == ("paired", None)  # identical to the vanilla decoded beside it
    method = rec("sd_tree", 0, [1, 4, 3], [1.0, 0.05, 1.0], vanilla_tokens=[1, 2, 3])  # no vanilla_margins yet
    basis, div = dv.compare(method, None)
    assert basis == "paired" and (div.margin, div.vanilla_margin, div.kind) == (0.05, None, dv.NEAR_TIE)
    method = {**method, "vanilla_margins": [1.0, 2.0, 1.0]}  # vanilla was 2 logits sure there
    assert dv.compare(method, vanilla_run)[1].kind == dv.ELSEWHERE


def test_failed_or_tokenless_samples_are_not_compared():
    vanilla = rec("vanilla", 0, [1, 2])
    assert dv.compare({**rec("sd_tree", 0, []), "error": "CUDA out of memory"}, vanilla) == (None, None)
    assert dv.compare(rec("sd_tree", 0, [1, 2]), {**vanilla, "error": "boom"}) == (None, None)
    assert dv.compare(rec("sd_tree", 0, [1, 2]), None) == (None, None)


def test_summary_counts_per_exact_method_and_skips_lossy_ones():
    records = {
        "vanilla": [rec("vanilla", d, [1, 2, 3], [2.0, 2.0, 0.4 if d == 2 else 2.0]) for d in range(4)],
        "sd_tree": [rec("sd_tree", 0, [1, 2, 3], [2.0, 2.0, 2.0]),
                    rec("sd_tree", 1, [1, 7, 3], [2.0, 0.25, 2.0]),  # 0.25 + 2.0 > 2 x 0.5 (bf16): a bug
                    rec("sd_tree", 2, [1, 2, 8], [2.0, 2.0, 0.1]),  # 0.1 + 0.4 <= 1: a near-tie
                    rec("sd_tree", 3, [1, 2], [2.0, 2.0])],  # stopped early: vanilla's margin 2.0 decides
        "lvspec": [rec("lvspec", d, [9, 9, 9], [0.0] * 3) for d in range(4)],  # lossy: not judged
    }
    out = dv.divergence_summary(records)
    assert set(out["methods"]) == {"sd_tree"} and out["elsewhere"] == 2
    sd = out["methods"]["sd_tree"]
    assert (sd["compared"], sd["diverged"], sd["near_tie"], sd["elsewhere"], sd["unclassified"]) == (4, 3, 1, 2, 0)
    assert sd["dtype"] == "bfloat16" and sd["tolerance"] == 0.5 and sd["basis"] == "runs"
    assert [d["doc_id"] for d in sd["first_divergences"]] == ["1", "3", "2"]  # bugs listed first
    assert report.divergence_summary is dv.divergence_summary  # what `check` and the lead call
    with pytest.raises(ValueError, match="no 'vanilla' records"):
        dv.divergence_summary({"sd_tree": records["sd_tree"]})


def test_bench_records_pair_by_sample():
    vanilla = [{"sample": k, "tokens": [k, 1], "margins": [1.0, 1.0], "dtype": "float32", "error": None}
               for k in (0, 1)]
    method = [{"sample": k, "tokens": [k, 2 if k else 1], "margins": [1.0, 1.0], "dtype": "float32", "error": None}
              for k in (1, 0)]  # another order
    sd = dv.divergence_summary({"vanilla": vanilla, "sd_tree": method})["methods"]["sd_tree"]
    assert (sd["compared"], sd["diverged"], sd["elsewhere"]) == (2, 1, 1)
    assert sd["first_divergences"][0]["doc_id"] == "1"


def test_check_lines_name_the_buggy_rows_only():
    row = {"task": "cap", "method": "sd_tree", "divergence": dv.row_fields(
        {"0": rec("sd_tree", 0, [1, 9], [3.0, 3.0]), "1": rec("sd_tree", 1, [1, 8], [3.0, 0.1])},
        {"0": rec("vanilla", 0, [1, 2], [3.0, 2.0]), "1": rec("vanilla", 1, [1, 2], [3.0, 0.2])})}
    tie_only = {"task": "mc", "method": "specvlm", "divergence": dv.row_fields(
        {"0": rec("specvlm", 0, [1, 8], [3.0, 0.1], task="mc")},
        {"0": rec("vanilla", 0, [1, 2], [3.0, 0.2], task="mc")})}
    lines = dv.failures({"rows": [row, tie_only, {"task": "cap", "method": "vanilla"}]})
    assert len(lines) == 1 and lines[0].startswith("FAIL sd_tree on cap: 1 of 2 samples")
    assert "doc 0 slot 1, margins 3 / 2" in lines[0]
    assert "too wide for rounding (tolerance 0.5 for bfloat16)" in lines[0]
    section = dv.markdown_section([row, tie_only])
    assert "| cap | sd_tree | bfloat16 | 0.5 | runs | 2 | 2 | 1 | 1 | 0 |" in section
    assert "| mc | specvlm | bfloat16 | 0.5 | runs | 1 | 1 | 1 | 0 | 0 |" in section
    assert dv.markdown_section([{"task": "cap", "method": "lvspec"}]) == ""


# ---- tiny real models through the runner: bf16 divergences are near-ties, fp32 has none ----------

NUM_PROMPTS, NEW_TOKENS = 6, 32


def decode_records(path: str, dtype: str, cases, methods=("vanilla", "sd_tree")) -> dict[str, list[dict]]:
    """Each case decoded by each method (Self-SD sd_tree: the target drafts for itself, as in the
    issue's bf16 observation) through the Runner, one stats record per case as lmms-eval's model
    writes it. The tree is a fixed dynamic one: the adaptive default may choose chains, or no draft
    at all on a model this small, and a chain cannot show a tree-mask fault."""
    from lvspec_eval.backends.loading import load_backend
    from lvspec_eval.decoding.runner import Runner, VideoInput

    target = load_backend(path, dtype=dtype)
    options = {m: {} if m == "vanilla" else {"tree": "dynamic"} for m in methods}
    runners = {m: Runner(path, method=m, draft="self", dtype=dtype, target_backend=target, options=options[m])
               for m in methods}
    records: dict[str, list[dict]] = {m: [] for m in methods}
    for k, case in enumerate(cases):
        videos = [VideoInput(frames, fps) for frames, fps in case.videos]
        for method, runner in runners.items():
            gen = runner.generate(case.prompt, videos, NEW_TOKENS)
            records[method].append({**gen.stats, "task": "tiny_qwen", "doc_id": k, "error": None})
    return records


def assert_records_carry_margins(records: dict, dtype: str) -> None:
    for recs in records.values():
        for r in recs:
            assert "margins" in r, "stats records lack 'margins' (issue 17: one per committed token)"
            assert len(r["margins"]) == len(r["tokens"]) and all(m >= 0 for m in r["margins"])
            assert r["dtype"] == dtype


@pytest.fixture(scope="module")
def tiny_cases(make_case):
    return [make_case(100 + k, 84) for k in range(NUM_PROMPTS)]


@pytest.fixture(scope="module")
def qwen_path(qwen_family) -> str:
    return qwen_family.target.model.name_or_path  # the fp32 checkpoint conftest saved; loaded again per dtype


@pytest.fixture(scope="module")
def logit_scale(qwen_family, tiny_cases) -> float:
    """The tiny target's typical top-1 logit (median over the cases' first tokens): the L of the
    tolerance (about 6 here, where a trained model's are near the default 16)."""
    backend, tops = qwen_family.target, []
    for case in tiny_cases:
        _, logits = backend.prefill(backend.prepare(case.prompt, case.videos))
        tops.append(float(logits.max()))
    return float(torch.tensor(tops).median())


def test_bf16_divergences_from_vanilla_are_near_ties(qwen_path, tiny_cases, logit_scale):
    records = decode_records(qwen_path, "bfloat16", tiny_cases)
    assert_records_carry_margins(records, "bfloat16")
    out = dv.divergence_summary(records, logit_scale=logit_scale)
    sd = out["methods"]["sd_tree"]
    print(f"bf16 sd_tree vs vanilla (L = {logit_scale:.2f}):",
          {k: sd[k] for k in ("compared", "diverged", "near_tie", "elsewhere", "tolerance")}, sd["first_divergences"])
    assert 3 < logit_scale < 12 and sd["tolerance"] == pytest.approx(dv.tolerance("bfloat16", logit_scale))
    assert sd["compared"] == NUM_PROMPTS
    assert sd["unclassified"] == 0 and sd["elsewhere"] == 0, sd["first_divergences"]
    assert out["elsewhere"] == 0


def test_fp32_does_not_diverge(qwen_path, tiny_cases, logit_scale):
    records = decode_records(qwen_path, "float32", tiny_cases)
    assert_records_carry_margins(records, "float32")
    sd = dv.divergence_summary(records, logit_scale=logit_scale)["methods"]["sd_tree"]
    assert (sd["compared"], sd["diverged"]) == (NUM_PROMPTS, 0)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_broken_tree_mask_is_reported_as_a_bug_not_numerics(qwen_path, tiny_cases, logit_scale, monkeypatch, dtype):
    """The classification's negative control: verification that ignores the tree mask (every node
    sees every earlier node, as a kernel that takes no tree mask would) is not lossless, and its
    divergences land where the target was not close to a tie, in bf16 too."""
    from lvspec_eval.backends import tree_layout

    layout = tree_layout.pending_and_tree_layout

    def causal_layout(*args, **kwargs):
        offsets, visible = layout(*args, **kwargs)
        return offsets, torch.ones_like(visible).tril()

    monkeypatch.setattr(tree_layout, "pending_and_tree_layout", causal_layout)
    records = decode_records(qwen_path, dtype, tiny_cases)
    sd = dv.divergence_summary(records, logit_scale=logit_scale)["methods"]["sd_tree"]
    print(f"{dtype} sd_tree with a causal mask:", {k: sd[k] for k in ("compared", "diverged", "near_tie", "elsewhere")})
    assert sd["diverged"] >= 1 and sd["elsewhere"] >= 1, sd
