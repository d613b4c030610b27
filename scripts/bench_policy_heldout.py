"""Issue 53's figures, for an idle machine (`make bench-policy-heldout`; not part of `make test`).

    python scripts/bench_policy_heldout.py bench [--pair DIR] [--prompts heldout] [--per-kind 2] [--depths 2,3,4,6,8]
    python scripts/bench_policy_heldout.py demo-check NEW_SUMMARY.json [--reference results/demo/summary.json]

bench: the real pair (scripts/realpair/build.sh) on the held-out prompt set (`--prompts heldout`,
never tuned on; `--prompts builtin` for the set the policy was tuned on), 96 new tokens, target float32, the draft in --draft-dtype (int8 by default), one
process, the rows in rotating order per prompt (measure/bench.py run_methods): our vanilla; sd_tree
with tree=adaptive; sd_tree with tree=chain,tree_depth=D for each of --depths; transformers'
generate(); its assisted generation on our draft object and each of its own assistant settings
(bench.HF_ASSISTED_VARIANTS). Every output must equal vanilla's (exit 1 otherwise). It prints
adaptive over generate(), over the best assisted row and over the best chain (end-to-end tokens per
second, totals and medians of per-prompt ratios), and writes summary.json. Each prompt's rows are
appended to records.jsonl as soon as they are done; run again with the same settings and it goes on
from the first prompt not done (a records file from other settings is moved aside).

Run time depends on the machine's memory bandwidth (the fp32 target's token is a 6 GB read):
on an Intel Xeon's curve (target 271 ms a token) about 4 minutes a prompt with 5 chains and 5
assisted rows; on a 2-core AMD EPYC (AVX2 only) 7.5 minutes a prompt with 4 chains (vanilla 57 s,
generate() 64 s, the assisted rows 37-43 s, chains and adaptive 22-27 s), so `--per-kind 1` (3
prompts) takes about 25 minutes there, the default 6 prompts 45.

demo-check: every caption and multiple-choice row of a new demo summary (`lvspec-eval demo --out
DIR --length-methods ""`) against last round's reference (results/demo/summary.json): a row fails
where its end-to-end speedup is under the reference row's interval (e2e_speedup_ci's lower bound).
(`lvspec-eval check --baseline` holds rows to a relative tolerance instead, not to the interval.)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

HELDOUT = Path(__file__).resolve().parents[1] / "lvspec_eval" / "measure" / "prompt_sets" / "heldout.jsonl"
DEMO_TASKS = ("synthvid_caption", "synthvid_mcq")
LOAD = dict(device="cpu", dtype="float32", cpu_kernels="auto")  # as `lvspec-eval bench` loads on a CPU


def heldout_prompts(per_kind: int, start: int = 0) -> list[str]:
    """`per_kind` prompts of each kind from the start-th on, kinds interleaved (code, prose, qa, code, ...)."""
    rows = [json.loads(line) for line in HELDOUT.read_text(encoding="utf-8").splitlines() if line.strip()]
    kinds = list(dict.fromkeys(r["kind"] for r in rows))
    by_kind = {k: [r["prompt"] for r in rows if r["kind"] == k][start:start + per_kind] for k in kinds}
    return [by_kind[k][i] for i in range(per_kind) for k in kinds if i < len(by_kind[k])]


def chosen_prompts(source: str, per_kind: int, start: int = 0) -> list[str]:
    """The held-out set's `per_kind` prompts of each kind from the start-th on; another set
    (`builtin`, the one the policy was tuned on, or a file): 3 * per_kind prompts from the 3 * start-th."""
    if source == "heldout":
        return heldout_prompts(per_kind, start)
    from lvspec_eval.measure import prompts

    return prompts.load(source)[3 * start:3 * (start + per_kind)]


def runners(args, target, draft) -> dict:
    from lvspec_eval.decoding.runner import Runner
    from lvspec_eval.measure import bench

    common = dict(draft=args.draft, target_backend=target, draft_backend=draft, **LOAD)
    out = {"vanilla": Runner(args.target, "vanilla", target_backend=target, **LOAD),
           "adaptive": Runner(args.target, "sd_tree", options={"tree": "adaptive"}, **common)}
    for depth in map(int, args.depths.split(",")):
        out[f"chain{depth}"] = Runner(args.target, "sd_tree", options={"tree": "chain", "tree_depth": depth}, **common)
    hf = argparse.Namespace(hf_baseline=True, hf_assisted=True, hf_assistant_dtype="same", draft_vocab=None,
                            hf_assisted_variants="all", draft=args.draft, device="cpu")
    return {**out, **bench.hf_runners(hf, target, draft)}


def bench_main(args) -> int:
    import torch

    from lvspec_eval.backends.loading import load_backend, load_draft
    from lvspec_eval.measure import bench

    torch.set_num_threads(args.threads)
    prompts = chosen_prompts(args.prompts, args.per_kind, args.start)
    samples = [{"id": k, "scene": None, "prompt": p, "video": None, "answer": None} for k, p in enumerate(prompts)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: getattr(args, k) for k in ("prompts", "start", "target", "draft", "draft_dtype", "depths",
                                              "max_new_tokens", "threads")}
    records = resumed(out / "records.jsonl", settings, prompts)
    done = len(records["vanilla"]) if records else 0
    if done:
        print(f"resuming: {done} of {len(samples)} prompts already in {out / 'records.jsonl'}", flush=True)
    if done < len(samples):
        target = load_backend(args.target, **LOAD)
        draft = load_draft(args.draft, args.draft_dtype, **LOAD)
        new = bench.run_methods(runners(args, target, draft), samples[done:], args.max_new_tokens, first_index=done,
                                on_sample=lambda recs: append_records(out / "records.jsonl", recs, settings))
        records = {name: records.get(name, []) + recs for name, recs in new.items()}
    summary = figures(records)
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    return 0 if summary["all_identical"] else 1


def append_records(path: Path, sample_records: dict[str, dict], settings: dict) -> None:
    """One prompt's rows, each under its row's name (a record's own `method` is the decoder's:
    sd_tree for the adaptive row and every chain alike)."""
    with path.open("a") as f:
        for name, r in sample_records.items():
            f.write(json.dumps(dict(r, method=name, settings=settings), default=str) + "\n")


def resumed(path: Path, settings: dict, prompts: list[str]) -> dict[str, list[dict]]:
    """The records an interrupted run with the same settings left (name -> records, whole prompts
    only, in order); a file from other settings is moved aside, not mixed in."""
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if any(r.get("settings") != settings for r in rows):
        aside = path.with_suffix(".other-settings.jsonl")
        path.replace(aside)
        print(f"{path} came from other settings: moved to {aside}", flush=True)
        return {}
    records: dict[str, list[dict]] = {}
    for r in rows:
        records.setdefault(r["method"], []).append(r)
    whole = min(min(len(v) for v in records.values()), len(prompts))
    for k, recs in enumerate(records.get("vanilla", [])[:whole]):
        if recs["sample"] != k:
            raise SystemExit(f"{path}: prompt {k} out of order; delete the file to start again")
    return {name: recs[:whole] for name, recs in records.items()}


def _rate(recs: list[dict]) -> float:
    return sum(r["num_new_tokens"] for r in recs) / sum(r["e2e_s"] for r in recs)


def _median_ratio(a: list[dict], b: list[dict]) -> float:
    """Median over prompts of a's tokens/s over b's."""
    return statistics.median((x["num_new_tokens"] / x["e2e_s"]) / (y["num_new_tokens"] / y["e2e_s"])
                             for x, y in zip(a, b))


def figures(records: dict[str, list[dict]]) -> dict:
    """Rates per row, adaptive's ratios to generate(), the best assisted row and the best chain."""
    rates = {name: _rate(recs) for name, recs in records.items()}
    assisted = max((n for n in rates if n.startswith("hf_assisted")), key=rates.get)
    chain = max((n for n in rates if n.startswith("chain")), key=rates.get)
    identical = {n: all(r["tokens"] == v["tokens"] for r, v in zip(recs, records["vanilla"]))
                 for n, recs in records.items()}
    ratios = {f"adaptive/{other}": {"total": rates["adaptive"] / rates[other],
                                    "median": _median_ratio(records["adaptive"], records[other])}
              for other in ("hf_generate", assisted, chain)}
    return {"prompts": len(records["vanilla"]), "tokens_per_s": rates, "best_assisted": assisted,
            "best_chain": chain, "ratios": ratios, "identical": identical, "all_identical": all(identical.values())}


