"""Where Python's full (generation-2) garbage collections land in a real lmms-eval run of the demo,
and how long each pauses the process: one line per collection (JSONL), tagged with the phase it hit
(a timed arm of a request, a target prefill, or elsewhere), plus a forced collection at the end.

Each collection walks every tracked object of the process (half a million in an lmms-eval run of the
demo), so it stalls whatever runs at that moment; since decoding/runner.paused_gc, none may run
inside a timed arm.

usage: python scripts/measure_gc_pauses.py METHOD TASKS LIMIT OUT_DIR [--threads 2]
  e.g. python scripts/measure_gc_pauses.py specvlm synthvid_caption_f32,synthvid_caption 8 runs/gc
"""
from __future__ import annotations

import argparse
import gc
import json
import time
from pathlib import Path

import torch

from lvspec_eval.backends import base
from lvspec_eval.decoding import loop
from lvspec_eval.measure import demo_run

PHASE = ["elsewhere"]


def tagged(function, tag):
    def wrapper(*args, **kwargs):
        outer, PHASE[0] = PHASE[0], tag if PHASE[0] == "elsewhere" else f"{PHASE[0]} > {tag}"
        try:
            return function(*args, **kwargs)
        finally:
            PHASE[0] = outer
    return wrapper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("method")
    p.add_argument("tasks")
    p.add_argument("limit", type=int)
    p.add_argument("out", type=Path)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    log = (args.out / "gc_pauses.jsonl").open("w")
    started = [0.0]

    def on_gc(phase, info):
        if info["generation"] < 2:
            return
        if phase == "start":
            started[0] = time.perf_counter()
            return
        log.write(json.dumps({"phase": PHASE[0], "pause_s": round(time.perf_counter() - started[0], 3),
                              "objects": len(gc.get_objects())}) + "\n")
        log.flush()

    gc.callbacks.append(on_gc)
    loop.generate = tagged(loop.generate, "timed arm")  # the runner calls it through the module
    base.Backend.prefill = tagged(base.Backend.prefill, "prefill")
    demo_run.run_lmms_eval(args.method, args.out / "run", tuple(args.tasks.split(",")), args.limit,
                           demo_run.timing_args(args.method, True))
    PHASE[0] = "forced at the end"
    gc.collect()
    print((args.out / "gc_pauses.jsonl").read_text(), end="")


if __name__ == "__main__":
    main()
