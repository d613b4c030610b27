"""scripts/rejection_breakdown.py: chain steps that end on a mismatch are sorted by the target's
token there (a visual word of the demo world or another word); bonus tokens and the prefill's
first token are not mismatches; the bound merges the steps around every non-visual mismatch."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from transformers import AutoTokenizer

ROOT = Path(__file__).resolve().parent.parent
SPEC = importlib.util.spec_from_file_location("rejection_breakdown", ROOT / "scripts" / "rejection_breakdown.py")
breakdown_script = importlib.util.module_from_spec(SPEC)
SPEC.loader.exec_module(breakdown_script)


def test_mismatches_are_sorted_by_the_targets_word():
    tok = AutoTokenizer.from_pretrained(ROOT / "lvspec_eval" / "demo" / "checkpoints" / "tokenizer")
    words = ["There", " is", " one", " red", " square", " moves", " to"]
    ids = [tok.convert_tokens_to_ids(tok.tokenize(w))[0] for w in words]
    # the prefill's "There" (not a decode step), then four steps (chain depth 2): " is" accepted,
    # then the target's " one" (a visual word); the target's " red" (visual); " square moves"
    # accepted, then a bonus " to" (the chain was used up); the target's " to" (another word)
    rec = {"num_steps": 4, "accepted_lengths": [1, 0, 2, 0],
           "kinds": ["target", "exact", "target", "target", "exact", "exact", "target", "target"],
           "tokens": [ids[0], ids[1], ids[2], ids[3], ids[4], ids[5], ids[6], ids[6]],
           "relevance": [None, 0.6, 0.7, 0.5, 0.6, 0.6, None, 0.3],
           "replaced": [None, None, ids[3], ids[2], None, None, None, ids[5]]}  # what the draft had said
    out = breakdown_script.breakdown([rec], depth=2, tok=tok, threshold=0.55)
    assert (out["mismatch_steps"], out["at_visual_words"], out["at_other_words"]) == (3, 2, 1)
    assert out["top_other_words"] == [("to", 1)]
    assert out["tau"] == pytest.approx(3 / 4)
    assert out["tau_bound_other_words_loose"] == pytest.approx((3 + 1) / (4 - 1))
    assert (out["rejected_relevance_at_or_above_threshold"], out["rejected_relevance_below_threshold"]) == (1, 2)
    assert out["top_other_swaps"] == [("moves -> to", 1)]
    assert (out["other_words_rejected_as_visual"], out["other_words_rejected_as_implausible"]) == (0, 1)
    del rec["replaced"]  # records written before the field existed
    assert "top_other_swaps" not in breakdown_script.breakdown([rec], depth=2, tok=tok, threshold=0.55)
