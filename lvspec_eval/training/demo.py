"""Training of the demo world's target and draft (`lvspec-eval build-demo`).

Target, trained from scratch on captions and multiple-choice answers of procedurally generated
scenes, in one run (bfloat16 autocast: the CPU's bf16 matrix units make a step about 20% faster).
Besides the language-model loss (a per-sample mean, so that one-letter answers count as much as
25-token captions), four training-only signals, dropped after training, make grounding learnable
in about an hour on two CPU cores, where the language-model loss alone leaves the model ignoring
the video for long:
- an auxiliary head on the vision tower's merged tokens: every token holding at least 30% of an
  object predicts its colour, shape, size and motion, and names its shape through the model's own
  norm and lm_head;
- linear probes on layers 2/4/6 at the text positions that name an object (the positions that
  predict its colour and shape words in a caption, and the answer position of a question about
  it), which must predict that object's attributes. Without them the vision tower encoded shape
  (a linear probe read it 97% of the time) while the language model stated it at chance: nothing
  carried shape into the text positions, so the language-model loss had no gradient to build
  that path (a deadlock, not a capacity limit; results/training/experiments/);
- a probe on layer 4 at the visual positions: which object (first, second, third to appear) the
  token holds. The vision tower attends within one temporal patch, so telling the second object
  from the third is the language model's comparison across patches;
- every tenth step is a batch of 16- or 32-frame videos (same visual-token budget), so the model
  is not fitted to one length only.
The last 400 steps are a question phase with a fresh, smaller learning-rate schedule: three samples
in four are multiple-choice questions, 60% of them about motion or order of appearance: the
questions the model answers worst while its captions state the same facts right
(results/training/experiments/).

Length fine-tune (`finetune_lengths`, a stage of `build-demo` after the target's run): the target
trained at 8 frames never saw temporal positions past 16 grids and fell into repetitions past 256
visual tokens; a short run on videos of 16 to 512 frames (4,096 visual tokens a step, the longest
length raised over the run, one step in four at 8 frames on the question mix) with the
language-model loss and probes at the visual positions (each object token's attributes, motion
included, and order of appearance, which in a long video is only seen across temporal patches).
A second, shorter stage (`POINTER_RECIPE`) supervises the attention of the three heads that point
from each caption sentence at the object it names (`SlotAttention`), with a running count of the
objects (`AppearanceProbe`): at long videos those heads had stopped telling the named object from
the others. Three more such stages (`ORDER_RECIPES`) add a second order-of-appearance probe on the
object tokens (`OrderProbe` at its own weight, without the background tokens), the second and third
with the pointer heads' supervision doubled: after the pointer stage the target still named the
third object where the second belonged.

Draft: a smaller Qwen2.5-VL whose vision blocks start as a frozen copy of the target's, trained
by distillation on the target's next-token distributions over the same kind of data (as EAGLE-
style drafts are), so that it agrees with the target where the target is sure; one step in four
is a video of 16 to 512 frames, so that it does at every length of the demo's curve, and half of
those show it only the video tokens SpecVLM's pruning keeps (`pruned_keep`), so that it also does
where SpecVLM, FLy and LVSpec draft from 10% of the video.

Restyled draft: that draft fine-tuned on references in another phrasing style (the same phrasings,
another favourite per slot; data.RESTYLE_MIX), as a smaller model of the family trained on its own
data would word things: mismatches on wording, which loose verification is for.

Both runs log to `<work>/train_*.log`, checkpoint every few hundred steps and resume from there.
"""
from __future__ import annotations

import contextlib
import json
import math
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import Qwen2_5_VLForConditionalGeneration

from ..demo import data, models, world
from ..demo.tokenizer import save_tokenizer, train_tokenizer
from .common import log_jsonl, save_atomic

AUX_CLASSES = {"colour": len(world.COLOURS) + 1, "shape": len(world.SHAPES) + 1,
               "size": len(world.SIZES) + 1, "motion": len(world.MOTIONS) + 1}
TOKEN_PX = 28  # pixels per merged visual token side (patch 14 x merge 2)


def _attribute_ids(obj: world.SceneObject) -> list[int]:
    """An object's colour, shape, size and motion as class ids in AUX_CLASSES order (0 = no object)."""
    names = {"colour": list(world.COLOURS), "shape": list(world.SHAPES),
             "size": list(world.SIZES), "motion": list(world.MOTIONS)}
    return [names[k].index(getattr(obj, k)) + 1 for k in names]


def weighted_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """The per-token cross-entropy averaged with per-token weights (0 if every weight is 0)."""
    return (F.cross_entropy(logits, labels, reduction="none") * weight).sum() / weight.sum().clamp_min(1e-6)


