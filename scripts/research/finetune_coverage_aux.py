"""Continue the shipped target: aux labels on every token an object covers >= COV of (averaged over
the temporal patch's two frames), plus each labelled token's shape word through norm+lm_head."""
import json, sys, time, math
import numpy as np, torch, torch.nn.functional as F
torch.set_num_threads(2)
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration
from lvspec_eval.demo import data, models, world
from lvspec_eval.training import demo as train
STEPS = int(sys.argv[1]); LR = float(sys.argv[2]); COV = float(sys.argv[3]); OUT = sys.argv[4]
VOCAB_W = float(sys.argv[5]) if len(sys.argv) > 5 else 1.0
tok = AutoTokenizer.from_pretrained("lvspec_eval/demo/checkpoints/tokenizer")
model = Qwen2_5_VLForConditionalGeneration(models.target_config(tok)).float()
aux = train.AuxHead(256)
st = torch.load(".cache/demo_build/target.ckpt", weights_only=False)
model.load_state_dict(st["model"]); aux.load_state_dict(st["aux"])
shape_ids = torch.tensor([tok(" " + s).input_ids[0] for s in world.SHAPES])
names = {"colour": list(world.COLOURS), "shape": list(world.SHAPES), "size": list(world.SIZES), "motion": list(world.MOTIONS)}
S = models.FRAME_SIZE; G = S // 28
ys, xs = np.mgrid[0:S, 0:S].astype(np.float32)
def cov_labels(scene, nf=models.FRAMES):
    gt = math.ceil(nf / 2)
    out = torch.zeros(gt, G, G, 4, dtype=torch.long); best = np.zeros((gt, G, G))
    for t in range(gt):
        for obj in scene.objects:
            cov = np.zeros((G, G))
            for f in (2 * t, min(2 * t + 1, nf - 1)):
                tf = f / (nf - 1)
                if tf + 1e-9 < obj.appear: continue
                cx, cy = obj.position(tf)
                m = world._shape_mask(obj.shape, xs - cx * S, ys - cy * S, world.SIZES[obj.size] * S / 2)
                cov += m.reshape(G, 28, G, 28).mean((1, 3)) / 2
            sel = (cov >= COV) & (cov > best[t])
            best[t][sel] = cov[sel]
            out[t][torch.from_numpy(sel)] = torch.tensor([names[k].index(getattr(obj, k)) + 1 for k in names])
    return out.reshape(-1, 4)
params = list(model.parameters()) + list(aux.parameters())
opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.01, betas=(0.9, 0.98))
rng = np.random.default_rng(321)
model.train(); t0 = time.time()
for step in range(STEPS):
    for g in opt.param_groups: g["lr"] = LR * min(1.0, (step + 1) / 50) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / STEPS)))
    seeds = range(9_500_000 + step * 16, 9_500_000 + (step + 1) * 16)
    samples = [data.make_sample(tok, model.config.video_token_id, s, rng=rng, noise=4.0) for s in seeds]
    batch = data.collate(samples, tok.pad_token_id)
    labels_aux = torch.cat([cov_labels(s.scene) for s in samples])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeds, pos, feats = train._embed_inputs(model, batch)
        out = model(inputs_embeds=embeds, position_ids=pos, attention_mask=batch["attention_mask"], labels=batch["labels"])
    feats = feats.float()
    sel = labels_aux[:, 1] > 0
    word_logits = model.lm_head(model.model.language_model.norm(feats[sel]))[:, shape_ids]
    vocab_aux = F.cross_entropy(word_logits, labels_aux[sel, 1] - 1)
    aux_l = aux.loss(feats, labels_aux)
    loss = out.loss + aux_l + VOCAB_W * vocab_aux
    opt.zero_grad(set_to_none=True); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
    if step % 25 == 0:
        print(json.dumps({"step": step, "lm": round(out.loss.item(), 4), "aux": round(aux_l.item(), 4), "vocab_aux": round(vocab_aux.item(), 4), "s": round(time.time() - t0)}), flush=True)
model.eval(); model.save_pretrained(OUT)
torch.save({"model": model.state_dict(), "aux": aux.state_dict()}, OUT + "/state.pt")
print("saved", time.time() - t0, flush=True)
