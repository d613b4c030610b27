"""`lvspec-eval train-sparrow`: train a Sparrow draft head for a target (SPEC.md section 4).

Data (self-distillation, as EAGLE does): the target's own greedy answers, generated once and
cached as JSON lines, so a rerun resumes where generation stopped. The head learns what the
target says, not what a ground truth says. Two sources of videos and prompts:
- the demo world (default): caption and multiple-choice prompts about rendered scenes from the
  training seed range; this is how the shipped demo heads are made;
- `--videos DIR`, any target: every video file under DIR (any common container), decoded by the
  lmms-eval model's own loader with the frames and pixels `--model lvspec` gives that target under
  the same --video-rule / --fps / --frames / --min-pixels / --max-pixels (default: its default,
  the `lmms_eval` rule for a real checkpoint), each asked the fixed describe/caption/question
  prompts of VIDEO_PROMPTS. A file that cannot be decoded is recorded as skipped (with its
  reason) and left out.

Features: for each example the target runs once over prompt + answer through its backend (so
Qwen2.5-VL and LLaVA-OneVision both work), giving its final hidden state at every position and,
for IVSB, its hidden states at the visual positions after a middle layer. They are kept in memory
up to --feature-cache-mb so later epochs skip the target.

Training, per batch (all losses on the positions that predict answer tokens):
- HSR: the head's input at text position t is fc([embedding(token_t); h_{t-1}]) with the
  target's h, exactly as at inference.
- IVSB: the head's layer also sees, as a prefix, the target's visual hidden states after layer
  --ivsb-layer (default: half the target's depth); a text token sees the visual tokens that come
  before it. At inference the head has no prefix. Why it still helps: the target's final h
  carries the video only in a compressed, entangled form; while the prefix is visible, the
  gradient pushes the head's attention and projection to line its text-side features up with
  the target's visual features, which is the same feature space the target's h was built from,
  so the head learns to decode the visual facts (colours, shapes) that h carries instead of
  learning a text-only language model. A share of the examples (--ivsb-drop) is trained without
  the prefix, exactly as at inference, so the head never comes to depend on it.
- MTP: --mtp-steps more passes in which h is the head's own output at t-1 from the previous
  pass, as when it drafts depth 2, 3, ... of a tree. A query in pass k sees pass-0 keys up to
  t-k and, for j = 1..k, the pass-j key at t-k+j: the keys its draft chain would see (the
  "training-time test" attention of EAGLE-3). Pass k is weighted by --mtp-decay ** k.
- Loss: cross-entropy of the target's frozen LM head on the head's output against the target's
  next token, plus --reg-weight x smooth-L1 of the head's output onto the target's final h
  (EAGLE trains both).

Logs (JSON lines) and the resumable state go to --work (with --videos: <out>/train); the head (fc +
layer + norm only) to --out. The state is saved every --ckpt-every steps and on Ctrl-C; a rerun with
the same settings continues from it (--restart starts over), and refuses a state made with other ones.

The shipped demo heads (defaults: 800 captions + 150 MC answers, 900 steps of 16, lr 2e-3):
    lvspec-eval train-sparrow --threads 1                       # -> demo/checkpoints/sparrow
    lvspec-eval train-sparrow --threads 1 --no-ivsb --out lvspec_eval/demo/checkpoints/sparrow_noivsb
    lvspec-eval train-sparrow --threads 1 --mtp-steps 0 --out lvspec_eval/demo/checkpoints/sparrow_nomtp
On this 2-core CPU, the three side by side (2026-11-30): the target's answers 1.2-1.5 minutes (once;
cached, shared by all three), then 5.5-12 minutes per head, 9-12 minutes in all (two runs). They were
made on the CPU: on a machine with a GPU add --device cpu to remake them as they are.

A real target on a GPU, from a folder of your own videos (not yet run on a GPU; on this CPU a tiny
random Qwen2.5-VL, 3 short videos x 8 prompts, 30 steps of 8: 3.5 minutes):
    lvspec-eval train-sparrow --target Qwen/Qwen2.5-VL-7B-Instruct --videos my_videos --out heads/qwen7b \
        --device cuda --dtype bfloat16 --batch-size 4 --grad-accum 4 --steps 3000 --feature-cache-mb 60000
then evaluate with the model_args the command prints (method=sparrow,sparrow_head=heads/qwen7b,...).
"""
from __future__ import annotations

import argparse
import functools
import hashlib
import inspect
import json
import logging
import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import DynamicCache

from .. import jsonl
from ..backends.base import FINAL, Backend
from ..decoding.drafters.model import NoDrafter
from ..decoding.drafters.sparrow import DEMO_HEAD, SparrowHead
from ..decoding.loop import generate
from ..decoding.verifiers.exact import ExactVerifier
from ..models.stats_writer import cut_torn_tail
from .common import log_jsonl, save_atomic

log = logging.getLogger(__name__)