class AuxHead(torch.nn.Module):
    def __init__(self, hidden: int):
        super().__init__()
        self.proj = torch.nn.Linear(hidden, sum(AUX_CLASSES.values()))

    def loss(self, feats: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        logits = self.proj(feats).split(list(AUX_CLASSES.values()), dim=-1)
        # Empty tokens are easy and many; weigh them down so objects drive the gradient.
        weight = torch.where(labels[:, 0] > 0, 1.0, 0.2)
        losses = [weighted_cross_entropy(lg, labels[:, i], weight) for i, lg in enumerate(logits)]
        return sum(losses) / len(losses)


def coverage_owners(scene: world.Scene, num_frames: int, size_px: int, min_share: float = 0.3) -> torch.Tensor:
    """[num_tokens] which object (k + 1 for scene.objects[k], the k-th to appear; 0 = none) each
    merged token holds: every token with at least `min_share` of an object's pixels (averaged over
    the temporal patch's two frames), and always the one that holds most; the larger share wins."""
    grid_t, grid_s = math.ceil(num_frames / 2), size_px // TOKEN_PX
    out = torch.zeros(grid_t, grid_s, grid_s, dtype=torch.long)
    best = np.zeros((grid_t, grid_s, grid_s))
    ys, xs = np.mgrid[0:size_px, 0:size_px].astype(np.float32)
    for t in range(grid_t):
        frames = sorted({min(2 * t, num_frames - 1), min(2 * t + 1, num_frames - 1)})
        for k, obj in enumerate(scene.objects):
            share = np.zeros((grid_s, grid_s))
            for f in frames:
                time_frac = f / max(1, num_frames - 1)
                if time_frac + 1e-9 < obj.appear:
                    continue
                cx, cy = obj.position(time_frac, num_frames)
                mask = world.shape_mask(obj.shape, xs - cx * size_px, ys - cy * size_px, world.SIZES[obj.size] * size_px / 2)
                pixels = mask[:grid_s * TOKEN_PX, :grid_s * TOKEN_PX].reshape(grid_s, TOKEN_PX, grid_s, TOKEN_PX).sum((1, 3))
                share += pixels / max(1, pixels.sum()) / len(frames)
            if share.max() <= 0:
                continue
            sel = ((share >= min_share) | (share == share.max())) & (share > best[t])
            best[t][sel] = share[sel]
            out[t][torch.from_numpy(sel)] = k + 1
    return out.reshape(-1)


def coverage_labels(owners: torch.Tensor, scene: world.Scene) -> torch.Tensor:
    """[num_tokens, 4] the attribute ids (`_attribute_ids`; 0 = none) of the object each token holds."""
    table = torch.tensor([[0, 0, 0, 0]] + [_attribute_ids(obj) for obj in scene.objects])
    return table[owners]


def _asked_object(q: dict, scene: world.Scene) -> int | None:
    """Index of the object a multiple-choice question is about (the first one for `order`)."""
    if q["kind"] == "order":
        return 0
    words = q["question"].lower().rstrip("?").split()
    for k, ordinal in enumerate(world.ORDINALS):
        if ordinal in words:
            return k
    for k, obj in enumerate(scene.objects):
        if obj.colour in words and obj.shape in words:
            return k
    return None


def text_labels(sample: data.Sample, colour_ids: set[int]) -> torch.Tensor:
    """[len(input_ids), 4] attribute ids (0 = none) for the text positions that name an object.

    Position i's hidden state predicts token i+1. In a caption, the k-th colour word names object
    k (backgrounds have their own colour names): the position before it (predicting the colour)
    and the colour word's own position (predicting the shape) get object k's attributes. In a
    question, the last prompt position (predicting the answer letter) gets the asked object's."""
    out = torch.zeros(len(sample.input_ids), 4, dtype=torch.long)
    objs = sample.scene.objects
    if sample.question is None:
        k = 0
        for i in range(sample.num_prompt, len(sample.input_ids)):
            if sample.input_ids[i] in colour_ids and k < len(objs):
                out[i - 1] = out[i] = torch.tensor(_attribute_ids(objs[k]))
                k += 1
    else:
        k = _asked_object(sample.question, sample.scene)
        if k is not None:
            out[sample.num_prompt - 1] = torch.tensor(_attribute_ids(objs[k]))
    return out


class TextProbes(torch.nn.Module):
    """Linear attribute probes on the language model's hidden states at a few layers (training only)."""

    def __init__(self, hidden: int, layers: tuple[int, ...]):
        super().__init__()
        self.layers = layers
        self.heads = torch.nn.ModuleList([AuxHead(hidden) for _ in layers])

    def loss(self, hidden_states: tuple[torch.Tensor, ...], labels: torch.Tensor) -> torch.Tensor:
        sel = labels[..., 0] > 0
        if not sel.any():
            return hidden_states[0].sum() * 0.0
        return sum(head.loss(hidden_states[layer][sel].float(), labels[sel])
                   for head, layer in zip(self.heads, self.layers)) / len(self.layers)


def per_sample_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy averaged over each sample's answer, then over samples: a one-letter
    multiple-choice answer weighs as much as a 25-token caption (a token mean gives it ~4%)."""
    tokens = F.cross_entropy(logits[:, :-1].transpose(1, 2), labels[:, 1:], ignore_index=-100, reduction="none")
    counts = (labels[:, 1:] != -100).sum(1).clamp(min=1)
    return (tokens.sum(1) / counts).mean()


def _embed_inputs(model, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(inputs_embeds, 3-D position ids, visual features) for a training batch."""
    vid = model.config.video_token_id
    feats = model.model.visual(batch["pixel_values_videos"], grid_thw=batch["video_grid_thw"]).pooler_output
    ids = batch["input_ids"]
    video_mask = ids == vid
    embeds = model.model.get_input_embeddings()(ids).masked_scatter(video_mask[..., None], feats.to(torch.float32))
    pos, _ = model.model.get_rope_index(
        ids, mm_token_type_ids=video_mask.int() * 2, video_grid_thw=batch["video_grid_thw"],
        second_per_grid_ts=batch["second_per_grid_ts"], attention_mask=batch["attention_mask"],
    )
    return embeds, pos, feats


def _optimise(opt, loss: torch.Tensor, params: list) -> None:
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 1.0)
    opt.step()


def _greedy_answer(model, tokenizer, pixels, prompt: str, max_new_tokens: int = 64) -> str:
    """The model's greedy answer to `prompt` about a preprocessed video."""
    vid = model.config.video_token_id
    ids = data.expand_video_tokens(tokenizer(data.chat_prompt(tokenizer, prompt)).input_ids, vid,
                                   pixels.num_visual_tokens)
    input_ids = torch.tensor([ids])
    out = model.generate(
        input_ids=input_ids, attention_mask=torch.ones_like(input_ids),
        pixel_values_videos=pixels.pixel_values, video_grid_thw=pixels.grid_thw,
        second_per_grid_ts=torch.tensor([pixels.second_per_grid]),
        mm_token_type_ids=(input_ids == vid).int() * 2,
        max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return tokenizer.decode(out[0, len(ids):], skip_special_tokens=True).strip()


@torch.no_grad()
def evaluate(model, tokenizer, num_scenes: int = 24, seed0: int = data.HELDOUT_SEED,
             num_frames: int = models.FRAMES, questions: bool = True) -> dict:
    """Greedy captions (and, with `questions`, one MC answer per scene) on held-out scenes rendered
    at `num_frames`, scored against the scene records: fact_accuracy = visual facts (colour, shape,
    motion) stated right / stated (attribute_accuracy: the same per attribute), recall and f1 as
    judges/oracle.py's score_caption."""
    from judges.oracle import VISUAL, score_caption  # local import: judges is a sibling package

    model.eval()
    stated = correct = mc_right = 0
    recall, f1 = [], []
    per_attribute = {a: [0, 0] for a in VISUAL}  # [right, stated]
    for k in range(num_scenes):
        scene = world.make_scene(seed0 + k)
        pixels = data.preprocess_video(world.render(scene, num_frames, models.FRAME_SIZE, models.FRAME_SIZE),
                                       models.FPS, models.DEMO_PREPROCESS)
        text = _greedy_answer(model, tokenizer, pixels, world.CAPTION_PROMPT)
        s = score_caption(text, scene)
        stated += s["visual_stated"]
        correct += s["visual_correct"]
        recall.append(s["recall"])
        f1.append(s["f1"])
        for a, counts in per_attribute.items():
            right, mentioned = s["per_attribute_counts"][a]
            counts[0] += right
            counts[1] += mentioned
        if questions:
            qs = world.make_questions(scene)
            q = qs[k % len(qs)]
            mc_right += int(_greedy_answer(model, tokenizer, pixels, world.format_mcq(q), 2)[:1] == q["answer"])
    model.train()
    out = {"fact_accuracy": correct / max(1, stated), "recall": float(np.mean(recall)), "f1": float(np.mean(f1)),
           "attribute_accuracy": {a: r / max(1, n) for a, (r, n) in per_attribute.items()}}
    return {**out, "mc_accuracy": mc_right / max(1, num_scenes)} if questions else out


def evaluate_lengths(model, tokenizer, lengths: dict[int, int], seed0: int = data.HELDOUT_SEED) -> dict:
    """`evaluate` at each number of frames in `lengths` (frames -> scenes; the same scenes at every
    length), with MC questions at the trained length only; keyed by visual tokens."""
    return {f"{frames * visual_tokens_per_frame()}_tokens": {
                "frames": frames, "scenes": n,
                **evaluate(model, tokenizer, n, seed0, frames, questions=frames == models.FRAMES)}
            for frames, n in lengths.items()}


def _lr(step: int, steps: int, peak: float, warmup: int = 200) -> float:
    if step < warmup:
        return peak * (step + 1) / warmup
    return peak * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, steps - warmup)))) * 0.95 + peak * 0.05


