import itertools, json, sys, torch, collections
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration
from lvspec_eval.demo import world, data, models
from judges.oracle import score_caption
torch.set_num_threads(2)
d = "lvspec_eval/demo/checkpoints"
tok = AutoTokenizer.from_pretrained(d + "/tokenizer")
m = Qwen2_5_VLForConditionalGeneration.from_pretrained(sys.argv[1] if len(sys.argv)>1 else d + "/target").float().eval()
vid = m.config.video_token_id
N = int(sys.argv[2]) if len(sys.argv) > 2 else 60
stats = collections.Counter()
perm_better = 0
per = collections.defaultdict(lambda: [0,0])
mc = collections.defaultdict(lambda: [0,0])
for k in range(N):
    scene = world.make_scene(data.HELDOUT_SEED + 500 + k)
    px = data.preprocess_video(world.render(scene, models.FRAMES, models.FRAME_SIZE, models.FRAME_SIZE), models.FPS, models.DEMO_PREPROCESS)
    qs = world.make_questions(scene)
    prompts = [(world.CAPTION_PROMPT, None)] + [(world.format_mcq(q), q) for q in qs]
    for prompt, q in prompts:
        ids = data.expand_video_tokens(tok(data.chat_prompt(tok, prompt)).input_ids, vid, px.num_visual_tokens)
        ii = torch.tensor([ids])
        with torch.no_grad():
            out = m.generate(input_ids=ii, attention_mask=torch.ones_like(ii), pixel_values_videos=px.pixel_values, video_grid_thw=px.grid_thw,
                second_per_grid_ts=torch.tensor([px.second_per_grid]), mm_token_type_ids=(ii==vid).int()*2, max_new_tokens=64 if q is None else 2,
                do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
        text = tok.decode(out[0, len(ids):], skip_special_tokens=True).strip()
        if q is None:
            f = world.caption_facts(text)
            n = len(scene.objects)
            for i, mention in enumerate(f.objects):
                obj = scene.objects[i] if i < n else None
                for a in ("colour","shape","motion","size"):
                    if mention[a] is None: continue
                    per[(a, i, n)][1] += 1
                    per[(a, i, n)][0] += obj is not None and getattr(obj, a) == mention[a]
            # best permutation
            s = score_caption(text, scene)
            best = s["visual_correct"]
            if n > 1 and len(f.objects) == n:
                for p in itertools.permutations(range(n)):
                    sc = world.Scene(scene.seed, scene.background, tuple(scene.objects[j] for j in p))
                    best = max(best, score_caption(text, sc)["visual_correct"])
            stats["stated"] += s["visual_stated"]; stats["correct"] += s["visual_correct"]; stats["best_perm"] += best
            stats["count_ok"] += len(f.objects) == n
            stats["captions"] += 1
        else:
            mc[q["kind"]][1] += 1; mc[q["kind"]][0] += text[:1] == q["answer"]
print(dict(stats), "fact acc", stats["correct"]/stats["stated"], "perm-best", stats["best_perm"]/stats["stated"])
for key in sorted(per): print(key, per[key], round(per[key][0]/per[key][1],2))
tot = [sum(v[0] for v in mc.values()), sum(v[1] for v in mc.values())]
print("mc", {k: (v, round(v[0]/v[1],2)) for k, v in mc.items()}, tot[0]/tot[1])