def demo_check(args) -> int:
    new, ref = (json.loads(Path(p).read_text()) for p in (args.summary, args.reference))
    ref_rows = {(r["method"], r["task"]): r for r in ref["rows"] if r["task"] in DEMO_TASKS}
    failed = 0
    for row in (r for r in new["rows"] if r["task"] in DEMO_TASKS):
        old = ref_rows.get((row["method"], row["task"]))
        if old is None:
            print(f"note: {row['method']} on {row['task']} has no reference row")
            continue
        low = old["e2e_speedup_ci"][0]
        slower = row["e2e_speedup"] < low
        failed += slower
        print(f"{'SLOWER' if slower else 'ok':6} {row['method']:8} {row['task']:16} e2e {row['e2e_speedup']:.3f}x "
              f"(reference {old['e2e_speedup']:.3f}x, interval from {low:.3f})")
    return 1 if failed else 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    b = sub.add_parser("bench")
    b.add_argument("--pair", default=str(Path.home() / ".cache" / "lvspec-realpair"))
    b.add_argument("--prompts", default="heldout",
                   help="heldout (never tuned on; the headline), builtin (tuned on) or a prompt file")
    b.add_argument("--per-kind", type=int, default=2,
                   help="held-out prompts per kind (code, prose, qa); another set: 3 times as many of its first")
    b.add_argument("--start", type=int, default=0,
                   help="skip the first START prompts of each kind (a fresh slice of the set: prompts a "
                        "change was diagnosed on are not the ones its figure is reported on)")
    b.add_argument("--depths", default="2,3,4,6,8", help="chain depths, comma-separated")
    b.add_argument("--draft-dtype", default="int8")
    b.add_argument("--max-new-tokens", type=int, default=96)
    b.add_argument("--threads", type=int, default=2)
    b.add_argument("--out", default=".cache/bench-policy-heldout")
    d = sub.add_parser("demo-check")
    d.add_argument("summary")
    d.add_argument("--reference", default="results/demo/summary.json")
    b.add_argument("--target", default=None, help="default: <pair>/target")
    b.add_argument("--draft", default=None, help="default: <pair>/draft")
    args = p.parse_args(argv)
    if args.command == "bench":
        args.target, args.draft = args.target or f"{args.pair}/target", args.draft or f"{args.pair}/draft"
    return bench_main(args) if args.command == "bench" else demo_check(args)


if __name__ == "__main__":
    sys.exit(main())