def _resume(path: Path, modules: dict, opt) -> int:
    if not path.exists():
        return 0
    state = torch.load(path, weights_only=False)
    for name, mod in modules.items():
        mod.load_state_dict(state[name])
    opt.load_state_dict(state["opt"])
    return state["step"]


def _checkpoint(path: Path, modules: dict, opt, step: int) -> None:
    save_atomic({**{k: m.state_dict() for k, m in modules.items()}, "opt": opt.state_dict(), "step": step}, path)


def load_or_train_tokenizer(out: Path):
    from transformers import AutoTokenizer

    if (out / "tokenizer.json").exists():
        return AutoTokenizer.from_pretrained(out)
    tok = train_tokenizer()
    save_tokenizer(tok, out)
    return tok


LONG_EVERY = 10


def _long_step(step: int, batch_size: int, rng: np.random.Generator) -> tuple[int, int]:
    """(frames, samples) for a step: every LONG_EVERY-th step is a batch of 16- or 32-frame videos
    with as many visual tokens in all as a normal batch, so the model sees more than one length."""
    if step % LONG_EVERY != LONG_EVERY - 1:
        return models.FRAMES, batch_size
    frames = int(rng.choice((16, 32)))
    return frames, max(1, batch_size * models.FRAMES // frames)


class OrderProbe(torch.nn.Module):
    """Linear probe on the language model's hidden states at the visual positions: which object
    (first, second or third to appear) the token holds. The vision tower attends within one
    temporal patch only, so telling the second object from the third is the language model's work;
    this gives that comparison a direct signal (training only)."""

    def __init__(self, hidden: int, layer: int, background_weight: float = 0.2):
        super().__init__()
        self.layer, self.background_weight = layer, background_weight  # the weight of tokens that hold no object
        self.proj = torch.nn.Linear(hidden, len(world.ORDINALS) + 1)

    def loss(self, hidden_states: tuple[torch.Tensor, ...], video_mask: torch.Tensor, owners: torch.Tensor) -> torch.Tensor:
        logits = self.proj(hidden_states[self.layer][video_mask].float())
        weight = torch.where(owners > 0, 1.0, self.background_weight)
        return weighted_cross_entropy(logits, owners, weight)


def training_heads(hidden: int) -> dict[str, torch.nn.Module]:
    """The training-only heads of the target's recipe (dropped after training)."""
    return {"aux": AuxHead(hidden), "probes": TextProbes(hidden, layers=(2, 4, 6)), "order": OrderProbe(hidden, layer=4)}


def word_ids(tok) -> tuple[torch.Tensor, set[int]]:
    """(ids of the shape words in world.SHAPES order, ids of the colour words)."""
    return (torch.tensor([tok(" " + s).input_ids[0] for s in world.SHAPES]),
            {tok(" " + c).input_ids[0] for c in world.COLOURS})


def target_losses(model, heads: dict, samples: list[data.Sample], frames: int,
                  words: tuple[torch.Tensor, set[int]]) -> dict[str, torch.Tensor]:
    """The recipe's losses on one batch (see the module docstring): the language-model loss and the
    four training-only signals, by name; `heads` holds the `training_heads`."""
    shape_word_ids, colour_ids = words
    vid = model.config.video_token_id
    batch = data.collate(samples, model.config.pad_token_id)
    per_sample = [coverage_owners(s.scene, frames, models.FRAME_SIZE) for s in samples]
    owners = torch.cat(per_sample)
    labels_vis = torch.cat([coverage_labels(o, s.scene) for o, s in zip(per_sample, samples)])
    length = batch["input_ids"].shape[1]
    labels_text = torch.stack([F.pad(text_labels(s, colour_ids), (0, 0, 0, length - len(s.input_ids)))
                               for s in samples])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        embeds, pos, feats = _embed_inputs(model, batch)
        out = model(inputs_embeds=embeds, position_ids=pos, attention_mask=batch["attention_mask"],
                    output_hidden_states=True)
    feats = feats.float()
    covered = labels_vis[:, 1] > 0
    shape_logits = model.lm_head(model.model.language_model.norm(feats[covered]))[:, shape_word_ids]
    return {
        "lm": per_sample_loss(out.logits.float(), batch["labels"]),
        "aux": heads["aux"].loss(feats, labels_vis),
        "shape_word": F.cross_entropy(shape_logits, labels_vis[covered, 1] - 1),
        "probe": heads["probes"].loss(out.hidden_states, labels_text),
        "order": heads["order"].loss(out.hidden_states, batch["input_ids"] == vid, owners),
    }


def _phase_lr(k: int, steps: int, peak: float, warmup: int = 30) -> float:
    """A short phase's own schedule (the question phase, restyling): a short warm-up, then a
    cosine to zero."""
    return peak * min(1.0, (k + 1) / warmup) * 0.5 * (1 + math.cos(math.pi * k / steps))


def _step_plan(step: int, steps: int, question_steps: int, batch_size: int, lr: float, question_lr: float,
               rng: np.random.Generator) -> tuple[float, int, int, data.TaskMix]:
    """(learning rate, frames, samples, task mix) of one step of the target's run: the main phase,
    then the last `question_steps` steps on data.QUESTION_MIX at the trained length."""
    main = steps - question_steps
    if step >= main:
        return _phase_lr(step - main, question_steps, question_lr), models.FRAMES, batch_size, data.QUESTION_MIX
    frames, n = _long_step(step, batch_size, rng)
    return _lr(step, main, lr), frames, n, data.TaskMix()


def train_target(work: Path, out: Path, steps: int, question_steps: int = 400, batch_size: int = 16,
                 lr: float = 1.5e-3, question_lr: float = 3e-4, eval_every: int = 500, seed: int = 0) -> Path:
    """Trains the target from scratch (see the module docstring); writes <out>/target. `steps`
    counts both phases; the last `question_steps` are the question phase."""
    torch.manual_seed(seed)
    tok = load_or_train_tokenizer(out / "tokenizer")
    model = Qwen2_5_VLForConditionalGeneration(models.target_config(tok)).float()
    modules = {"model": model, **training_heads(model.config.text_config.hidden_size)}
    words = word_ids(tok)
    params = [p for m in modules.values() for p in m.parameters()]
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    ckpt, log = work / "target.ckpt", work / "train_target.log"
    start = _resume(ckpt, modules, opt)
    model.train()
    rng = np.random.default_rng(seed + start)
    bar = tqdm(range(start, steps), initial=start, total=steps, desc="target", mininterval=5)
    t0, seen = time.time(), 0
    for step in bar:
        step_lr, frames, n, mix = _step_plan(step, steps, question_steps, batch_size, lr, question_lr, rng)
        for g in opt.param_groups:
            g["lr"] = step_lr
        seeds = range(data.TRAIN_SEED + step * batch_size, data.TRAIN_SEED + step * batch_size + n)
        samples = [data.make_sample(tok, model.config.video_token_id, s, num_frames=frames, rng=rng, noise=4.0, mix=mix)
                   for s in seeds]
        losses = target_losses(model, modules, samples, frames, words)
        loss = sum(losses.values())
        _optimise(opt, loss, params)
        seen += n
        if step % 25 == 0:
            rate = seen / (time.time() - t0)
            bar.set_postfix(lm=f"{losses['lm'].item():.3f}", probe=f"{losses['probe'].item():.3f}", sps=f"{rate:.1f}")
            log_jsonl(log, {"step": step, "frames": frames, **{f"{k}_loss": v.item() for k, v in losses.items()},
                       "samples_per_s": rate, "time": time.time()})
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            _checkpoint(ckpt, modules, opt, step + 1)
            log_jsonl(log, {"step": step + 1, "eval": evaluate(model, tok), "time": time.time()})
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out / "target", safe_serialization=True)
    tok.save_pretrained(out / "target")
    return out / "target"


