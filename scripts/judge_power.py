"""How small a caption-fidelity loss does `lvspec-eval check` catch with an LLM judge? (issue 38)

Takes a vanilla demo run (`lvspec-eval demo --methods vanilla --length-methods "" --limit 20 --out
runs/power-vanilla`), makes one wrong-fact copy of each of its synthvid_caption captions (a colour,
shape or motion word swapped for another value, the kind rotating over the captions), and judges
the originals and the copies once in the given mode (cached: a rerun asks nothing twice). Then, for
k = 0, 1, 2, ...: a copy of the vanilla run, relabelled method=fly (a lossy method: only the
retention gate applies), whose first k captions (in a seeded order) carry the wrong fact, is
reported against vanilla with the judge's score as the quality metric (`lvspec-eval report
--metric synthvid_caption=judge_<mode>`), and gated with `lvspec-eval check --methods fly`. The
smallest k that fails the check is the loss the gate detects (a monotone search: it stops after
two failing k in a row).

    python scripts/judge_power.py runs/power-vanilla --mode facts --serve qwen2.5-coder-1.5b \\
        --out results/judge_power/qwen2.5-coder-1.5b_facts.json

Judge options are those of `lvspec-eval judge` (--serve, --cache, --base-url, ...).
"""
from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from judges import cli as judge_cli
from judges.client import CaptionItem, score_captions
from lvspec_eval.demo import tasks_data, world
from lvspec_eval.jsonl import read_jsonl

TASK = "synthvid_caption"
METHOD = "fly"
_KINDS = {"colour": tuple(world.COLOURS), "shape": world.SHAPES, "motion": ("left", "right", "up", "down")}


def wrong_fact(caption: str, kind_order: list[str], rng: random.Random) -> tuple[str, str]:
    """`caption` with its first word of the first kind (in `kind_order`) that it has swapped for
    another value of that kind, and what was swapped ("colour: red -> blue")."""
    for kind in kind_order:
        values = _KINDS[kind]
        match = re.search(r"\b(" + "|".join(values) + r")\b", caption)
        if match:
            new = rng.choice([v for v in values if v != match.group(1)])
            return caption[:match.start()] + new + caption[match.end():], f"{kind}: {match.group(1)} -> {new}"
    raise ValueError(f"caption has no colour, shape or motion word to swap: {caption!r}")


def paraphrase(caption: str, scene: world.Scene) -> str:
    """Another wording of `scene`'s caption (the world's paraphrase grammar), not `caption` itself."""
    for seed in range(scene.seed * 31 + 1, scene.seed * 31 + 50):
        text = world.make_caption(scene, seed=seed)
        if text != caption:
            return text
    raise ValueError(f"no other wording of scene {scene.seed} found")


def vanilla_files(run: Path) -> tuple[Path, Path]:
    """The vanilla run's folder (holding <model>/<date>_results.json) and its caption samples file."""
    found = sorted(run.rglob(f"*_samples_{TASK}.jsonl"))
    found = [f for f in found if "vanilla" in f.parts] or found
    if not found:
        raise ValueError(f"no *_samples_{TASK}.jsonl under {run}")
    return found[0].parent.parent, found[0]


def copy_run(src: Path, dst: Path, method: str, captions: dict[int, str], scores: dict[int, dict], mode: str) -> None:
    """`src` (one lmms-eval output folder with its stats.jsonl) copied to `dst` as a run of
    `method`, with the caption samples' answers replaced by `captions` and the judge's scores
    written as metric judge_<mode> (the form `lvspec-eval judge --annotate` writes)."""
    shutil.copytree(src, dst)
    stats = dst / "stats.jsonl"
    for results in dst.rglob("*_results.json"):
        data = json.loads(results.read_text())
        args = re.sub(r"method=[^,]*", f"method={method}", data["config"]["model_args"])
        data["config"]["model_args"] = re.sub(r"stats_path=[^,]*", f"stats_path={stats}", args)
        results.write_text(json.dumps(data))
    if stats.exists():
        records = read_jsonl(stats)
        stats.write_text("".join(json.dumps({**r, "method": method}) + "\n" for r in records))
    for samples in dst.rglob(f"*_samples_{TASK}.jsonl"):
        lines = read_jsonl(samples)
        for sample in lines:
            sample["filtered_resps"] = captions[sample["doc_id"]]
            sample[f"judge_{mode}"] = scores[sample["doc_id"]]
        samples.write_text("".join(json.dumps(s) + "\n" for s in lines))