MCQ_SEED_SHIFT = 500_000  # MC questions use scenes apart from the captions'
# The fixed prompts every user video is asked (--videos): captions of several lengths and open
# questions, so the head sees the target's description style, its short answers and its lists.
VIDEO_PROMPTS = (
    "Describe this video in detail.",
    "Write a one-sentence caption for this video.",
    "What is happening in this video?",
    "List the main objects and people that appear in the video.",
    "Describe the setting and the background of this video.",
    "What actions take place in the video, in order?",
    "What colours, shapes and text stand out in this video?",
    "Describe how the camera moves and how the shots change.",
)
VIDEO_EXTENSIONS = (".mp4", ".mkv", ".webm", ".avi", ".mov", ".m4v", ".mpg", ".mpeg", ".flv", ".wmv", ".3gp",
                    ".ts", ".gif")
# Settings a resumed state must share with the run that made it (the data and the training setup).
RESUME_KEYS = ("target", "videos", "prompts_per_video", "num_captions", "num_mcq", "seed_offset", "frames", "fps",
               "video_rule", "min_pixels", "max_pixels", "size", "max_new_tokens", "no_ivsb", "ivsb_layer",
               "mtp_steps", "batch_size", "grad_accum", "seed", "num_examples")


@dataclass
class Example:
    """One training sequence in the head's text-only view (T text tokens, V visual tokens)."""

    tokens: torch.Tensor  # [T] prompt text tokens, then the answer
    prev: torch.Tensor  # [T, hidden] target h at the sequence position before each token (0 at the start)
    target_h: torch.Tensor  # [T, hidden] target h at each token
    loss_from: int  # positions loss_from .. T-2 predict answer tokens
    visual: torch.Tensor | None  # [V, hidden] target hidden after the IVSB layer at the visual positions
    visual_pos: torch.Tensor | None  # [V] text tokens before each visual token (= its position)

    def nbytes(self) -> int:
        tensors = [self.tokens, self.prev, self.target_h, self.visual, self.visual_pos]
        return sum(t.numel() * t.element_size() for t in tensors if t is not None)


# ---- data: the target's own answers ---------------------------------------------------------------

def task_list(args) -> list[dict]:
    """Every example's key, video and prompt: the user's videos (--videos) or demo scenes."""
    return video_tasks(args) if args.videos else demo_tasks(args)


def find_videos(folder: Path) -> list[Path]:
    """Video files under `folder` (recursively, by extension), sorted; ValueError if there are none."""
    if not folder.is_dir():
        raise ValueError(f"--videos {str(folder)!r} is not a folder")
    found = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in VIDEO_EXTENSIONS)
    if not found:
        raise ValueError(f"--videos {str(folder)!r} holds no video file; looked for {', '.join(VIDEO_EXTENSIONS)}")
    return found


def video_tasks(args) -> list[dict]:
    """Each video under --videos with each of the first --prompts-per-video prompts, video by video."""
    root = Path(args.videos)
    return [{"key": f"{rel}|{prompt}", "video": rel, "prompt": prompt}
            for rel in (p.relative_to(root).as_posix() for p in find_videos(root))
            for prompt in VIDEO_PROMPTS[: args.prompts_per_video]]


def demo_tasks(args) -> list[dict]:
    """The (key, scene seed, prompt) of every demo example, captions first."""
    from ..demo import data, world

    tasks = []
    for k in range(args.num_captions):
        seed = data.TRAIN_SEED + args.seed_offset + k
        tasks.append({"key": f"cap{k}", "seed": seed, "prompt": world.CAPTION_PROMPT})
    for k in range(args.num_mcq):
        seed = data.TRAIN_SEED + args.seed_offset + MCQ_SEED_SHIFT + k
        questions = world.make_questions(world.make_scene(seed))
        tasks.append({"key": f"mcq{k}", "seed": seed, "prompt": world.format_mcq(questions[k % len(questions)])})
    return tasks


def video_for(task: dict, args) -> tuple:
    """(frames uint8 [T, H, W, 3], fps[, original frame indices, native fps]) of a task: its user video
    file (as `--model lvspec` hands it to the backend: Qwen3-VL's timestamps need the indices), or its
    rendered demo scene."""
    if "video" in task:
        return _decoded(str(Path(args.videos) / task["video"]), args.frame_plan)
    from ..demo import models, world

    return world.render(world.make_scene(task["seed"]), args.frames, args.size, args.size), models.FPS


@functools.lru_cache(maxsize=4)  # a video's prompts come one after another
def _decoded(path: str, plan) -> tuple:
    from ..models.video import load_video

    return load_video(path, plan=plan).request()


def attach_frame_plan(args, backend: Backend) -> None:
    """args.frame_plan: which frames a user video gives this target under --video-rule (as
    `--model lvspec` computes it); ValueError for an fps / frames the rule cannot take."""
    args.frame_plan = backend.frame_plan(args.fps, args.frames) if args.videos else None


def unreadable(task: dict, args) -> str | None:
    """Why the task's video cannot be decoded, or None (demo scenes always render)."""
    from ..models.video import VideoError

    if "video" not in task:
        return None
    try:
        video_for(task, args)
    except VideoError as err:
        return str(err)
    return None


