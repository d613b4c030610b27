"""A demo model's greedy captions of the documented held-out scenes at one length, each beside the
scene's objects (colour, shape, motion, appearance time) and its oracle score, to see what kind of
error a length fails by (merged objects, swapped order of appearance, a wrong attribute).

    python scripts/research/caption_failures.py MODEL_DIR FRAMES [SCENES] [THREADS]

e.g. `... lvspec_eval/demo/checkpoints/target 128 12 2` (the 12 scenes of
scripts/eval_demo_lengths.py at 1,024 visual tokens).
"""
import sys

import torch
from transformers import AutoTokenizer, Qwen2_5_VLForConditionalGeneration

from judges.oracle import score_caption
from lvspec_eval.demo import data, models, world
from lvspec_eval.training import demo as train

SEED0 = data.HELDOUT_SEED + 3000  # scripts/eval_demo_lengths.py's documented set


def main() -> None:
    model_dir, frames = sys.argv[1], int(sys.argv[2])
    scenes = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    torch.set_num_threads(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    for k in range(scenes):
        scene = world.make_scene(SEED0 + k)
        pixels = data.preprocess_video(world.render(scene, frames, models.FRAME_SIZE, models.FRAME_SIZE),
                                       models.FPS, models.DEMO_PREPROCESS)
        with torch.no_grad():
            text = train._greedy_answer(model, tok, pixels, world.CAPTION_PROMPT)
        s = score_caption(text, scene)
        print(k, len(scene.objects), [(o.colour, o.shape, o.motion, o.appear) for o in scene.objects], flush=True)
        print("   ", round(s["f1"], 2), s["visual_correct"], s["visual_stated"], "|", text, flush=True)


if __name__ == "__main__":
    main()
