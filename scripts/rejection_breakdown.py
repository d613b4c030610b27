"""Where do draft chains break? Reads `lvspec-eval bench --records` JSONL of chain-draft runs and,
per method, sorts every step that ended on a mismatch (fewer than `depth` draft tokens accepted) by
the target's token there: a visual word of the demo world (colour, shape, size, motion, count,
background) or another word. The other words are what loose verification may recover; the visual
ones are what LVSpec keeps strict. Some "other" words carry a fact too (`is`/`are` a count,
`moves`/`stays` a motion, the `.` that ends a caption the number of objects), so the bound, which
assumes every non-visual mismatch became an acceptance (the two steps around it merge into one),
is generous. Records that name the draft token the target overruled (`replaced`) also give the
most frequent "draft -> target" swaps at the non-visual mismatches. For LVSpec's records it also
splits the mismatches by the relevance of the rejected draft token (the target's token carries it):
at or above the threshold (rejected as visual) or below it (loose-eligible, rejected as
implausible), and does so for the non-visual mismatches alone.

    lvspec-eval bench --methods vanilla,specvlm,fly,lvspec --task synthvid_caption --limit 20 \\
        --options tree=chain,tree_depth=10 --records chain.jsonl
    python scripts/rejection_breakdown.py chain.jsonl 10 [out.json] [threshold]
"""
from __future__ import annotations

import collections
import json
import sys

from transformers import AutoTokenizer

from lvspec_eval.backends.loading import DEMO_NAMES
from lvspec_eval.measure.sweep import VISUAL_WORDS as VISUAL  # the sweep's relevance probe uses the same list


def breakdown(records: list[dict], depth: int, tok, threshold: float) -> dict:
    steps = accepted = visual = strict = below = 0
    other, swaps = collections.Counter(), collections.Counter()
    other_by_relevance = collections.Counter()
    for r in records:
        steps += r["num_steps"]  # as bench's tau counts them
        accepted += sum(r["accepted_lengths"])
        # the target's token closing each decode step (index 0 is the prefill's token, not a step)
        ends = [i for i, k in enumerate(r["kinds"]) if k == "target"][1:]
        rel = r.get("relevance") or [None] * len(r["kinds"])
        replaced = r.get("replaced") or [None] * len(r["kinds"])
        for acc, end in zip(r["accepted_lengths"], ends):
            if acc >= depth:  # the path was used up: a bonus token, not a mismatch
                continue
            word = tok.decode([r["tokens"][end]]).strip().lower()
            if word in VISUAL:
                visual += 1
            else:
                other[word] += 1
                if replaced[end] is not None:  # what the draft had said there
                    swaps[f"{tok.decode([replaced[end]]).strip()} -> {word}"] += 1
            if rel[end] is not None:
                strict += rel[end] >= threshold
                below += rel[end] < threshold
                if word not in VISUAL:
                    other_by_relevance["strict" if rel[end] >= threshold else "implausible"] += 1
    mismatches = visual + sum(other.values())
    out = {"samples": len(records), "steps": steps, "tau": accepted / steps, "mismatch_steps": mismatches,
           "at_visual_words": visual, "at_other_words": mismatches - visual,
           "tau_bound_other_words_loose": (accepted + mismatches - visual) / max(1, steps - (mismatches - visual)),
           "top_other_words": other.most_common(8)}
    if swaps:
        out["top_other_swaps"] = swaps.most_common(8)  # "draft -> target" at the non-visual mismatches
    if strict + below:
        out.update(rejected_relevance_at_or_above_threshold=strict, rejected_relevance_below_threshold=below,
                   other_words_rejected_as_visual=other_by_relevance["strict"],
                   other_words_rejected_as_implausible=other_by_relevance["implausible"])
    return out


def main() -> None:
    path, depth = sys.argv[1], int(sys.argv[2])
    out_path = sys.argv[3] if len(sys.argv) > 3 else None
    threshold = float(sys.argv[4]) if len(sys.argv) > 4 else 0.55
    tok = AutoTokenizer.from_pretrained(DEMO_NAMES["demo"])
    by_method = collections.defaultdict(list)
    for line in open(path):
        r = json.loads(line)
        if r["method"] != "vanilla" and not r.get("error"):
            by_method[r["method"]].append(r)
    result = {method: breakdown(recs, depth, tok, threshold) for method, recs in by_method.items()}
    for method, row in result.items():
        print(method, json.dumps(row))
    if out_path:
        with open(out_path, "w") as f:
            json.dump({"records": path, "depth": depth, "threshold": threshold, "methods": result}, f, indent=1)


if __name__ == "__main__":
    main()