def end_token(backend: Backend) -> int:
    """The EOS the target's answers end with (the loop strips it): the tokenizer's, if it is one."""
    eos = backend.tokenizer.eos_token_id
    return eos if eos in backend.eos_token_ids else min(backend.eos_token_ids)


def generate_data(backend: Backend, args, path: Path) -> list[dict]:
    """Greedy target answers for every task, appended to `path` (JSON lines) as they come.

    A task whose video cannot be decoded is written with its `error` instead (so a rerun does not
    try it again) and left out of the returned records.
    """
    done = {}
    if path.exists():
        with path.open("r+b") as f:  # a killed run's torn last line: no record, and the next would be glued to it
            cut_torn_tail(f.fileno(), path)
        done = {r["key"]: r for r in jsonl.read_jsonl(path, log.warning)}
    tasks = task_list(args)
    todo = [t for t in tasks if t["key"] not in done]
    bar = tqdm(total=len(todo), desc="target answers", mininterval=5, disable=not todo)
    with path.open("a") as f:
        for lo in range(0, len(todo), args.gen_batch):
            chunk = todo[lo: lo + args.gen_batch]
            for task, result in zip(chunk, answer_chunk(backend, chunk, args)):
                done[task["key"]] = {**task, **result}
                f.write(json.dumps(done[task["key"]]) + "\n")
            f.flush()
            bar.update(len(chunk))
    bar.close()
    records = [done[t["key"]] for t in tasks]
    skipped = sorted({r.get("video", r["key"]) + ": " + r["error"] for r in records if "error" in r})
    for line in skipped:
        log.warning("skipped %s", line)
    records = [r for r in records if "answer" in r]
    if not records:
        raise ValueError(f"no training example: every video failed to decode ({len(skipped)} skipped)")
    return records


def answer_chunk(backend: Backend, chunk: list[dict], args) -> list[dict]:
    """{"answer": tokens} for each task, or {"error": why} where its video cannot be decoded."""
    errors = [unreadable(task, args) for task in chunk]
    ok = [task for task, err in zip(chunk, errors) if err is None]
    if args.gen_batch > 1 and ok:
        answers = iter(greedy_batch(backend, ok, args))
    else:
        answers = (greedy_one(backend, task, args) for task in ok)
    return [{"error": err} if err is not None else {"answer": next(answers)} for err in errors]


def greedy_one(backend: Backend, task: dict, args) -> list[int]:
    """The answer from the decoding loop itself (vanilla), with the EOS it stopped at."""
    out = generate(backend, NoDrafter(), ExactVerifier(), task["prompt"], [video_for(task, args)],
                   args.max_new_tokens)
    return out.tokens + ([end_token(backend)] if len(out.tokens) < args.max_new_tokens else [])


def greedy_batch(backend: Backend, tasks: list[dict], args) -> list[list[int]]:
    """Answers for a batch through the model's own batched greedy `generate` (left padding).

    Several times faster per answer than one-by-one decoding on a CPU. Each family's visual
    inputs concatenate along dim 0 (Qwen: patches, grids, frame spacings; LLaVA-OV: videos),
    which LLaVA-OV's [1, frames, 3, H, W] videos only do at equal frame counts: inputs are
    batched in groups whose visual tensors agree beyond dim 0 (all of them for demo scenes).
    Batched and one-by-one greedy decoding can differ where two logits tie within rounding:
    either is the target's own output, which is all the training data needs.
    """
    prepared = [backend.prepare(t["prompt"], [video_for(t, args)]) for t in tasks]
    answers: dict[int, list[int]] = {}
    for group in stackable_groups(prepared):
        answers.update(zip(group, generate_stacked(backend, [prepared[i] for i in group], args)))
    return [answers[i] for i in range(len(tasks))]


def stackable_groups(prepared: list) -> list[list[int]]:
    """Indices of the inputs whose model_kwargs tensors have equal shapes beyond dim 0, in order."""
    groups: dict[tuple, list[int]] = {}
    for i, p in enumerate(prepared):
        groups.setdefault(tuple((k, tuple(v.shape[1:])) for k, v in sorted(p.model_kwargs.items())), []).append(i)
    return list(groups.values())


@torch.no_grad()
def generate_stacked(backend: Backend, prepared: list, args) -> list[list[int]]:
    """Greedy answers (each up to and with its EOS) for prepared inputs that stack (see above)."""
    pad = backend.tokenizer.pad_token_id if backend.tokenizer.pad_token_id is not None else 0
    width = max(p.input_ids.shape[1] for p in prepared)
    ids = torch.full((len(prepared), width), pad, dtype=torch.long, device=backend.device)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prepared):
        ids[i, width - p.input_ids.shape[1]:], mask[i, width - p.input_ids.shape[1]:] = p.input_ids[0], 1
    kwargs = {k: torch.cat([p.model_kwargs[k] for p in prepared]) for k in prepared[0].model_kwargs}
    if "mm_token_type_ids" in inspect.signature(backend.model.forward).parameters:  # Qwen: 2 marks video
        kwargs["mm_token_type_ids"] = (ids == backend.video_token_id).int() * 2
    eos = sorted(backend.eos_token_ids)
    out = backend.model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=args.max_new_tokens,
                                 do_sample=False, eos_token_id=eos, pad_token_id=pad, **kwargs)[:, width:]
    answers = []
    for row in out.tolist():
        stop = next((i for i, t in enumerate(row) if t in backend.eos_token_ids), None)
        answers.append(row if stop is None else row[: stop + 1])
    return answers