def gate(workdir: Path, vanilla: Path, original: dict, wrong: dict, scores: dict, k_ids: list[int],
         mode: str) -> dict:
    """Report and check one k: the first len(k_ids) of the order carry the wrong fact."""
    here = workdir / f"k{len(k_ids)}"
    if here.exists():
        shutil.rmtree(here)
    orig_scores = {d: scores[("orig", d)] for d in original}
    copy_run(vanilla, here / "vanilla", "vanilla", original, orig_scores, mode)
    method_captions = {d: (wrong[d] if d in k_ids else original[d]) for d in original}
    method_scores = {d: (scores[("wrong", d)] if d in k_ids else scores[("orig", d)]) for d in original}
    copy_run(vanilla, here / METHOD, METHOD, method_captions, method_scores, mode)
    cmd = [sys.executable, "-m", "lvspec_eval.cli"]
    subprocess.run(cmd + ["report", str(here / "vanilla"), str(here / METHOD), "-o", str(here / "report"),
                          "--no-plots", "--metric", f"{TASK}=judge_{mode}"], check=True, capture_output=True)
    check = subprocess.run(cmd + ["check", str(here / "report" / "summary.json"), "--methods", METHOD],
                           capture_output=True, text=True)
    summary = json.loads((here / "report" / "summary.json").read_text())
    row = next(r for r in summary["rows"] if r["task"] == TASK and r["method"] == METHOD)
    return {"k": len(k_ids), "check_passes": check.returncode == 0, "retention": row["retention"],
            "retention_ci": row["retention_ci"], "quality": row["quality"], "vanilla_quality": row["vanilla_quality"],
            "check_output": (check.stdout + check.stderr).strip().splitlines()[-3:]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="the vanilla demo run (its --out folder)")
    parser.add_argument("--out", type=Path, required=True, help="JSON result")
    parser.add_argument("--perturb-seed", type=int, default=0)
    parser.add_argument("--change", choices=("wrong-fact", "paraphrase"), default="wrong-fact",
                        help="what the k captions get: one wrong fact, or (a control: no fact lost) another "
                             "wording of the same scene, which a judge should not mark down")
    parser.add_argument("--workdir", type=Path, default=None, help="where the run copies go (default: a temp dir)")
    judge_cli._add_judge_options(parser)
    args = parser.parse_args(argv)

    vanilla, samples = vanilla_files(args.run)
    items = judge_cli.read_samples(samples, with_facts=args.mode == "facts")
    rng = random.Random(args.perturb_seed)
    kinds = list(_KINDS)
    original, wrong, swapped = {}, {}, {}
    scenes = {n: world.Scene.from_dict(doc["scene"]) for n, doc in enumerate(tasks_data.load_docs(TASK))}
    for n, item in enumerate(items):
        doc_id = judge_cli._doc_id(item.key.rsplit("/", 1)[1])
        original[doc_id] = item.caption
        if args.change == "paraphrase":
            wrong[doc_id], swapped[doc_id] = paraphrase(item.caption, scenes[doc_id]), "paraphrase"
        else:
            wrong[doc_id], swapped[doc_id] = wrong_fact(item.caption, kinds[n % 3:] + kinds[:n % 3], rng)
    order = list(original)
    rng.shuffle(order)

    judged_items = [CaptionItem(f"orig/{d}", original[d], i.reference, i.question, i.qa, i.reference_facts)
                    for d, i in zip(original, items)]
    judged_items += [CaptionItem(f"wrong/{d}", wrong[d], i.reference, i.question, i.qa, i.reference_facts)
                     for d, i in zip(original, items)]
    with judge_cli._served(args) as extra, judge_cli._client(args, **extra) as client:
        results = score_captions(client, judged_items, args.mode, args.caption_facts)
        judge_info = client.describe()
    scores = {}
    for r in results:
        which, doc = r["key"].split("/")
        scores[(which, int(doc))] = {"score": r["score"], "judge_error": "; ".join(r["errors"]) or None}

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="judge_power_"))
    steps, fails = [], 0
    for k in range(len(order) + 1):
        steps.append(gate(workdir, vanilla, original, wrong, scores, order[:k], args.mode))
        print(json.dumps({x: steps[-1][x] for x in ("k", "check_passes", "retention", "retention_ci")}), flush=True)
        fails = 0 if steps[-1]["check_passes"] else fails + 1
        if fails == 2:
            break
    first_fail = next((s["k"] for s in steps if not s["check_passes"]), None)
    caught = sum(scores[("wrong", d)]["score"] is not None and scores[("orig", d)]["score"] is not None
                 and scores[("wrong", d)]["score"] < scores[("orig", d)]["score"] for d in original)
    report = {"mode": args.mode, "caption_facts": args.caption_facts if args.mode == "facts" else None,
              "change": args.change, "run": str(args.run), "num_captions": len(order), "first_failing_k": first_fail,
              "wrong_scored_lower": caught, "order": order, "steps": steps, "judge": judge_info,
              "captions": [{"doc_id": d, "swap": swapped[d], "score": scores[("orig", d)]["score"],
                            "wrong_score": scores[("wrong", d)]["score"]} for d in original]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"{args.mode}: check fails from k = {first_fail} of {len(order)} captions changed ({args.change}; "
          f"{caught} of {len(order)} changed captions scored below their original)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
