"""Divergence of exact methods from vanilla (issue 17: "divergence is reported, not hidden"):
the tolerance per dtype, the first differing slot, near-tie vs bug, pairing, and the check lines."""
from __future__ import annotations

import pytest

from lvspec_eval import divergence as dv
from lvspec_eval import report


def rec(method, doc, tokens, margins=None, dtype="bfloat16", task="cap", **extra):
    return {"method": method, "task": task, "doc_id": doc, "error": None, "tokens": tokens, "margins": margins,
            "dtype": dtype, **extra}


def test_tolerances_follow_the_stated_formula():
    assert dv.tolerance("float32") == pytest.approx(1e-3)  # the floor: 4 * 2^-23 * 16 = 7.6e-6 is below it
    assert dv.tolerance("float16") == pytest.approx(4 * 2**-10 * 16)  # 0.0625
    assert dv.tolerance("bfloat16") == pytest.approx(4 * 2**-7 * 16)  # 0.5
    assert dv.tolerance("torch.bfloat16") == dv.tolerance("bfloat16")
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
    ((0.1, 3.0), 0.5, dv.NEAR_TIE),  # either run's margin below the tolerance
    ((3.0, 0.2), 0.5, dv.NEAR_TIE),
    ((0.6, 2.0), 0.5, dv.ELSEWHERE),  # both clear of it: not rounding
    ((None, 2.0), 0.5, dv.ELSEWHERE),  # one run stopped there: the other decides alone
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
    # the same slot in fp32: margins of 0.2 and 0.3 logits are far above the 1e-3 tolerance -> a bug
    basis, div = dv.compare({**method, "dtype": "float32"}, {**vanilla, "dtype": "float32"})
    assert div.kind == dv.ELSEWHERE and div.tolerance == pytest.approx(1e-3)


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


def test_failed_or_tokenless_samples_are_not_compared():
    vanilla = rec("vanilla", 0, [1, 2])
    assert dv.compare({**rec("sd_tree", 0, []), "error": "CUDA out of memory"}, vanilla) == (None, None)
    assert dv.compare(rec("sd_tree", 0, [1, 2]), {**vanilla, "error": "boom"}) == (None, None)
    assert dv.compare(rec("sd_tree", 0, [1, 2]), None) == (None, None)


def test_summary_counts_per_exact_method_and_skips_lossy_ones():
    records = {
        "vanilla": [rec("vanilla", d, [1, 2, 3], [2.0, 2.0, 2.0]) for d in range(4)],
        "sd_tree": [rec("sd_tree", 0, [1, 2, 3], [2.0, 2.0, 2.0]),
                    rec("sd_tree", 1, [1, 7, 3], [2.0, 0.25, 2.0]),  # near-tie (bf16 tolerance 0.5)
                    rec("sd_tree", 2, [1, 2, 8], [2.0, 2.0, 1.5]),  # a bug: 1.5 and 2.0 both clear 0.5
                    rec("sd_tree", 3, [1, 2], [2.0, 2.0])],  # stopped early: vanilla's margin 2.0 decides
        "lvspec": [rec("lvspec", d, [9, 9, 9], [0.0] * 3) for d in range(4)],  # lossy: not judged
    }
    out = dv.divergence_summary(records)
    assert set(out["methods"]) == {"sd_tree"} and out["elsewhere"] == 2
    sd = out["methods"]["sd_tree"]
    assert (sd["compared"], sd["diverged"], sd["near_tie"], sd["elsewhere"], sd["unclassified"]) == (4, 3, 1, 2, 0)
    assert sd["dtype"] == "bfloat16" and sd["tolerance"] == 0.5 and sd["basis"] == "runs"
    assert [d["doc_id"] for d in sd["first_divergences"]] == ["2", "3", "1"]  # bugs listed first
    assert report.divergence_summary is dv.divergence_summary  # what `check` and the lead call
    with pytest.raises(ValueError, match="no 'vanilla' records"):
        dv.divergence_summary({"sd_tree": records["sd_tree"]})


def test_bench_records_pair_by_sample():
    vanilla = [{"sample": k, "tokens": [k, 1], "margins": [1.0, 1.0], "dtype": "float32", "error": None} for k in (0, 1)]
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
        {"0": rec("specvlm", 0, [1, 8], [3.0, 0.1], task="mc")}, {"0": rec("vanilla", 0, [1, 2], [3.0, 0.2], task="mc")})}
    lines = dv.failures({"rows": [row, tie_only, {"task": "cap", "method": "vanilla"}]})
    assert len(lines) == 1 and lines[0].startswith("FAIL sd_tree on cap: 1 of 2 samples")
    assert "doc 0 slot 1, margins 3 / 2" in lines[0]
    section = dv.markdown_section([row, tie_only])
    assert "| cap | sd_tree | bfloat16 | 0.5 | runs | 2 | 2 | 1 | 1 | 0 |" in section
    assert "| mc | specvlm | bfloat16 | 0.5 | runs | 1 | 1 | 1 | 0 | 0 |" in section
    assert dv.markdown_section([{"task": "cap", "method": "lvspec"}]) == ""
