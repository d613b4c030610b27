"""Which fact checks does a judge get wrong? The tuning tool behind mode facts' wording (issue 38).

On demo scenes the truth of every fact-check question is known: the oracle says which scene facts
a caption states right (an identical or paraphrased caption all of them, and every one of its
sentences is right; a caption with one swapped fact, judge-check's perturbed-1, all but that one).
For each scene's identity, paraphrase and three single-swap captions this asks the judge the recall
questions (each scene fact against the caption) and, for the identity and paraphrase captions, the
precision questions (each sentence against the reference), and counts the wrong answers: a "no" to
a true statement, a "yes" to a false one. `--wording bare` names the objects "The first object" (the
first wording), `appear` "The first object to appear" (judges/oracle.scene_facts).

    python scripts/judge_fact_errors.py --serve qwen2.5-coder-1.5b --first-seed 20000 --num-scenes 20 \\
        --wording bare --out results/judge_check/fact_errors_bare.json

Tune on scenes you do not report (judge-check reports 10000-10019). Judge options are those of
`lvspec-eval judge` (--serve, --serve-threads, --cache, --base-url, ...).
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from judges import cli as judge_cli
from judges import facts, oracle, prompts, validate
from judges.client import JudgeRequest
from lvspec_eval.demo import world


def reword(fact: str, wording: str) -> str:
    return re.sub(r"^The (\w+) object to appear", r"The \1 object", fact) if wording == "bare" else fact


def questions(num_scenes: int, first_seed: int, wording: str) -> list[dict]:
    """Every question with its truth (the oracle's): {scene_seed, kind, side, text, fact, truth}."""
    out = []
    for c in validate.make_candidates(num_scenes, first_seed):
        if c.kind not in ("identity", "paraphrase", "perturbed-1"):
            continue
        scene = world.make_scene(c.scene_seed)
        right = oracle.correct_facts(c.caption, scene)
        out += [dict(scene_seed=c.scene_seed, kind=c.kind, side="recall", text=c.caption, fact=reword(f, wording),
                     truth=fact_id in right) for f, fact_id in zip(c.reference_facts, oracle.scene_fact_ids(scene))]
        if not c.swaps:
            out += [dict(scene_seed=c.scene_seed, kind=c.kind, side="precision", text=c.reference, fact=f, truth=True)
                    for f in facts.sentence_facts(c.caption)]
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--first-seed", type=int, default=20_000)
    parser.add_argument("--num-scenes", type=int, default=20)
    parser.add_argument("--wording", choices=("appear", "bare"), default="appear")
    parser.add_argument("--out", type=Path, required=True, help="JSON: the counts and every wrong answer")
    judge_cli._add_judge_options(parser)
    args = parser.parse_args(argv)
    rows = questions(args.num_scenes, args.first_seed, args.wording)
    with judge_cli._served(args) as extra, judge_cli._client(args, **extra) as client:
        judged = client.judge_many([JudgeRequest(prompts.FACT_CHECK, prompts.fact_check_messages(r["text"], r["fact"]))
                                    for r in rows], desc="fact checks")
        stats = client.stats.as_dict()
    for row, judgment in zip(rows, judged):
        row["answer"] = None if judgment.value is None else judgment.value["answer"]
    said_no = {(r["scene_seed"], r["kind"]) for r in rows if r["truth"] and r["answer"] == "no"}
    identity = sorted({r["scene_seed"] for r in rows if r["kind"] == "identity"})
    report = {"first_seed": args.first_seed, "num_scenes": args.num_scenes, "wording": args.wording,
              "questions": len(rows), "true": sum(r["truth"] for r in rows),
              "false": sum(not r["truth"] for r in rows),
              "wrong_no": sum(r["truth"] and r["answer"] == "no" for r in rows),
              "wrong_yes": sum(not r["truth"] and r["answer"] == "yes" for r in rows),
              "missing": sum(r["answer"] is None for r in rows),
              "identity_all_yes": sum((s, "identity") not in said_no for s in identity) / len(identity),
              "judge": stats,
              "wrong": [r for r in rows if r["answer"] is not None and (r["answer"] == "yes") != r["truth"]]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps({k: v for k, v in report.items() if k not in ("wrong", "judge")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
