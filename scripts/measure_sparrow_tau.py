"""tau of Sparrow vs vanilla on synthvid caption scenes (TEST_SEED + i, 8 frames 112 px, rendered directly).
usage: measure_tau.py N [model_args-style key=value ...]   e.g. sparrow_head=... sparrow_hsr=off tree=chain"""
import sys, json, statistics, torch
torch.set_num_threads(1)
from lvspec_eval.decoding.runner import Runner, VideoInput
from lvspec_eval.demo import data, models, world
n = int(sys.argv[1]); opts = dict(a.split("=", 1) for a in sys.argv[2:])
van = Runner("demo", "vanilla")
sp = Runner("demo", "sparrow", options=opts)
rows = []
for i in range(n):
    frames = world.render(world.make_scene(data.TEST_SEED + i), models.FRAMES, models.FRAME_SIZE, models.FRAME_SIZE)
    v = [VideoInput(frames, models.FPS)]
    a = van.generate(world.CAPTION_PROMPT, v, 96); b = sp.generate(world.CAPTION_PROMPT, v, 96)
    rows.append(dict(same=a.tokens == b.tokens, tau=b.stats["tau"], n=len(b.tokens), steps=b.stats["num_steps"],
                     van_decode=a.stats["decode_s"], sp_decode=b.stats["decode_s"], draft_ms=b.stats["draft_step_ms"]))
    print(i, rows[-1], flush=True)
tau = sum(r["tau"] * r["steps"] for r in rows) / sum(r["steps"] for r in rows)
print(json.dumps(dict(opts=opts, samples=n, identical=sum(r["same"] for r in rows), tau_mean_per_sample=statistics.mean(r["tau"] for r in rows),
      tau_pooled=tau, decode_speedup=sum(r["van_decode"] for r in rows) / sum(r["sp_decode"] for r in rows),
      median_draft_step_ms=statistics.median(r["draft_ms"] for r in rows))))
