"""Motion and order MC errors of the shipped target on 60 held-out scenes, each set against what the
target's own caption of the same video says (run from the repository root)."""
import torch, collections
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration
from lvspec_eval.demo import world, data, models
torch.set_num_threads(1)
d = "lvspec_eval/demo/checkpoints"
tok = AutoTokenizer.from_pretrained(d + "/tokenizer")
m = Qwen2_5_VLForConditionalGeneration.from_pretrained(d + "/target").float().eval()
vid = m.config.video_token_id
def gen(prompt, px, n):
    ids = data.expand_video_tokens(tok(data.chat_prompt(tok, prompt)).input_ids, vid, px.num_visual_tokens)
    ii = torch.tensor([ids])
    with torch.no_grad():
        out = m.generate(input_ids=ii, attention_mask=torch.ones_like(ii), pixel_values_videos=px.pixel_values, video_grid_thw=px.grid_thw,
            second_per_grid_ts=torch.tensor([px.second_per_grid]), mm_token_type_ids=(ii==vid).int()*2, max_new_tokens=n,
            do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    return tok.decode(out[0, len(ids):], skip_special_tokens=True).strip()
stats = collections.Counter()
for k in range(60):
    scene = world.make_scene(data.HELDOUT_SEED + 500 + k)
    px = data.preprocess_video(world.render(scene, models.FRAMES, models.FRAME_SIZE, models.FRAME_SIZE), models.FPS, models.DEMO_PREPROCESS)
    facts = None
    for q in world.make_questions(scene):
        if q["kind"] not in ("motion", "order"):
            continue
        ans = gen(world.format_mcq(q), px, 2)[:1]
        ok = ans == q["answer"]
        n = len(scene.objects)
        stats[(q["kind"], n, ok)] += 1
        if not ok:
            if facts is None:
                cap = gen(world.CAPTION_PROMPT, px, 64); facts = world.caption_facts(cap)
            if q["kind"] == "motion":
                idx = next(i for i, o in enumerate(scene.objects) if f"{o.colour} {o.shape}" in q["question"])
                said = facts.objects[idx]["motion"] if idx < len(facts.objects) else None
                stats[("motion_wrong_caption_right", said == scene.objects[idx].motion)] += 1
                print("motion", n, idx, "truth", scene.objects[idx].motion, "mc", q["options"][ord(ans)-65] if ans and ord(ans)-65 < len(q["options"]) else ans, "caption", said)
            else:
                print("order", n, "truth", q["options"][ord(q["answer"])-65], "mc", q["options"][ord(ans)-65] if ans and ord(ans)-65 < len(q["options"]) else ans, "| first in caption:", facts.objects[0] if facts.objects else None)
for key in sorted(stats, key=str): print(key, stats[key])
