"""Which attention heads of a demo target point at the object its caption is naming, and how
sharply, at one video length: for three-object held-out scenes, the mean attention mass each
(layer, head) pays, from the caption positions of each object's sentence (`train.SlotAttention`'s
rows), to that object's visual tokens and to the other objects' tokens.

    python scripts/research/pointer_heads.py lvspec_eval/demo/checkpoints/target 512 4

(model folder, frames, scenes). Teacher-forced on the reference caption, eager attention.
"""
import sys

import numpy as np
import torch
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from lvspec_eval.demo import data, models, world
from lvspec_eval.training import demo as train


def main() -> None:
    path, frames, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(2)
    tok = AutoTokenizer.from_pretrained(path)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(path, dtype=torch.float32, attn_implementation="eager").eval()
    slot = train.SlotAttention(train.word_ids(tok)[1], tok(".").input_ids[0])
    vid = model.config.video_token_id
    layers, heads = model.config.text_config.num_hidden_layers, model.config.text_config.num_attention_heads
    named, others, count = np.zeros((layers, heads)), np.zeros((layers, heads)), 0
    for seed in range(data.HELDOUT_SEED + 7000, data.HELDOUT_SEED + 7200):
        scene = world.make_scene(seed)
        if len(scene.objects) < 3:
            continue
        sample = data.make_sample(tok, vid, seed, num_frames=frames, mix=data.TaskMix(caption=1.0))
        owners = train.coverage_owners(scene, frames, models.FRAME_SIZE)
        rows, targets = slot.targets(sample, owners, vid)
        batch = data.collate([sample], model.config.pad_token_id)
        with torch.no_grad():
            embeds, pos, _ = train._embed_inputs(model, batch)
            att = model(inputs_embeds=embeds, position_ids=pos, attention_mask=batch["attention_mask"],
                        output_attentions=True).attentions
        ids = torch.tensor(sample.input_ids)
        any_object = torch.zeros(len(ids), dtype=torch.bool)
        any_object[(ids == vid).nonzero().squeeze(1)[owners > 0]] = True
        for layer, a in enumerate(att):
            a = a[0][:, rows]  # [heads, rows, keys]
            named[layer] += (a * targets).sum(-1).mean(-1).numpy()
            others[layer] += (a * (any_object & ~targets)).sum(-1).mean(-1).numpy()
        count += 1
        if count == n:
            break
    np.set_printoptions(precision=3, suppress=True)
    print(f"{path}: {frames} frames, {count} three-object scenes")
    print("attention mass on the named object's tokens (layer x head)\n", named / count)
    print("on the other objects' tokens\n", others / count)


if __name__ == "__main__":
    main()
