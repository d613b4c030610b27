"""The two target prefills of each paired request (decoding/runner.py: the method and vanilla beside
it, the order alternating), split into the vision tower and the whole prefill: wall seconds, CPU
seconds of the process and page faults. Shows whether the arm that runs first does more work (run
with --threads 1: CPU seconds then count work, not threads waiting for each other).

usage: python scripts/measure_paired_prefill.py [--method specvlm] [--frames 32] [--requests 8] [--threads 1]
"""
from __future__ import annotations

import argparse
import resource
import time

import torch

from lvspec_eval.decoding.runner import Runner
from lvspec_eval.measure.bench import make_samples


def snapshot() -> tuple[float, float, int]:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return time.perf_counter(), r.ru_utime + r.ru_stime, r.ru_minflt


def spy(target, name: str, label, seen: list) -> None:
    """Record wall, CPU and page faults of every call of target.<name> (on this backend only)."""
    original = getattr(type(target), name)

    def wrapper(self, *args, **kwargs):
        if self is not target:
            return original(self, *args, **kwargs)
        before = snapshot()
        out = original(self, *args, **kwargs)
        after = snapshot()
        seen.append((label(kwargs), after[0] - before[0], after[1] - before[1], after[2] - before[2]))
        return out

    setattr(type(target), name, wrapper)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--method", default="specvlm")
    p.add_argument("--frames", type=int, default=32)
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    runner = Runner("demo", method=args.method, draft="demo-draft", paired_timing=True)
    seen: list = []
    spy(runner.target, "input_embeds", lambda kw: "vision", seen)
    captures = lambda kw: "prefill (capture)" if kw.get("visual_attention") or kw.get("hidden_layers") else "prefill"
    spy(runner.target, "prefill", captures, seen)
    print("| request | first arm | call | wall s | CPU s | page faults |\n|---|---|---|---|---|---|")
    for i, sample in enumerate(make_samples("synthvid_caption", args.requests, frames=args.frames)):
        seen.clear()
        runner.generate(sample["prompt"], [sample["video"]], 64)
        first = "vanilla" if i % 2 else "method"
        for label, wall, cpu, faults in seen:
            print(f"| {i} | {first} | {label} | {wall:.3f} | {cpu:.3f} | {faults} |")


if __name__ == "__main__":
    main()
