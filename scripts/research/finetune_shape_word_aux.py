"""Experiment B: continue the shipped target with an extra loss that makes each object-centre visual
token predict its shape WORD through the LM's own head (norm + lm_head), so the language model can
copy it; the original token-mean LM loss otherwise."""
import json, sys, time
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
shape_ids = torch.tensor([tok(" " + s).input_ids[0] for s in world.SHAPES])
params = list(model.parameters()) + list(aux.parameters())
opt = torch.optim.AdamW(params, lr=LR, weight_decay=0.01, betas=(0.9, 0.98))
rng = np.random.default_rng(321)
model.train(); t0 = time.time()
for step in range(STEPS):
    seeds = range(9_500_000 + step * 16, 9_500_000 + (step + 1) * 16)
    samples = [data.make_sample(tok, model.config.video_token_id, s, rng=rng, noise=4.0) for s in seeds]
    batch = data.collate(samples, tok.pad_token_id)
    labels_aux = torch.cat([train.aux_labels(s.scene, models.FRAMES, models.FRAME_SIZE) for s in samples])
    embeds, pos, feats = train._embed_inputs(model, batch)
    out = model(inputs_embeds=embeds, position_ids=pos, attention_mask=batch["attention_mask"], labels=batch["labels"])
    sel = labels_aux[:, 1] > 0
    word_logits = model.lm_head(model.model.language_model.norm(feats[sel]))[:, shape_ids]
    vocab_aux = F.cross_entropy(word_logits, labels_aux[sel, 1] - 1)
    loss = out.loss + aux.loss(feats, labels_aux) + vocab_aux
    opt.zero_grad(set_to_none=True); loss.backward(); torch.nn.utils.clip_grad_norm_(params, 1.0); opt.step()
    if step % 25 == 0:
        print(json.dumps({"step": step, "lm": out.loss.item(), "vocab_aux": vocab_aux.item(), "s": time.time() - t0}), flush=True)
model.eval(); model.save_pretrained("/tmp/ft/model2")
print("saved", time.time() - t0, flush=True)