@torch.no_grad()
def extract(backend: Backend, record: dict, args, ivsb_layer: int | None) -> Example:
    """Run the target over prompt + answer; cut out what the head trains on."""
    inputs = backend.prepare(record["prompt"], [video_for(record, args)])
    layers = (FINAL,) if ivsb_layer is None else (FINAL, ivsb_layer)
    state, _ = backend.prefill(inputs, hidden_layers=layers)
    answer = torch.tensor(record["answer"], dtype=torch.long)
    n = answer.numel()
    _, hidden = backend.forward(state, answer, torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril(),
                                hidden_layers=(FINAL,))
    seq_h = torch.cat([state.prompt_hidden[FINAL], hidden[FINAL]]).float().cpu()  # [L + n, hidden]
    vmask = inputs.visual_mask.cpu()
    text_idx = (~vmask).nonzero().flatten()
    tokens = torch.cat([inputs.input_ids[0].cpu()[text_idx], answer])
    seq_idx = torch.cat([text_idx, vmask.numel() + torch.arange(n)])
    prev = torch.cat([torch.zeros_like(seq_h[:1]), seq_h[:-1]])[seq_idx]
    visual = visual_pos = None
    if ivsb_layer is not None and vmask.any():
        visual = state.prompt_hidden[ivsb_layer][vmask.to(state.prompt_hidden[ivsb_layer].device)].float().cpu()
        visual_pos = torch.searchsorted(text_idx, vmask.nonzero().flatten())
    return Example(tokens, prev, seq_h[seq_idx], len(text_idx) - 1, visual, visual_pos)


class FeatureStore:
    """Examples by index, computed by the target on first use and kept up to a memory budget."""

    def __init__(self, backend: Backend, records: list[dict], args, ivsb_layer: int | None):
        self.backend, self.records, self.args, self.ivsb_layer = backend, records, args, ivsb_layer
        self.cache: dict[int, Example] = {}
        self.budget, self.used = args.feature_cache_mb * 2**20, 0

    def __getitem__(self, i: int) -> Example:
        if i in self.cache:
            return self.cache[i]
        ex = extract(self.backend, self.records[i], self.args, self.ivsb_layer)
        if self.used + ex.nbytes() <= self.budget:
            self.cache[i] = ex
            self.used += ex.nbytes()
        return ex


# ---- batches and masks ----------------------------------------------------------------------------

@dataclass
class Batch:
    tokens: torch.Tensor  # [B, T]
    prev: torch.Tensor  # [B, T, hidden]
    target_h: torch.Tensor  # [B, T, hidden]
    loss_mask: torch.Tensor  # [B, T] bool: position predicts an answer token
    chain_start: torch.Tensor  # [B] loss_from: pass k trains positions t >= loss_from + k
    labels: torch.Tensor  # [B, T] the next text token
    visual: torch.Tensor  # [B, P, hidden] (P = 0 without IVSB)
    visual_pos: torch.Tensor  # [B, P]
    visual_valid: torch.Tensor  # [B, P] bool (False for padding and dropped prefixes)


def collate(examples: list[Example], drop: list[bool], device) -> Batch:
    b, t = len(examples), max(e.tokens.numel() for e in examples)
    hidden = examples[0].prev.shape[-1]
    p = max((e.visual.shape[0] for e in examples if e.visual is not None), default=0)
    out = Batch(torch.zeros(b, t, dtype=torch.long), torch.zeros(b, t, hidden), torch.zeros(b, t, hidden),
                torch.zeros(b, t, dtype=torch.bool), torch.tensor([e.loss_from for e in examples]),
                torch.zeros(b, t, dtype=torch.long), torch.zeros(b, p, hidden), torch.zeros(b, p, dtype=torch.long),
                torch.zeros(b, p, dtype=torch.bool))
    for i, e in enumerate(examples):
        n = e.tokens.numel()
        out.tokens[i, :n], out.prev[i, :n], out.target_h[i, :n] = e.tokens, e.prev, e.target_h
        out.labels[i, : n - 1] = e.tokens[1:]
        out.loss_mask[i, e.loss_from: n - 1] = True
        if e.visual is not None and p:
            v = e.visual.shape[0]
            out.visual[i, :v], out.visual_pos[i, :v] = e.visual, e.visual_pos
            out.visual_valid[i, :v] = not drop[i]
    return Batch(**{k: v.to(device) for k, v in vars(out).items()})


