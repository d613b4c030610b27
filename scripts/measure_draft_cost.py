"""Draft-step cost of several drafters at several video lengths, with the work per step held fixed.

Each drafter runs in the shadow of vanilla decoding: every step it feeds the one token committed
since its last proposal and grows a full tree of a fixed shape (timed), but the loop is given an
empty draft, so every drafter and video length does exactly the same work per step (one new token,
the same tree, a cache growing by one per step) whatever its acceptance. The methods alternate
sample by sample in one process (timings on shared machines drift). Reported per method and length:
median draft step (ms), per draft forward (step / depth: one refeed plus depth - 1 tree levels), the
draft's committed KV length after its prefill, and each method's step over the first method's.

usage: python scripts/measure_draft_cost.py [--frames 256,512] [--methods sd_tree,specvlm]
       [--samples 2] [--new-tokens 32] [--options tree=dynamic] [--threads 1] [--out FILE.json]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from lvspec_eval.backends.loading import load_backend
from lvspec_eval.bench import _parse_kv, make_samples
from lvspec_eval.decoding import loop, methods
from lvspec_eval.decoding.types import Draft


class Shadow:
    """Times the drafter's proposals and hands the loop an empty draft (vanilla decoding)."""

    def __init__(self, drafter):
        self.drafter, self.times = drafter, []

    def __getattr__(self, name):
        return getattr(self.drafter, name)

    def propose(self, generated: list[int]) -> Draft:
        t = time.perf_counter()
        self.drafter.propose(generated)
        self.times.append(time.perf_counter() - t)
        return Draft.empty()

    def observe(self, verdict, scores, step=None) -> None:
        pass  # a fixed tree has no policy to inform; the shadowed steps are vanilla's anyway


def _drafter(name: str, options_text: str, draft, target):
    spec = methods.resolve(name)
    options = methods.make_options(spec, _parse_kv(options_text))
    if options.tree == "adaptive":
        raise ValueError("tree=adaptive decides per step from measured costs, which a shadowed drafter "
                         "never sees: pass a fixed shape, e.g. --options tree=dynamic (or static, chain)")
    drafter, verifier = methods.build(spec, options, draft, target)
    return Shadow(drafter), verifier, options.tree_config().depth


def _one_length(args, names: list[str], frames: int, target, draft) -> dict:
    """{method: figures} at one video length; the methods alternate sample by sample."""
    steps, info = {m: [] for m in names}, {}
    for i, sample in enumerate(make_samples("synthvid_caption", args.samples, frames)):
        for name in names[i % len(names):] + names[: i % len(names)]:
            shadow, verifier, depth = _drafter(name, args.options, draft, target)
            res = loop.generate(target, shadow, verifier, sample["prompt"],
                                [(sample["video"].frames, sample["video"].fps)], args.new_tokens)
            steps[name] += [1000 * t for t in shadow.times[1:]]  # the first proposal allocates
            state = shadow.drafter.state  # its committed entries, less the generated tokens it was fed
            info[name] = {"visual_tokens": res.stats.visual_tokens, "kept_visual_tokens": res.stats.kept_visual_tokens,
                          "draft_kv_after_prefill": state.cache_len - shadow.drafter.num_fed, "depth": depth}
    first = statistics.median(steps[names[0]])
    rows = {}
    for name in names:
        step = statistics.median(steps[name])
        rows[name] = {**info[name], "steps": len(steps[name]), "draft_step_ms": round(step, 3),
                      "per_forward_ms": round(step / info[name]["depth"], 3),
                      f"ratio_to_{names[0]}": round(step / first, 3)}
    return rows


def measure(args) -> dict:
    torch.set_num_threads(args.threads)
    target, draft = load_backend(args.model), load_backend(args.draft)
    names = args.methods.split(",")
    out = {"options": args.options, "new_tokens": args.new_tokens, "samples": args.samples, "threads": args.threads,
           "lengths": {}}
    for frames in (int(f) for f in args.frames.split(",")):
        out["lengths"][frames] = _one_length(args, names, frames, target, draft)
        for name, row in out["lengths"][frames].items():
            print(frames, name, json.dumps(row), flush=True)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="demo")
    p.add_argument("--draft", default="demo-draft")
    p.add_argument("--methods", default="sd_tree,specvlm")
    p.add_argument("--frames", default="256,512", help="video lengths (8 visual tokens per frame in the demo)")
    p.add_argument("--samples", type=int, default=2)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--options", default="tree=dynamic", help="a fixed tree shape, as model_args")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    result = measure(args)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