def visual_tokens_per_frame() -> int:
    """Merged visual tokens per frame of a demo video (8 at 112 px: 4x4 per temporal patch of 2)."""
    return (models.FRAME_SIZE // TOKEN_PX) ** 2 // 2


# The length fine-tune: frame counts a long step draws from (all at 4 fps, so up to 128 s), the
# longest allowed rising over the run (a curriculum): (share of the run, longest frames).
LENGTH_LADDER = (16, 32, 64, 128, 192, 256, 384, 512)
LENGTH_CURRICULUM = ((0.15, 128), (0.35, 256), (1.0, 512))
LONG_MIX = data.TaskMix(caption=0.75)  # long steps: mostly captions, some questions


def _length_step(step: int, steps: int, batch_size: int, token_budget: int, trained_share: float,
                 rng: np.random.Generator, trained_mix: data.TaskMix = data.QUESTION_MIX) -> tuple[int, int, data.TaskMix]:
    """(frames, samples, task mix) of one step of a run over many lengths: with probability
    `trained_share` a batch at the trained length on `trained_mix` (for the target's fine-tune
    data.QUESTION_MIX, so the multiple-choice answers the question phase built are kept), else a
    length from LENGTH_LADDER up to the curriculum's longest at this point, with as many samples as
    fit `token_budget` visual tokens, on LONG_MIX."""
    # trained_share 1 (the draft's default, 8 frames only) draws nothing: the run's random stream,
    # and so its samples, stay those of the recipe that made the shipped draft
    if trained_share >= 1.0 or rng.random() < trained_share:
        return models.FRAMES, batch_size, trained_mix
    longest = next(top for share, top in LENGTH_CURRICULUM if step < share * steps or share == 1.0)
    frames = int(rng.choice([f for f in LENGTH_LADDER if f <= longest]))
    n = min(batch_size, max(1, token_budget // (frames * visual_tokens_per_frame())))
    return frames, n, LONG_MIX


def _freeze_vision(model) -> list:
    """The vision tower stays as trained (its per-patch features do not depend on video length);
    the rest trains. Returns the trainable parameters."""
    for p in model.model.visual.parameters():
        p.requires_grad = False
    return [p for p in model.parameters() if p.requires_grad]


class VisualProbes(torch.nn.Module):
    """Probes on the language model's hidden states at the visual positions (training only): the
    attributes (AuxHead: colour, shape, size, motion) and the order of appearance (OrderProbe) of the
    object each token holds. Order of appearance is only seen by comparing temporal patches, which
    the language model's attention does (as was motion, before the world kept the speed per frame
    at every length); these give that comparison a signal at every object token instead of at one
    caption word."""

    def __init__(self, hidden: int, layer: int):
        super().__init__()
        self.layer = layer
        self.attributes = AuxHead(hidden)
        self.order = OrderProbe(hidden, layer)

    def loss(self, hidden_states: tuple[torch.Tensor, ...], video_mask: torch.Tensor, owners: torch.Tensor,
             labels: torch.Tensor) -> torch.Tensor:
        feats = hidden_states[self.layer][video_mask].float()
        return self.attributes.loss(feats, labels) + self.order.loss(hidden_states, video_mask, owners)


def appeared_counts(scene: world.Scene, num_frames: int) -> torch.Tensor:
    """[temporal patches] how many of the scene's objects have appeared by the end of each temporal
    patch (by its last frame, as `world.render` draws them)."""
    grid_t = math.ceil(num_frames / 2)
    last = [min(2 * t + 1, num_frames - 1) / max(1, num_frames - 1) for t in range(grid_t)]
    return torch.tensor([sum(time + 1e-9 >= obj.appear for obj in scene.objects) for time in last])


def first_sightings(owners: torch.Tensor) -> torch.Tensor:
    """[num_tokens] 1 where a token holds an object in the temporal patch it is first seen in
    (owners: `coverage_owners`), else 0."""
    per_patch = owners.view(-1, (models.FRAME_SIZE // TOKEN_PX) ** 2)
    out = torch.zeros_like(per_patch)
    for k in per_patch.unique().tolist():
        if k > 0:
            first = int((per_patch == k).any(1).nonzero()[0])
            out[first][per_patch[first] == k] = 1
    return out.view(-1)


class AppearanceProbe(torch.nn.Module):
    """Linear probes on the language model's hidden states at the visual positions (training only):
    at the last visual token of each temporal patch (the first that sees the whole patch), how many
    objects have appeared so far (`appeared_counts`); at every token, whether it holds an object in
    the patch that object is first seen in (`first_sightings`). At long videos the target merged a
    later object with an earlier one of the same colour (and so said "two objects" for three), or
    named the later two in the wrong order: attention that pools "blue" over hundreds of temporal
    patches cannot tell one blue object from two, nor when each came. These ask for a running count
    at every patch and for each object's arrival where it happens."""

    def __init__(self, hidden: int, layer: int):
        super().__init__()
        self.layer = layer
        self.count = torch.nn.Linear(hidden, len(world.ORDINALS) + 1)
        self.new = torch.nn.Linear(hidden, 2)

    def loss(self, hidden_states: tuple[torch.Tensor, ...], video_mask: torch.Tensor, counts: torch.Tensor,
             owners: list[torch.Tensor]) -> torch.Tensor:
        """counts: [temporal patches of the batch] (`appeared_counts`); owners: each sample's `coverage_owners`."""
        per_patch = (models.FRAME_SIZE // TOKEN_PX) ** 2
        feats = hidden_states[self.layer][video_mask].float()
        count = F.cross_entropy(self.count(feats.view(-1, per_patch, feats.shape[-1])[:, -1]), counts)
        new, held = torch.cat([first_sightings(o) for o in owners]), torch.cat(owners) > 0
        # few tokens are first sightings; the other object tokens are the hard negatives
        weight = torch.where(new > 0, 1.0, torch.where(held, 0.5, 0.05))
        return count + weighted_cross_entropy(self.new(feats), new, weight)


class SlotAttention:
    """Attention supervision at the caption's object slots (training only): from the position that
    predicts the k-th object's size word to the end of its sentence, the query heads `heads`
    ((layer, head) pairs) must attend to the visual tokens that hold that object (`coverage_owners`).
    The 8-frame target grew such pointer heads by itself (layer 4 head 0 and layer 5 head 3 put
    0.66-0.70 of their attention on the named object's tokens, 0.04-0.05 on the others') and the
    length fine-tune kept them pointing at objects but not at the named one (0.33-0.36 against
    0.27-0.40 at 128-512 frames): at long videos the target named the later two objects in the
    wrong order. The language-model loss reaches that choice only through a softmax over thousands
    of keys; this asks the pointers directly. The loss is -log(the head's attention mass on the
    object's tokens)."""

    def __init__(self, colour_ids: set[int], stop_id: int, heads: tuple[tuple[int, int], ...] = ((3, 1), (4, 0), (5, 3))):
        self.colour_ids, self.stop_id = colour_ids, stop_id  # the colour words' ids, the sentence end's (".")
        self.heads = heads
        self.rows: list[tuple[int, torch.Tensor, torch.Tensor]] = []  # (sample, query rows, key targets [rows, len])
        self.losses: list[torch.Tensor] = []

    def targets(self, sample: data.Sample, owners: torch.Tensor, video_token_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(query rows, [rows, len(input_ids)] bool key targets) of a caption sample; empty for a question."""
        ids = torch.tensor(sample.input_ids)
        video = (ids == video_token_id).nonzero().squeeze(1)
        rows, targets, k = [], [], 0
        if sample.question is None:
            for i in range(sample.num_prompt, len(ids)):
                if int(ids[i]) in self.colour_ids and k < len(sample.scene.objects):
                    end = next((j for j in range(i, len(ids)) if int(ids[j]) == self.stop_id), len(ids) - 1)
                    keys = torch.zeros(len(ids), dtype=torch.bool)
                    keys[video[owners == k + 1]] = True
                    if keys.any():  # an object hidden behind another all along has no token to point at
                        rows.extend(range(i - 2, end))
                        targets.extend([keys] * (end - i + 2))
                    k += 1
        if not rows:
            return torch.zeros(0, dtype=torch.long), torch.zeros(0, len(ids), dtype=torch.bool)
        return torch.tensor(rows), torch.stack(targets)

    def add(self, query: torch.Tensor, key: torch.Tensor, mask, scaling: float, layer: int) -> None:
        """One layer's query [b, heads, q, d] and key [b, kv_heads, k, d] (`attention.collecting`'s
        call; the mask is not needed: the rows' own causal mask is applied here)."""
        group = query.shape[1] // key.shape[1]
        for head in (h for lay, h in self.heads if lay == layer):
            for b, rows, targets in self.rows:
                q = query[b, head, rows].float()
                k = key[b, head // group, : targets.shape[1]].float()
                logits = (q @ k.T) * scaling
                later = torch.arange(targets.shape[1])[None] > rows[:, None]
                logp = logits.masked_fill(later, float("-inf")).log_softmax(-1)
                self.losses.append(-logp.masked_fill(~targets, float("-inf")).logsumexp(-1))

    def supervising(self, model, samples: list[data.Sample], owners: list[torch.Tensor]):
        """A context in which `model`'s attention layers feed `add` (`attention.collecting`), which
        adds the supervised heads' losses on `samples` (their `coverage_owners`) for `loss`."""
        from ..backends import attention

        self.rows = [(b, *self.targets(s, o, model.config.video_token_id)) for b, (s, o) in enumerate(zip(samples, owners))]
        self.rows = [r for r in self.rows if len(r[1])]
        return attention.collecting(model.config.get_text_config(), self)

    def loss(self) -> torch.Tensor:
        """The mean over the supervised (head, row) pairs of the last forward; then starts afresh."""
        out = torch.cat(self.losses).mean() if self.losses else torch.zeros(())
        self.losses, self.rows = [], []
        return out


def length_losses(model, probes: VisualProbes, samples: list[data.Sample], frames: int,
                  appearance_probe: AppearanceProbe | None = None,
                  slot_attention: SlotAttention | None = None,
                  order_probe: OrderProbe | None = None) -> dict[str, torch.Tensor]:
    """The length fine-tune's losses on one batch, in float32: the language-model loss
    (`per_sample_loss`), the visual-position probes' (`VisualProbes`), with `appearance_probe` the
    running count's and first sightings' (`AppearanceProbe`), with `slot_attention` the pointer
    heads' (`SlotAttention`), with `order_probe` a second order-of-appearance probe's (`OrderProbe`)."""
    batch = data.collate(samples, model.config.pad_token_id)
    owners = [coverage_owners(s.scene, frames, models.FRAME_SIZE) for s in samples]
    all_owners = torch.cat(owners)
    labels = torch.cat([coverage_labels(o, s.scene) for o, s in zip(owners, samples)])
    embeds, pos, _ = _embed_inputs(model, batch)
    with slot_attention.supervising(model, samples, owners) if slot_attention else contextlib.nullcontext():
        out = model(inputs_embeds=embeds, position_ids=pos, attention_mask=batch["attention_mask"],
                    output_hidden_states=True)
    video_mask = batch["input_ids"] == model.config.video_token_id
    losses = {"lm": per_sample_loss(out.logits, batch["labels"]),
              "visual_probe": probes.loss(out.hidden_states, video_mask, all_owners, labels)}
    if appearance_probe is not None:
        counts = torch.cat([appeared_counts(s.scene, frames) for s in samples])
        losses["appearance_probe"] = appearance_probe.loss(out.hidden_states, video_mask, counts, owners)
    if slot_attention is not None:
        losses["slot_attention"] = slot_attention.loss()
    if order_probe is not None:
        losses["order_probe"] = order_probe.loss(out.hidden_states, video_mask, all_owners)
    return losses


LENGTH_EVAL = {models.FRAMES: 12, 128: 6, 512: 6}  # frames -> held-out scenes, during the fine-tune
LENGTHS_MARKER = "length_finetune.json"
# The second length stage of `build-demo` (`--pointer-steps`): the running count and first sightings
# (`AppearanceProbe`) and the pointer heads (`SlotAttention`), from the first stage's target, on other scenes.
POINTER_STAGE = "lengths_pointer"
POINTER_RECIPE = dict(lr=2e-4, appearance_probe_weight=1.0, slot_attention_weight=0.5, name=POINTER_STAGE,
                      scene0=9_500_000)
# Then three more of the same on other scenes with a second order-of-appearance probe on the object
# tokens (`OrderProbe` without the background tokens, `order_probe_weight`), the second and third
# with the pointer heads' supervision doubled: at 128 frames the pointer stage's target still named the
# third object where the second belonged.
_ORDER_RECIPE = dict(POINTER_RECIPE, order_probe_weight=1.0, name="lengths_order", scene0=9_600_000)
ORDER_RECIPES = (_ORDER_RECIPE,
                 dict(_ORDER_RECIPE, slot_attention_weight=1.0, name="lengths_order2", scene0=9_700_000),
                 dict(_ORDER_RECIPE, slot_attention_weight=1.0, name="lengths_order3", scene0=9_800_000))
LATER_LENGTH_STAGES = (POINTER_RECIPE, *ORDER_RECIPES)  # build-demo's stages after the first, in order


def length_marker(name: str) -> str:
    """The file a length stage called `name` writes into the target's folder when it is done."""
    return LENGTHS_MARKER if name == "lengths" else f"{name}_finetune.json"


def finetune_lengths(work: Path, target_dir: Path, steps: int, batch_size: int = 16, token_budget: int = 4096,
                     trained_share: float = 0.25, lr: float = 2e-4, eval_every: int = 150, ckpt_every: int = 25,
                     length_eval: dict[int, int] | None = None, probe_weight: float = 0.5, probe_layer: int = 4,
                     probe_lr: float = 2e-3, seed: int = 0, name: str = "lengths", scene0: int = 9_000_000,
                     appearance_probe_weight: float = 0.0, slot_attention_weight: float = 0.0,
                     order_probe_weight: float = 0.0) -> Path:
    """Fine-tune a trained target on videos of 16 to 512 frames (up to 4,096 visual tokens), so that
    it captions long videos as it does 8-frame ones: trained at 8 frames, its temporal positions
    never went past 16 grids, and past 256 visual tokens it fell into repetitions. Length
    curriculum (`_length_step`), the language-model loss plus `probe_weight` x the visual-position
    probes of `VisualProbes` (at layer `probe_layer`; their own learning rate `probe_lr`, since they
    start untrained), with `appearance_probe_weight` > 0 plus that times `AppearanceProbe`'s (at
    `probe_layer`), with `slot_attention_weight` > 0 plus that times `SlotAttention`'s, with
    `order_probe_weight` > 0 plus that times a second `OrderProbe`'s on the object tokens only, float32
    (bfloat16 autocast was 16x slower than float32 on this CPU, 2026-12-01), vision tower frozen.
    A stage called `name` trains on the scenes from seed `scene0` on, overwrites `target_dir` and
    writes `length_marker(name)` there (the stage's record); logs to <work>/train_target_<name>.log (with `evaluate_lengths` on
    `length_eval`, default LENGTH_EVAL, every `eval_every` steps) and resumes from
    <work>/target_<name>.ckpt (saved every `ckpt_every` steps)."""
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(target_dir)
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(target_dir, dtype=torch.float32)
    hidden = model.config.text_config.hidden_size
    probes = VisualProbes(hidden, probe_layer)
    heads = {"model": model, "probes": probes}
    if appearance_probe_weight > 0:
        heads["appearance_probe"] = AppearanceProbe(hidden, probe_layer)
    if order_probe_weight > 0:
        heads["order_probe"] = OrderProbe(hidden, probe_layer, background_weight=0.0)
    slot = SlotAttention(word_ids(tok)[1], tok(".").input_ids[0]) if slot_attention_weight > 0 else None
    params = _freeze_vision(model)
    probe_params = [p for key, m in heads.items() if key != "model" for p in m.parameters()]
    groups = [{"params": params, "peak": lr}, {"params": probe_params, "peak": probe_lr}]
    opt = torch.optim.AdamW(groups, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))
    ckpt, log = work / f"target_{name}.ckpt", work / f"train_target_{name}.log"
    start = _resume(ckpt, heads, opt)
    model.train()
    rng = np.random.default_rng(seed + 13 + start)
    bar = tqdm(range(start, steps), initial=start, total=steps, desc=f"target {name}", mininterval=5)
    t0 = time.time()
    for step in bar:
        frames, n, mix = _length_step(step, steps, batch_size, token_budget, trained_share, rng)
        for g in opt.param_groups:
            g["lr"] = _phase_lr(step, steps, g["peak"])
        first = scene0 + step * batch_size
        samples = [data.make_sample(tok, model.config.video_token_id, s, num_frames=frames, rng=rng, noise=4.0, mix=mix)
                   for s in range(first, first + n)]
        losses = length_losses(model, probes, samples, frames, heads.get("appearance_probe"), slot,
                               heads.get("order_probe"))
        total = (losses["lm"] + probe_weight * losses["visual_probe"]
                 + appearance_probe_weight * losses.get("appearance_probe", 0.0)
                 + slot_attention_weight * losses.get("slot_attention", 0.0)
                 + order_probe_weight * losses.get("order_probe", 0.0))
        _optimise(opt, total, params + probe_params)
        bar.set_postfix(lm=f"{losses['lm'].item():.3f}", frames=frames)
        log_jsonl(log, {"step": step, "frames": frames, "samples": n, **{f"{k}_loss": v.item() for k, v in losses.items()},
                   "lr": opt.param_groups[0]["lr"],
                   "elapsed_s": round(time.time() - t0, 1), "threads": torch.get_num_threads(), "time": time.time()})
        if (step + 1) % ckpt_every == 0 or step + 1 == steps:
            _checkpoint(ckpt, heads, opt, step + 1)
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            log_jsonl(log, {"step": step + 1, "eval": evaluate_lengths(model, tok, length_eval or LENGTH_EVAL), "time": time.time()})
    model.eval()
    model.save_pretrained(target_dir, safe_serialization=True)
    record = {"steps": steps, "batch_size": batch_size, "token_budget": token_budget, "trained_share": trained_share,
              "lr": lr, "probe_weight": probe_weight, "probe_layer": probe_layer, "probe_lr": probe_lr,
              "appearance_probe_weight": appearance_probe_weight, "slot_attention_weight": slot_attention_weight,
              "order_probe_weight": order_probe_weight,
              "name": name, "scene0": scene0, "ladder": LENGTH_LADDER, "curriculum": LENGTH_CURRICULUM}
    (target_dir / length_marker(name)).write_text(json.dumps(record, indent=1) + "\n")
    return target_dir


@torch.no_grad()
def pruned_keep(target, embeds: torch.Tensor, pos: torch.Tensor, ids: torch.Tensor, num_prompt: int,
                video_token_id: int) -> torch.Tensor:
    """[len(ids)] bool: the positions of one training sample a SpecVLM-pruned draft keeps, every
    text token and the video tokens `select_visual_tokens` picks from the attention the prompt's
    text after the video pays them (collected by the engine's prefill's own `backends.base.run_prompt`,
    in the one prefill). embeds [1, L, hidden] and pos
    [3, 1, L]: the target's, as `_embed_inputs` gives them for this sample."""
    from transformers import DynamicCache

    from ..backends.attention import pruning_scores
    from ..backends.base import run_prompt
    from ..decoding.pruning import PruneConfig, select_visual_tokens

    video = (ids == video_token_id).nonzero().flatten()
    span = (int(video[0]), int(video[-1]) + 1)
    cache = DynamicCache(config=target.config.get_text_config())
    _, queries = run_prompt(target.model.language_model, embeds[:, :num_prompt], pos[..., :num_prompt], cache,
                            collect_from=span[1])
    scores = pruning_scores(queries, cache, *span)
    keep = ids != video_token_id
    keep[video[select_visual_tokens(scores, PruneConfig())]] = True
    return keep


def _distil_loss(t_logits: torch.Tensor, d_logits: torch.Tensor, keep_t: torch.Tensor, keep_d: torch.Tensor,
                 temperature: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(target, draft) log-probabilities at the positions that predict answer tokens (position i
    predicts token i+1); keep_*: the answer tokens' positions in each sequence."""
    t_lp = F.log_softmax(t_logits[:, :-1][keep_t[:, 1:]] / temperature, -1)
    d_lp = F.log_softmax(d_logits[:, :-1][keep_d[:, 1:]] / temperature, -1)
    return t_lp, d_lp


def _draft_optimiser(draft, lr: float) -> tuple[list, torch.optim.Optimizer]:
    """The draft's vision blocks stay frozen (a copy of the target's); its merger and language
    model train."""
    for name, p in draft.model.visual.named_parameters():
        p.requires_grad = name.startswith("merger.")
    params = [p for p in draft.parameters() if p.requires_grad]
    return params, torch.optim.AdamW(params, lr=lr, weight_decay=0.01, betas=(0.9, 0.98))


def train_draft(work: Path, out: Path, target_dir: Path, steps: int, batch_size: int = 16,
                lr: float = 2e-3, temperature: float = 1.0, eval_every: int = 500, long_share: float = 0.0,
                token_budget: int = 2048, init: Path | None = None, pruned_share: float = 0.0,
                seed: int = 0) -> Path:
    """Distil a small draft on the target's next-token distributions (soft labels). A share
    `long_share` of the steps are videos of 16-512 frames (`_length_step`, `token_budget` visual
    tokens a step), so that the draft follows the target at every length of the demo's curve.
    A share `pruned_share` of the long steps show the draft only the video tokens SpecVLM's pruning
    keeps (`pruned_keep`, 10%, at their original positions) against the target's full-video
    distributions, so that a pruned draft still follows the target on long videos (a real small
    Video-LLM has seen videos at many token budgets; the demo draft had only seen whole ones).
    `init`: start from that draft (a re-distillation for a changed target) instead of from scratch."""
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(out / "tokenizer")
    target = Qwen2_5_VLForConditionalGeneration.from_pretrained(target_dir).float().eval()
    if init is not None:
        draft = Qwen2_5_VLForConditionalGeneration.from_pretrained(init, dtype=torch.float32)
    else:
        draft = Qwen2_5_VLForConditionalGeneration(models.draft_config(tok)).float()
    # Start from the target's vision blocks (same layout) and keep them frozen; train the rest.
    own = draft.model.visual.state_dict()
    own.update({k: v for k, v in target.model.visual.state_dict().items() if not k.startswith("merger.")})
    draft.model.visual.load_state_dict(own)
    params, opt = _draft_optimiser(draft, lr)
    ckpt, log = work / "draft.ckpt", work / "train_draft.log"
    start = _resume(ckpt, {"model": draft}, opt)
    rng = np.random.default_rng(seed + 7 + start)
    bar = tqdm(range(start, steps), initial=start, total=steps, desc="draft", mininterval=5)
    t0 = time.time()
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = _lr(step, steps, lr)
        frames, n, mix = _length_step(step, steps, batch_size, token_budget, 1 - long_share, rng, data.TaskMix())
        seeds = range(5_000_000 + step * batch_size, 5_000_000 + step * batch_size + n)
        samples = [data.make_sample(tok, target.config.video_token_id, s, num_frames=frames, rng=rng, noise=4.0, mix=mix)
                   for s in seeds]
        batch = data.collate(samples, tok.pad_token_id)
        keep = batch["labels"] != -100
        # the pruned draw only in long steps: the 8-frame steps' random stream stays the recipe's
        pruned = pruned_share > 0 and frames != models.FRAMES and rng.random() < pruned_share
        with torch.no_grad():
            t_emb, t_pos, _ = _embed_inputs(target, batch)
            t_logits = target(inputs_embeds=t_emb, position_ids=t_pos, attention_mask=batch["attention_mask"]).logits
        d_emb, pos, _ = _embed_inputs(draft, batch)
        if pruned:  # one sample at a time (their pruned lengths differ); the samples are few here
            pairs = []
            for b, smp in enumerate(samples):
                ids = batch["input_ids"][b, :len(smp.input_ids)]
                kept = pruned_keep(target, t_emb[b:b + 1, :len(ids)], t_pos[:, b:b + 1, :len(ids)], ids,
                                   smp.num_prompt, target.config.video_token_id)
                d_logits = draft(inputs_embeds=d_emb[b:b + 1, :len(ids)][:, kept],
                                 position_ids=pos[:, b:b + 1, :len(ids)][..., kept]).logits
                pairs.append(_distil_loss(t_logits[b:b + 1], d_logits, keep[b:b + 1], keep[b:b + 1, :len(ids)][:, kept],
                                          temperature))
            t_lp, d_lp = torch.cat([t for t, _ in pairs]), torch.cat([d for _, d in pairs])
        else:
            d_logits = draft(inputs_embeds=d_emb, position_ids=pos, attention_mask=batch["attention_mask"]).logits
            t_lp, d_lp = _distil_loss(t_logits, d_logits, keep, keep, temperature)
        loss = F.kl_div(d_lp, t_lp, log_target=True, reduction="batchmean")
        _optimise(opt, loss, params)
        if step % 25 == 0:
            agree = (d_lp.argmax(-1) == t_lp.argmax(-1)).float().mean().item()
            bar.set_postfix(kl=f"{loss.item():.3f}", agree=f"{agree:.3f}", frames=frames)
            log_jsonl(log, {"step": step, "frames": frames, "samples": n, "pruned": pruned, "kl": loss.item(), "top1_agreement": agree,
                       "elapsed_s": round(time.time() - t0, 1), "threads": torch.get_num_threads(),
                       "time": time.time()})
        if (step + 1) % 100 == 0 or step + 1 == steps:
            _checkpoint(ckpt, {"model": draft}, opt, step + 1)
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            log_jsonl(log, {"step": step + 1, "eval": evaluate(draft, tok, num_scenes=12), "time": time.time()})
    draft.save_pretrained(out / "draft", safe_serialization=True)
    tok.save_pretrained(out / "draft")
    return out / "draft"


def restyle_draft(work: Path, out: Path, draft_dir: Path, steps: int, batch_size: int = 16, lr: float = 5e-4,
                  eval_every: int = 100, seed: int = 0) -> Path:
    """Fine-tune the distilled draft on captions of another phrasing style (data.RESTYLE_MIX: the
    same phrasings, the second listed one the favourite of every slot) by plain next-token loss on
    those references: a draft that learned its wording from another corpus, as a smaller model of
    the family trained on its own data does, instead of from the target. Writes <out>/draft_restyled."""
    from transformers import AutoTokenizer

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(draft_dir)
    draft = Qwen2_5_VLForConditionalGeneration.from_pretrained(draft_dir, dtype=torch.float32)
    params, opt = _draft_optimiser(draft, lr)
    ckpt, log = work / "draft_restyled.ckpt", work / "train_draft_restyled.log"
    start = _resume(ckpt, {"model": draft}, opt)
    draft.train()
    rng = np.random.default_rng(seed + 11 + start)
    bar = tqdm(range(start, steps), initial=start, total=steps, desc="restyle draft", mininterval=5)
    t0 = time.time()
    for step in bar:
        for g in opt.param_groups:
            g["lr"] = _phase_lr(step, steps, lr)
        seeds = range(7_000_000 + step * batch_size, 7_000_000 + (step + 1) * batch_size)
        samples = [data.make_sample(tok, draft.config.video_token_id, s, rng=rng, noise=4.0, mix=data.RESTYLE_MIX)
                   for s in seeds]
        batch = data.collate(samples, tok.pad_token_id)
        emb, pos, _ = _embed_inputs(draft, batch)
        logits = draft(inputs_embeds=emb, position_ids=pos, attention_mask=batch["attention_mask"]).logits
        loss = per_sample_loss(logits, batch["labels"])
        _optimise(opt, loss, params)
        if step % 25 == 0:
            rate = (step + 1 - start) * batch_size / (time.time() - t0)
            bar.set_postfix(lm=f"{loss.item():.3f}", sps=f"{rate:.1f}")
            log_jsonl(log, {"step": step, "lm_loss": loss.item(), "samples_per_s": rate, "time": time.time()})
        if (step + 1) % eval_every == 0 or step + 1 == steps:
            _checkpoint(ckpt, {"model": draft}, opt, step + 1)
            log_jsonl(log, {"step": step + 1, "eval": evaluate(draft, tok, num_scenes=12), "time": time.time()})
    draft.eval()
    draft.save_pretrained(out / "draft_restyled", safe_serialization=True)
    tok.save_pretrained(out / "draft_restyled")
    return out / "draft_restyled"
