"""Top-1 agreement of a demo draft with the demo target on caption answers (teacher-forced on the
reference caption), on whole videos and on the video tokens SpecVLM's pruning keeps (10%, the
engine's selection: `train.pruned_keep`), at several video lengths, on held-out scenes.

    python scripts/draft_agreement.py lvspec_eval/demo/checkpoints/target lvspec_eval/demo/checkpoints/draft \\
        results/training/draft_agreement.json

What a pruned drafter (SpecVLM, FLy, LVSpec) can hope for at each length is bounded by the pruned
column; the whole-video column is SD-Tree's.
"""
import argparse
import json
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from lvspec_eval.demo import data
from lvspec_eval.training import demo as train

SEED0 = data.HELDOUT_SEED + 500


@torch.no_grad()
def agreement(target, draft, tok, frames: int, scenes: int, seed0: int) -> dict:
    vid = target.config.video_token_id
    counts = {"whole": [0, 0], "pruned": [0, 0]}
    for k in range(scenes):
        smp = data.make_sample(tok, vid, seed0 + k, num_frames=frames, mix=data.TaskMix(caption=1.0))
        batch = data.collate([smp], tok.pad_token_id)
        answer = batch["labels"] != -100
        t_emb, t_pos, _ = train._embed_inputs(target, batch)
        t_logits = target(inputs_embeds=t_emb, position_ids=t_pos).logits
        d_emb, d_pos, _ = train._embed_inputs(draft, batch)
        ids = batch["input_ids"][0]
        pruned = train.pruned_keep(target, t_emb, t_pos, ids, smp.num_prompt, vid)
        for name, kept in (("whole", torch.ones_like(pruned)), ("pruned", pruned)):
            d_logits = draft(inputs_embeds=d_emb[:, kept], position_ids=d_pos[..., kept]).logits
            t_lp, d_lp = train._distil_loss(t_logits, d_logits, answer, answer[:, kept], 1.0)
            counts[name][0] += int((t_lp.argmax(-1) == d_lp.argmax(-1)).sum())
            counts[name][1] += t_lp.shape[0]
    return {name: round(right / total, 4) for name, (right, total) in counts.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("target")
    p.add_argument("draft")
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--frames", default="8,32,128,512")
    p.add_argument("--scenes", type=int, default=8, help="held-out scenes per length")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.target)
    target = Qwen2_5_VLForConditionalGeneration.from_pretrained(args.target, dtype=torch.float32).eval()
    draft = Qwen2_5_VLForConditionalGeneration.from_pretrained(args.draft, dtype=torch.float32).eval()
    result = {"target": args.target, "draft": args.draft, "seed0": SEED0, "scenes": args.scenes,
              "top1_agreement": {}}
    for frames in map(int, args.frames.split(",")):
        result["top1_agreement"][f"{frames}_frames"] = agreement(target, draft, tok, frames, args.scenes, SEED0)
        print(frames, result["top1_agreement"][f"{frames}_frames"], flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
