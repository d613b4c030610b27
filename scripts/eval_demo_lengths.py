"""Caption F1, visual-fact accuracy and MC accuracy of a demo model at every length of the demo's
speedup curve (64 / 256 / 1,024 / 2,048 / 4,096 visual tokens = 8 / 32 / 128 / 256 / 512 frames),
on held-out scenes (the same scenes at every length), greedy, through transformers' generate.

    python scripts/eval_demo_lengths.py lvspec_eval/demo/checkpoints/target results/training/lengths_eval.json

MC accuracy is measured at the trained length (8 frames) only, one question per scene.
"""
import argparse
import json
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from lvspec_eval.demo import data
from lvspec_eval.training import demo as train

SEED0 = data.HELDOUT_SEED + 3000  # apart from the scenes evaluated during training (+0..23)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model", help="a demo model folder (target or draft)")
    p.add_argument("out", help="JSON file to write")
    p.add_argument("--scenes", type=int, default=12, help="held-out scenes per length")
    p.add_argument("--mc-scenes", type=int, default=60, help="scenes (captions + one MC question each) at 8 frames")
    p.add_argument("--frames", default="8,32,128,256,512")
    p.add_argument("--seed0", type=int, default=SEED0, help="the first held-out scene's seed (default: the "
                   "documented set; another value gives another set of scenes)")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    tok = AutoTokenizer.from_pretrained(args.model)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(args.model, dtype=torch.float32).eval()
    lengths = {int(f): (args.mc_scenes if int(f) == 8 else args.scenes) for f in args.frames.split(",")}
    t0 = time.time()
    result = {"model": args.model, "seed0": args.seed0, "lengths": train.evaluate_lengths(model, tok, lengths, args.seed0),
              "wall_s": round(time.time() - t0, 1), "threads": args.threads}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for key, r in result["lengths"].items():
        print(key, json.dumps(r))


if __name__ == "__main__":
    main()
