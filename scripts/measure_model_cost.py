"""Per-token cost of the demo target and the demo draft: one cached decode step each.

Both models prefill the same caption prompt (a trained-length demo video), then take single-token
decode steps (a one-token forward with the KV cache, then the cache commit the loop does),
interleaved target/draft in blocks so that both see the same machine state. Prints the median
step time of each and their ratio, as JSON.

usage: python scripts/measure_model_cost.py [steps=300] [threads=2]
"""
import json
import statistics
import sys
import time

import torch

from lvspec_eval.backends.loading import load_backend
from lvspec_eval.demo import data, models, world


def main(steps: int = 300, threads: int = 2) -> dict:
    torch.set_num_threads(threads)
    scene = world.make_scene(data.TEST_SEED)
    video = [(world.render(scene, models.FRAMES, models.FRAME_SIZE, models.FRAME_SIZE), models.FPS)]
    runs = {}
    for name in ("demo", "demo-draft"):
        be = load_backend(name)
        state, logits = be.prefill(be.prepare(world.CAPTION_PROMPT, video))
        runs[name] = (be, state, int(logits.argmax()))
    times = {name: [] for name in runs}
    one = torch.ones(1, 1, dtype=torch.bool)
    for block in range(steps // 10):
        for name, (be, state, token) in runs.items():
            for _ in range(10):
                t = time.perf_counter()
                logits, _ = be.forward(state, torch.tensor([token]), torch.zeros(1, dtype=torch.long), one)
                be.keep(state, [0])
                times[name].append(time.perf_counter() - t)
                token = int(logits[0].argmax())
            runs[name] = (be, state, token)
    med = {name: 1000 * statistics.median(t[10:]) for name, t in times.items()}  # first block: warm-up
    out = {"threads": threads, "steps": len(times["demo"]) - 10, "target_step_ms": round(med["demo"], 3),
           "draft_step_ms": round(med["demo-draft"], 3), "ratio": round(med["demo"] / med["demo-draft"], 2),
           "context_tokens": runs["demo"][1].cache_len}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