def pass_mask(batch: Batch, k: int, dtype) -> torch.Tensor:
    """[B, 1, T, P + (k+1) T] additive mask for the text queries of MTP pass k.

    Keys: the visual prefix, then passes 0..k. Text query t sees visual j if j comes before it,
    pass-0 keys up to t - k, and the pass-j key at t - k + j (j = 1..k): its draft chain.
    """
    b, t = batch.tokens.shape
    q = torch.arange(t, device=batch.tokens.device)
    vis = batch.visual_valid[:, None, :] & (q[None, :, None] >= batch.visual_pos[:, None, :])  # [B, T, P]
    parts = [vis, (q[None, :] <= q[:, None] - k).expand(b, t, t)]
    for j in range(1, k + 1):
        parts.append((q[None, :] == q[:, None] - k + j).expand(b, t, t))
    visible = torch.cat(parts, dim=-1)
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(
        ~visible, torch.finfo(dtype).min)[:, None]


def prefix_mask(batch: Batch, dtype) -> torch.Tensor:
    """[B, 1, P + T, P + T] mask of pass 0 with the prefix: prefix rows see only themselves."""
    b, p = batch.visual.shape[:2]
    text = pass_mask(batch, 0, dtype)  # [B, 1, T, P + T]
    eye = torch.eye(p, text.shape[-1], dtype=torch.bool, device=text.device)
    prefix = torch.zeros(eye.shape, dtype=dtype, device=text.device).masked_fill(~eye, torch.finfo(dtype).min)
    return torch.cat([prefix.expand(b, 1, -1, -1), text], dim=2)


# ---- the training step --------------------------------------------------------------------------

def head_passes(head: SparrowHead, embed, batch: Batch, mtp_steps: int) -> list[torch.Tensor]:
    """The head's outputs [B, T, hidden] for pass 0 (target h) and each MTP pass (its own h)."""
    b, t = batch.tokens.shape
    dtype = head.fc.weight.dtype
    emb = embed(batch.tokens).to(dtype).detach()
    positions = torch.arange(t, device=emb.device)[None].expand(b, t)
    cache = DynamicCache(config=head.config)
    x = head.project(emb, batch.prev.to(dtype))
    p = batch.visual.shape[1]
    if p:
        x = torch.cat([batch.visual.to(dtype), x], dim=1)
        out = head(x, torch.cat([batch.visual_pos, positions], 1), prefix_mask(batch, dtype), cache)[:, p:]
    else:
        out = head(x, positions, pass_mask(batch, 0, dtype), cache)
    outs = [out]
    for k in range(1, mtp_steps + 1):
        prev = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)
        out = head(head.project(emb, prev), positions, pass_mask(batch, k, dtype), cache)
        outs.append(out)
    return outs


def losses(outs: list[torch.Tensor], batch: Batch, lm_head, args) -> tuple[torch.Tensor, dict]:
    """Weighted CE + smooth-L1 over the passes; returns (loss, per-pass metrics)."""
    total, weights, metrics = 0.0, 0.0, {}
    steps = torch.arange(batch.tokens.shape[1], device=batch.tokens.device)[None]
    lm_dtype = lm_head.weight.dtype
    for k, out in enumerate(outs):
        sel = batch.loss_mask & (steps >= batch.chain_start[:, None] + k)
        if not sel.any():
            continue
        logits = lm_head(out[sel].to(lm_dtype)).float()
        ce = F.cross_entropy(logits, batch.labels[sel])
        reg = F.smooth_l1_loss(out[sel].float(), batch.target_h[sel].float())
        w = args.mtp_decay ** k
        total, weights = total + w * (ce + args.reg_weight * reg), weights + w
        metrics[f"ce{k}"], metrics[f"reg{k}"] = ce.item(), reg.item()
        metrics[f"acc{k}"] = (logits.argmax(-1) == batch.labels[sel]).float().mean().item()
    return total / max(weights, 1e-9), metrics


def lr_at(step: int, args) -> float:
    """Linear warm-up, then cosine decay to 5% of the peak."""
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    frac = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))


