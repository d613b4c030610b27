"""Draft-step cost of several drafters at several video lengths, paired step by step.

The drafters run side by side in the shadow of one vanilla decode: at every step each of them feeds
the one token committed since its last proposal and grows a tree of the same fixed shape (timed,
the order rotating step by step), and the loop is given an empty draft. So every drafter does the
same work on the same tokens at the same moment, whatever its acceptance, and machine drift hits
them alike (a per-sample alternation left +-20% of noise on a loaded 2-core machine). Reported per
method and length: median draft step (ms), per draft forward (step / depth: one refeed plus
depth - 1 tree levels), the draft's committed KV length after its prefill (read from its cache), and
the median over steps of each method's step over the first method's step.

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
from lvspec_eval.measure.bench import _parse_kv, make_samples
from lvspec_eval.decoding import loop, methods
from lvspec_eval.decoding.types import Draft


class Shadows:
    """Several drafters behind one: each proposes every step (timed), the loop gets an empty draft."""

    def __init__(self, drafters: dict):
        self.drafters = drafters
        self.times: dict[str, list[float]] = {name: [] for name in drafters}
        self.needs_visual_attention = any(d.needs_visual_attention for d in drafters.values())
        self.hidden_layers = tuple(sorted({layer for d in drafters.values() for layer in d.hidden_layers}))
        self.prefill_layers = tuple(sorted({layer for d in drafters.values() for layer in d.prefill_layers}))
        self.name = "shadows"

    def start(self, target, inputs, target_state, clock) -> dict:
        for drafter in self.drafters.values():
            drafter.start(target, inputs, target_state, clock)
        return {}

    def propose(self, generated: list[int]) -> Draft:
        names = list(self.drafters)
        k = len(generated) % len(names)
        for name in names[k:] + names[:k]:
            t = time.perf_counter()
            self.drafters[name].propose(generated)
            self.times[name].append(time.perf_counter() - t)
        return Draft.empty()

    def observe(self, verdict, scores, step=None) -> None:
        pass  # fixed trees have no policy to inform

    def estimates(self) -> None:
        return None


def _drafter(name: str, options_text: str, draft, target):
    spec = methods.resolve(name)
    options = methods.make_options(spec, _parse_kv(options_text))
    if options.tree == "adaptive":
        raise ValueError("tree=adaptive decides per step from measured costs, which a shadowed drafter "
                         "never sees: pass a fixed shape, e.g. --options tree=dynamic (or static, chain)")
    return methods.build(spec, options, draft, target)[0], options.tree_config().depth


def _one_length(args, names: list[str], frames: int, target, draft) -> dict:
    """{method: figures} at one video length."""
    steps, info = {m: [] for m in names}, {}
    vanilla = methods.resolve("vanilla")
    verifier = methods.build(vanilla, methods.make_options(vanilla, {}), None, target)[1]
    for sample in make_samples("synthvid_caption", args.samples, frames):
        built = {name: _drafter(name, args.options, draft, target) for name in names}
        shadows = Shadows({name: d for name, (d, _) in built.items()})
        res = loop.generate(target, shadows, verifier, sample["prompt"],
                            [(sample["video"].frames, sample["video"].fps)], args.new_tokens)
        for name, (drafter, depth) in built.items():
            steps[name] += [1000 * t for t in shadows.times[name][1:]]  # the first proposal allocates
            kv = drafter.state.cache_len - drafter.num_fed  # committed entries less the generated tokens fed
            info[name] = {"visual_tokens": res.stats.visual_tokens, "draft_kv_after_prefill": kv, "depth": depth}
    rows = {}
    for name in names:
        step = statistics.median(steps[name])
        paired = statistics.median(a / b for a, b in zip(steps[name], steps[names[0]]))
        rows[name] = {**info[name], "steps": len(steps[name]), "draft_step_ms": round(step, 3),
                      "per_forward_ms": round(step / info[name]["depth"], 3), f"ratio_to_{names[0]}": round(paired, 3)}
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
