"""Experiment: continue the shipped target (step 2800 state) with per-sample loss normalisation and
visual words weighed x4, constant lr, to see whether the LM learns to read shape quickly."""
import json, re, sys, time, math
import numpy as np, torch, torch.nn.functional as F
torch.set_num_threads(2)
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration
from lvspec_eval.demo import data, models, world
from lvspec_eval.training import demo as train
STEPS = int(sys.argv[1]); LR = float(sys.argv[2])
tok = AutoTokenizer.from_pretrained("lvspec_eval/demo/checkpoints/tokenizer")
model = Qwen2_5_VLForConditionalGeneration(models.target_config(tok)).float()
aux = train.AuxHead(256)
st = torch.load(".cache/demo_build/target.ckpt", weights_only=False)
model.load_state_dict(st["model"]); aux.load_state_dict(st["aux"])
VIS = set(world.SHAPES) | set(world.COLOURS) | set(world.SIZES) | set(world.BACKGROUNDS) | set(world.COUNT_WORDS) | set(world._MOTION_WORDS)
def weights_for(answer):
    enc = tok(answer, return_offsets_mapping=True)
    spans = [(m.start(), m.end()) for m in re.finditer(r"[a-z]+", answer.lower()) if m.group() in VIS]
    return [4.0 if any(a < e and s < b for s, e in spans) else 1.0 for a, b in enc["offset_mapping"]] + [1.0]
params = list(model.parameters()) + list(aux.parameters())
opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.01, betas=(0.9, 0.98))
rng = np.random.default_rng(123)
model.train(); t0 = time.time()
for step in range(STEPS):
    seeds = range(9_000_000 + step * 16, 9_000_000 + (step + 1) * 16)
    samples = [data.make_sample(tok, model.config.video_token_id, s, rng=rng, noise=4.0) for s in seeds]
    batch = data.collate(samples, tok.pad_token_id)
    w = torch.zeros_like(batch["labels"], dtype=torch.float)
    for b, s in enumerate(samples):
        ans = tok.decode(s.input_ids[s.num_prompt:-1])
        ww = weights_for(ans)
        if len(ww) == len(s.input_ids) - s.num_prompt:
            w[b, s.num_prompt:len(s.input_ids)] = torch.tensor(ww)
        else:
            w[b, s.num_prompt:len(s.input_ids)] = 1.0
    labels_aux = torch.cat([train.aux_labels(s.scene, models.FRAMES, models.FRAME_SIZE) for s in samples])
    embeds, pos, feats = train._embed_inputs(model, batch)
    logits = model(inputs_embeds=embeds, position_ids=pos, attention_mask=batch["attention_mask"]).logits
    labels = batch["labels"]
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100, reduction="none").view(labels.shape[0], -1)
    ww = w[:, 1:] * (labels[:, 1:] != -100)
    lm = ((ce * ww).sum(1) / ww.sum(1).clamp_min(1e-6)).mean()
    loss = lm + aux.loss(feats, labels_aux)
    opt.zero_grad(set_to_none=True); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
    if step % 25 == 0:
        print(json.dumps({"step": step, "lm": lm.item(), "s": time.time() - t0}), flush=True)
model.eval(); model.save_pretrained("/tmp/ft/model")
print("saved", time.time() - t0, flush=True)