def batch_indices(step: int, micro: int, args, n: int) -> list[int]:
    """Example indices of one micro-batch: epochs are seeded permutations, so a resume is exact."""
    start = (step * args.grad_accum + micro) * args.batch_size
    out = []
    for g in range(start, start + args.batch_size):
        perm = np.random.default_rng(args.seed + g // n).permutation(n)
        out.append(int(perm[g % n]))
    return out


def train_step(head, backend, store: FeatureStore, opt, step: int, args) -> dict:
    """One optimiser step over grad_accum micro-batches; returns averaged metrics."""
    for g in opt.param_groups:
        g["lr"] = lr_at(step, args)
    opt.zero_grad(set_to_none=True)
    sums: dict = {}
    rng = np.random.default_rng(args.seed * 7919 + step)
    for micro in range(args.grad_accum):
        examples = [store[i] for i in batch_indices(step, micro, args, len(store.records))]
        drop = list(rng.random(len(examples)) < args.ivsb_drop)
        batch = collate(examples, drop, backend.device)
        outs = head_passes(head, backend.model.get_input_embeddings(), batch, args.mtp_steps)
        loss, metrics = losses(outs, batch, backend.model.lm_head, args)
        (loss / args.grad_accum).backward()
        for k, v in {"loss": loss.item(), **metrics}.items():
            sums[k] = sums.get(k, 0.0) + v / args.grad_accum
    torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
    opt.step()
    return sums


# ---- the command ----------------------------------------------------------------------------------

def _resume(path: Path, head, opt, args) -> int:
    """Load the state saved in --work; ValueError if it was made with other settings."""
    state = torch.load(path, weights_only=False, map_location="cpu")
    saved = state.get("settings", {})
    differ = [f"{k}={saved[k]!r} (now {getattr(args, k)!r})" for k in RESUME_KEYS
              if k in saved and saved[k] != getattr(args, k)]
    if differ:
        raise ValueError(f"the training state in {path.parent} was made with {', '.join(differ)}; pass --restart "
                         "to start over, or another --work")
    head.load_state_dict(state["head"])
    opt.load_state_dict(state["opt"])
    return int(state["step"])


def _save_state(path: Path, head, opt, step: int, args) -> None:
    settings = {k: getattr(args, k) for k in RESUME_KEYS}
    save_atomic({"head": head.state_dict(), "opt": opt.state_dict(), "step": step, "settings": settings}, path)


def start_step(ckpt: Path, head, opt, args) -> int:
    """Where training starts: the saved state's step (automatic resume) unless --restart."""
    if args.restart or not ckpt.exists():
        if args.resume and not args.restart:
            raise ValueError(f"--resume: no training state in {ckpt.parent} (it is made every --ckpt-every steps)")
        return 0
    return _resume(ckpt, head, opt, args)


def setup(args) -> tuple[Backend, SparrowHead, int | None]:
    """Load the target (frozen) and a fresh head in fp32 on the target's device."""
    from ..backends.loading import load_backend

    backend = load_backend(args.target, device=args.device, dtype=args.dtype,
                           attn_implementation=args.attn_implementation, min_pixels=args.min_pixels,
                           max_pixels=args.max_pixels, video_rule=args.video_rule)
    backend.model.requires_grad_(False)
    attach_frame_plan(args, backend)
    ivsb_layer = None if args.no_ivsb else (args.ivsb_layer or backend.num_layers // 2)
    if ivsb_layer is not None and not 1 <= ivsb_layer <= backend.num_layers:
        raise ValueError(f"--ivsb-layer {ivsb_layer} is outside the target's layers 1..{backend.num_layers}")
    torch.manual_seed(args.seed)
    head = SparrowHead.for_target(backend).to(backend.device)
    head.meta = {"target": args.target, "ivsb_layer": ivsb_layer, "ivsb_drop": args.ivsb_drop,
                 "mtp_steps": args.mtp_steps, "num_captions": args.num_captions, "num_mcq": args.num_mcq}
    if args.videos:  # the model_args under which `--model lvspec` sees what the head was trained on
        head.meta = {**{k: v for k, v in head.meta.items() if not k.startswith("num_")},
                     "videos": str(args.videos), "prompts_per_video": args.prompts_per_video,
                     "video_rule": args.video_rule, "fps": args.fps, "max_frames": args.frames,
                     "min_pixels": args.min_pixels, "max_pixels": args.max_pixels, "frames": args.frame_plan.describe}
    return backend, head, ivsb_layer


def train(args) -> Path:
    resolve_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    t_start = time.time()
    work, out = Path(args.work), Path(args.out)
    work.mkdir(parents=True, exist_ok=True)
    Path(args.data).parent.mkdir(parents=True, exist_ok=True)
    backend, head, ivsb_layer = setup(args)
    records = generate_data(backend, args, Path(args.data))
    args.num_examples = len(records)  # batches are permutations of them: a resume needs the same ones
    store = FeatureStore(backend, records, args, ivsb_layer)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    ckpt, log_path = work / "sparrow.ckpt", work / "train_sparrow.log"
    start = start_step(ckpt, head, opt, args)
    settings = {k: v for k, v in vars(args).items() if isinstance(v, (str, int, float, bool, type(None)))}
    log_jsonl(log_path, {"event": "start", "step": start, "args": settings, "examples": len(records), "time": time.time()})
    done = run_steps(head, backend, store, opt, start, args, ckpt, log_path, t_start)
    head.eval()
    head.meta["steps_done"] = done
    head.save(out)
    log_jsonl(log_path, {"event": "saved", "out": str(out), "step": done, "elapsed_s": time.time() - t_start})
    return out


def run_steps(head, backend, store, opt, start: int, args, ckpt: Path, log_path: Path, t_start: float) -> int:
    """Steps start..--steps (or until --max-minutes); the state is saved every --ckpt-every steps,
    at the end and on Ctrl-C. Returns the number of steps done."""
    head.train()
    done = start
    bar = tqdm(range(start, args.steps), initial=start, total=args.steps, desc="sparrow", mininterval=5)
    try:
        for step in bar:
            metrics = train_step(head, backend, store, opt, step, args)
            done = step + 1
            if step % args.log_every == 0 or done == args.steps:
                bar.set_postfix(loss=f"{metrics['loss']:.3f}", acc0=f"{metrics.get('acc0', 0):.3f}")
                log_jsonl(log_path, {"step": step, **metrics, "lr": lr_at(step, args), "elapsed_s": time.time() - t_start})
            out_of_time = args.max_minutes and time.time() - t_start > 60 * args.max_minutes
            if done % args.ckpt_every == 0 or done == args.steps or out_of_time:
                _save_state(ckpt, head, opt, done, args)
            if out_of_time:
                log_jsonl(log_path, {"event": "time limit", "step": done, "elapsed_s": time.time() - t_start})
                break
    except KeyboardInterrupt:
        _save_state(ckpt, head, opt, done, args)
        log_jsonl(log_path, {"event": "interrupted", "step": done, "elapsed_s": time.time() - t_start})
        print(f"\ninterrupted: state saved at step {done} in {ckpt.parent}; run the same command again to resume")
        raise
    return done


def source_defaults(args) -> dict:
    """Defaults that depend on the data source. With --videos they are `--model lvspec`'s
    (ModelArgs.fill_defaults: rule `fps` for the demo, `lmms_eval` with its own frame count for a
    real checkpoint), so the head trains on the inputs it will draft for."""
    from ..backends.loading import DEMO_NAMES
    from ..models.args import DEFAULT_FPS, DEFAULT_MAX_FRAMES

    if not args.videos:  # the demo world's rendered scenes (the target's own pixel limits)
        return {"video_rule": "fps", "frames": 8, "max_new_tokens": 96}
    rule = args.video_rule or ("fps" if args.target in DEMO_NAMES else "lmms_eval")
    frames = {"fps": DEFAULT_FPS, "frames": DEFAULT_MAX_FRAMES} if rule == "fps" else {}
    return {"video_rule": rule, **frames, "max_new_tokens": 256}


def resolve_args(args) -> None:
    """Fill the defaults that depend on --videos and --out, then check every value."""
    for name, value in source_defaults(args).items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.out is None:
        if args.videos or args.target != "demo":
            raise ValueError("--out is required when training for another target or on --videos (the default "
                             "is the shipped demo head)")
        args.out = str(DEMO_HEAD)
    if args.work is None:  # with --videos, beside the head, so rerunning the command resumes
        args.work = str(Path(args.out) / "train") if args.videos else str(Path(".cache/sparrow") / Path(args.out).name)
    if args.data is None:
        args.data = str(default_data_path(args))
    check_args(args)


def weights_fingerprint(target: str) -> str:
    """8 hex digits naming the weight files of a local target folder as they are now (names, sizes,
    modification times), so that answers cached for a target are not reused once its weights
    change (a fine-tuned demo target in the same folder); '' for a hub id (its name is the key)."""
    from ..backends.loading import resolve_path

    folder = Path(resolve_path(target))
    if not folder.is_dir():
        return ""
    files = sorted(f for f in folder.iterdir() if f.suffix in (".safetensors", ".bin", ".pt"))
    stamp = "|".join(f"{f.name}:{f.stat().st_size}:{f.stat().st_mtime_ns}" for f in files)
    return hashlib.sha1(stamp.encode()).hexdigest()[:8]


def default_data_path(args) -> Path:
    """The target's answers: one file per target (and state of its weights) and sampling setting."""
    tag = "demo" if args.target == "demo" else Path(args.target).name
    tag = "_".join(filter(None, (tag, weights_fingerprint(args.target))))
    if args.videos:
        pixels = f"_px{args.min_pixels}-{args.max_pixels}" if args.min_pixels or args.max_pixels else ""
        return Path(args.work) / (f"answers_{tag}_{args.video_rule}_f{args.frames}_fps{args.fps}{pixels}"
                                  f"_m{args.max_new_tokens}.jsonl")
    return Path(".cache/sparrow") / f"data_{tag}_f{args.frames}_s{args.size}_o{args.seed_offset}_m{args.max_new_tokens}.jsonl"


def check_args(args) -> None:
    """Reject values that would only fail (or silently do nothing) later."""
    for name in ("steps", "batch_size", "grad_accum", "frames", "size", "max_new_tokens", "gen_batch", "ckpt_every",
                 "log_every"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    if args.mtp_steps < 0:
        raise ValueError(f"--mtp-steps must be >= 0, got {args.mtp_steps}")
    if not 0.0 <= args.ivsb_drop <= 1.0:
        raise ValueError(f"--ivsb-drop is a share of examples in [0, 1], got {args.ivsb_drop}")
    if args.videos:
        if not 1 <= args.prompts_per_video <= len(VIDEO_PROMPTS):
            raise ValueError(f"--prompts-per-video must be in 1..{len(VIDEO_PROMPTS)}, got {args.prompts_per_video}")
        if args.fps is not None and args.fps <= 0:
            raise ValueError(f"--fps must be positive, got {args.fps}")
    elif args.num_captions + args.num_mcq < 1:
        raise ValueError("--num-captions + --num-mcq must be at least 1")
    if args.resume and args.restart:
        raise ValueError("--resume and --restart contradict each other; pass one")


def _run(args: argparse.Namespace) -> int:
    out = train(args)
    print(f"Sparrow head saved to {out}; log in {Path(args.work) / 'train_sparrow.log'}")
    if args.videos:
        same = ",".join(f"{k}={v}" for k, v in (("video_rule", args.video_rule), ("fps", args.fps),
                                                 ("max_frames", args.frames), ("min_pixels", args.min_pixels),
                                                 ("max_pixels", args.max_pixels)) if v is not None)
        print(f"Use it with --model_args pretrained={args.target},method=sparrow,sparrow_head={out},{same}; "
              f"{args.work} (answers, optimiser state) can be deleted once training is done")
    return 0


def register(sub) -> None:
    from ..backends.frame_rules import VIDEO_RULES
    from ..models.args import ATTN_IMPLEMENTATIONS

    p = sub.add_parser("train-sparrow", help="train a Sparrow draft head for a target, on the demo world or on a "
                       "folder of your videos (demo: ~10 min on 2 CPU cores)")
    p.add_argument("--target", default="demo", help="target: local folder, hub id, or `demo`")
    p.add_argument("--videos", default=None, help="folder of your own videos (searched recursively; mp4, mkv, "
                   "webm, avi, mov, ...): train on the target's answers about them instead of the demo world")
    p.add_argument("--prompts-per-video", type=int, default=len(VIDEO_PROMPTS),
                   help=f"with --videos: ask each video the first N of the {len(VIDEO_PROMPTS)} fixed prompts")
    p.add_argument("--out", default=None, help="where the head goes (default: the demo's; required otherwise)")
    p.add_argument("--work", default=None, help="log + resumable state (default: <out>/train with --videos, "
                   "else .cache/sparrow/<out name>)")
    p.add_argument("--data", default=None, help="JSONL cache of the target's answers (default: in --work with "
                   "--videos, else under .cache/sparrow)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32", help="the target's dtype; the head trains in fp32")
    p.add_argument("--attn-implementation", default="sdpa", choices=ATTN_IMPLEMENTATIONS)
    p.add_argument("--min-pixels", type=int, default=None, help="per-frame pixel budget (Qwen2.5-VL), as the "
                   "model_arg of the same name; use the values you evaluate with")
    p.add_argument("--max-pixels", type=int, default=None)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--resume", action="store_true", help="require a state to continue from (a rerun resumes from "
                   "--work by itself when one is there)")
    p.add_argument("--restart", action="store_true", help="ignore the state in --work and start over")
    p.add_argument("--no-ivsb", action="store_true", help="train without the visual prefix (ablation)")
    p.add_argument("--ivsb-layer", type=int, default=None, help="target layer (1-based) whose visual hidden "
                   "states form the prefix (default: half the target's depth)")
    p.add_argument("--ivsb-drop", type=float, default=0.5, help="share of examples trained without the prefix")
    p.add_argument("--mtp-steps", type=int, default=2, help="extra passes on the head's own hidden states")
    p.add_argument("--mtp-decay", type=float, default=0.8, help="loss weight of pass k is decay**k")
    p.add_argument("--reg-weight", type=float, default=1.0, help="weight of the smooth-L1 hidden-state loss")
    p.add_argument("--num-captions", type=int, default=800, help="demo: caption examples (scenes) to generate")
    p.add_argument("--num-mcq", type=int, default=150, help="demo: multiple-choice examples to generate")
    p.add_argument("--seed-offset", type=int, default=300_000, help="demo: first training-split scene seed used")
    p.add_argument("--video-rule", default=None, choices=VIDEO_RULES, help="--videos: how frames are taken "
                   "and sized, as the model_arg video_rule (default: `--model lvspec`'s for this target)")
    p.add_argument("--frames", type=int, default=None, help="demo: frames per scene (8); --videos: max_frames, "
                   "as the model_arg (default: the video rule's)")
    p.add_argument("--fps", type=float, default=None, help="--videos: as the model_arg fps (default: the "
                   "video rule's)")
    p.add_argument("--size", type=int, default=112, help="demo: frame side in pixels")
    p.add_argument("--max-new-tokens", type=int, default=None, help="answer length limit (demo 96, --videos 256)")
    p.add_argument("--gen-batch", type=int, default=32, help="answers generated per batched `generate` call "
                   "(1: one by one through the decoding loop)")
    p.add_argument("--steps", type=int, default=900, help="optimiser steps")
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--max-minutes", type=float, default=None, help="stop (and save) after this wall time")
    p.add_argument("--feature-cache-mb", type=int, default=2048, help="memory for the target's features")
    p.add_argument("--log-every", type=int, default=10)
    p.add_argument("--ckpt-every", type=int, default=100, help="save the resumable state every N steps")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_run)
