"""What the target prefill's captures cost: plain (vanilla), SpecVLM's text queries (visual_attention),
LVSpec's (text queries + the hidden states of lv_layer 2), the hidden states alone.

Counted in CPU seconds of the process (user and system apart) and page faults, not wall clock: on a
shared machine wall clock mostly measures the neighbours, while the work a prefill does is what it
does. Run with --threads 1 so that no OpenMP thread spins while waiting for another (which counts
as CPU time too). The variants alternate, their order reversing every round.

usage: python scripts/measure_prefill_capture.py [--frames 32,512] [--rounds 4] [--threads 1]
"""
from __future__ import annotations

import argparse
import resource
import statistics

import torch

from lvspec_eval.backends.loading import load_backend
from lvspec_eval.measure.bench import make_samples

VARIANTS = {
    "plain": {},
    "specvlm": {"visual_attention": True},
    "lvspec": {"visual_attention": True, "hidden_layers": (2,)},
    "hidden_only": {"hidden_layers": (2,)},
}


def one_prefill(target, sample, capture: dict) -> tuple[float, float, int]:
    """(user s, system s, page faults) of one target prefill of `sample`."""
    inputs = target.prepare(sample["prompt"], [sample["video"].request()])
    before = resource.getrusage(resource.RUSAGE_SELF)
    with torch.no_grad():
        target.prefill(inputs, **capture)
    after = resource.getrusage(resource.RUSAGE_SELF)
    return after.ru_utime - before.ru_utime, after.ru_stime - before.ru_stime, after.ru_minflt - before.ru_minflt


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--frames", default="32,512", help="video lengths (8 frames = 64 visual tokens)")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = load_backend("demo")
    print("| visual tokens | capture | user s (median) | system s (median) | page faults (median) |")
    print("|---|---|---|---|---|")
    for frames in (int(f) for f in args.frames.split(",")):
        sample = make_samples("synthvid_caption", 1, frames=frames)[0]
        one_prefill(target, sample, {})  # the first call of this shape: allocator growth, not counted
        seen: dict[str, list] = {name: [] for name in VARIANTS}
        for r in range(args.rounds):
            for name in list(VARIANTS)[:: 1 if r % 2 == 0 else -1]:
                seen[name].append(one_prefill(target, sample, VARIANTS[name]))
        for name, runs in seen.items():
            user, system, faults = (statistics.median(x) for x in zip(*runs))
            print(f"| {frames * 8} | {name} | {user:.3f} | {system:.3f} | {faults:.0f} |")


if __name__ == "__main__":
    main()
