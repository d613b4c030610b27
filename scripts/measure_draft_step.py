"""Draft-step cost vs number of visual tokens with the work per step held fixed.

The drafter runs in the shadow of vanilla decoding: every step it feeds the one token committed
since its last proposal and grows its full tree (timed), but the loop is given an empty draft, so
every video length sees exactly the same per-step work (1 new token, same tree shape, cache growing
by one per step). Interleaved repetitions; medians of per-step times.
usage: measure_step2.py frames1,frames2,... reps new_tokens method [key=value options]"""
import sys, time, json, statistics, torch
torch.set_num_threads(1)
from lvspec_eval.backends.loading import load_backend
from lvspec_eval.decoding import loop, methods
from lvspec_eval.decoding.types import Draft
from lvspec_eval.demo import data, models, world
frames_list = [int(x) for x in sys.argv[1].split(",")]; reps, new_tokens, method = int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
opts = dict(a.split("=", 1) for a in sys.argv[5:])
be = load_backend("demo"); draft_be = load_backend("demo-draft") if method in ("sd_tree", "specvlm") else None
spec = methods.resolve(method)

class Shadow:
    def __init__(self, inner): self.inner, self.times, self.micro = inner, [], []
    def __getattr__(self, k): return getattr(self.inner, k)
    def propose(self, generated):
        t = time.perf_counter(); self.inner.propose(generated); self.times.append(time.perf_counter() - t)
        if len(generated) == MICRO_AT and method == "sparrow":  # same state, same work: the proposal repeated (nothing new to feed)
            for _ in range(MICRO_N):
                t = time.perf_counter(); self.inner.propose(generated); self.micro.append(time.perf_counter() - t)
        return Draft.empty()
    def observe(self, verdict, scores, step=None): self.inner.observe(verdict, scores, step)

MICRO_AT, MICRO_N = 24, 30
micro = {f: [] for f in frames_list}
scene = world.make_scene(data.TEST_SEED + 20_000)
videos = {f: world.render(scene, f, 112, 112) for f in frames_list}
steps = {f: [] for f in frames_list}; info = {}
for r in range(reps):
    for f in frames_list:
        drafter, verifier = methods.build(spec, methods.make_options(spec, opts), draft_be, be)
        sh = Shadow(drafter)
        out = loop.generate(be, sh, verifier, world.CAPTION_PROMPT, [(videos[f], models.FPS)], new_tokens)
        steps[f] += [1000 * t for t in sh.times[1:]]
        micro[f] += [1000 * t for t in sh.micro]  # the first proposal includes one-off allocation
        info[f] = dict(visual_tokens=out.stats.visual_tokens, n_new=len(out.tokens),
                       draft_cache=getattr(drafter, "cache_len", None) or getattr(getattr(drafter, "state", None), "cache_len", None))
        print(r, f, info[f], round(statistics.median(steps[f]), 3), flush=True)
base = frames_list[0]
for f in frames_list:
    print(json.dumps(dict(method=method, frames=f, **info[f], median_draft_step_ms=round(statistics.median(steps[f]), 3),
          n_steps=len(steps[f]), ratio_to_first=round(statistics.median(steps[f]) / statistics.median(steps[base]), 3),
          micro_median_ms=round(statistics.median(micro[f] or [0]), 3), micro_n=len(micro[f]),
          micro_ratio_to_first=round(statistics.median(micro[f] or [0]) / statistics.median(micro[base] or [1]), 3))))
