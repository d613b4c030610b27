"""`lvspec-eval bench`: methods side by side on the same samples, in one process, interleaved.

Speedups are ratios to vanilla measured in this run on these samples, never against a number
from another run. For each sample the methods run back to back (in rotating order, after one
untimed warm-up sample), so drift of a shared machine hits all of them alike. Headline speedups
are medians over samples of the per-sample ratio of per-token decode times.

The samples come straight from the demo world (scenes of the task's test seeds, rendered at the
task's length): the same scenes the synthvid tasks use, without the mp4 round trip, so only
decoding is timed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from judges.oracle import correct_facts, score_caption

from .backends.loading import load_backend
from .demo import data, models, world
from .runner import Runner, VideoInput

TASKS = {  # name -> (kind, frames)
    "synthvid_caption": ("caption", models.FRAMES),
    "synthvid_mcq": ("mcq", models.FRAMES),
    "synthvid_caption_long": ("caption", models.LONG_FRAMES),
}


def make_samples(task: str, limit: int, frames: int | None = None) -> list[dict]:
    if task not in TASKS:
        raise ValueError(f"unknown bench task {task!r}; expected one of {', '.join(TASKS)}")
    kind, num_frames = TASKS[task]
    num_frames = frames or num_frames
    out = []
    for k in range(limit):
        scene = world.make_scene(data.TEST_SEED + k)
        video = VideoInput(world.render(scene, num_frames, models.FRAME_SIZE, models.FRAME_SIZE), models.FPS)
        if kind == "caption":
            out.append({"id": k, "scene": scene, "prompt": world.CAPTION_PROMPT, "video": video, "answer": None})
        else:
            q = world.make_questions(scene)[k % len(world.make_questions(scene))]
            out.append({"id": k, "scene": scene, "prompt": world.format_mcq(q), "video": video, "answer": q["answer"]})
    return out


def quality(sample: dict, text: str) -> float:
    """The task's own metric on one sample: oracle caption F1, or MC correctness."""
    if sample["answer"] is None:
        return score_caption(text, sample["scene"])["f1"]
    letter = next((c for c in text.strip() if c in world.LETTERS), "")
    return float(letter == sample["answer"])


def fact_errors(samples: list[dict], recs: list[dict], base: list[dict]) -> tuple[int, int]:
    """(facts vanilla had right that these records have wrong, facts vanilla had right): caption
    facts (judges.oracle.correct_facts) and MC answers, over the samples both ran without error."""
    lost = right = 0
    for s, r, b in zip(samples, recs, base):
        if r.get("error") or b.get("error"):
            continue
        if s["answer"] is None:
            vanilla = correct_facts(b["text"], s["scene"])
            lost += len(vanilla - correct_facts(r["text"], s["scene"]))
            right += len(vanilla)
        else:
            lost += int(b["quality"] > r["quality"])
            right += int(b["quality"] > 0)
    return lost, right


def _median_ratio(base: list[dict], other: list[dict], key: str) -> float:
    ratios = [b[key] / o[key] for b, o in zip(base, other) if b[key] > 0 and o[key] > 0]
    return statistics.median(ratios) if ratios else 0.0


def summarise(method: str, recs: list[dict], base: list[dict], samples: list[dict]) -> dict:
    """One method's figures; `base` is vanilla's records on the same `samples`."""
    per_tok = [{"d": r["decode_s"] / max(1, r["num_new_tokens"]), "e": r["e2e_s"] / max(1, r["num_new_tokens"])}
               for r in recs]
    base_tok = [{"d": r["decode_s"] / max(1, r["num_new_tokens"]), "e": r["e2e_s"] / max(1, r["num_new_tokens"])}
                for r in base]
    steps = sum(r["num_steps"] for r in recs)
    q = statistics.fmean(r["quality"] for r in recs)
    qv = statistics.fmean(r["quality"] for r in base)
    lost, right = fact_errors(samples, recs, base)
    return {
        "tau": sum(sum(r["accepted_lengths"]) for r in recs) / max(1, steps),
        "tokens_per_step": 1 + sum(sum(r["accepted_lengths"]) for r in recs) / max(1, steps),
        "decode_tokens_per_s": sum(r["num_new_tokens"] for r in recs) / sum(r["decode_s"] for r in recs),
        "decode_speedup": _median_ratio(base_tok, per_tok, "d"),
        "e2e_speedup": _median_ratio(base_tok, per_tok, "e"),
        "decode_speedup_total": (sum(b["d"] for b in base_tok) / sum(p["d"] for p in per_tok)),
        "exact_match_rate": statistics.fmean(float(r["tokens"] == b["tokens"]) for r, b in zip(recs, base)),
        "draft_step_ms": 1000 * sum(r["draft_s"] for r in recs) / max(1, steps),
        "verify_step_ms": 1000 * sum(r["verify_s"] for r in recs) / max(1, steps),
        "mean_draft_nodes": sum(sum(r["num_draft_nodes"]) for r in recs) / max(1, steps),
        "prefill_ms": 1000 * statistics.fmean(r["prefill_s"] for r in recs),
        "prune_ms": 1000 * statistics.fmean(r["prune_s"] for r in recs),
        "draft_prefill_ms": 1000 * statistics.fmean(r["draft_prefill_s"] for r in recs),
        "visual_tokens": statistics.fmean(r["visual_tokens"] for r in recs),
        "kept_visual_tokens": statistics.fmean(r["kept_visual_tokens"] for r in recs),
        "quality": q,
        "retention": q / qv if qv else None,
        "facts_lost": lost,  # visual-fact errors introduced: facts (or MC answers) vanilla had right
        "fact_error_rate": lost / right if right else None,
        "n": len(recs),
        "failed": sum(1 for r in recs if r.get("error")),
    }


def run_methods(runners: dict[str, Runner], samples: list[dict], max_new_tokens: int) -> dict[str, list[dict]]:
    names = list(runners)
    first = samples[0]
    for r in runners.values():  # warm-up, untimed
        r.generate(first["prompt"], [first["video"]], min(8, max_new_tokens))
    records: dict[str, list[dict]] = {n: [] for n in names}
    for i, s in enumerate(tqdm(samples, desc="bench", unit="sample")):
        for name in names[i % len(names):] + names[: i % len(names)]:
            gen = runners[name].generate(s["prompt"], [s["video"]], max_new_tokens)
            rec = dict(gen.stats, quality=quality(s, gen.text), text=gen.text, sample=s["id"])
            records[name].append(rec)
    return records


def _timed_hf_generate(be, sample: dict, max_new_tokens: int) -> tuple[float, int]:
    """(seconds, tokens before EOS) of transformers' greedy generate() from prepared inputs."""
    inputs = be.prepare(sample["prompt"], [(sample["video"].frames, sample["video"].fps)])
    ids = inputs.input_ids
    extra = {"mm_token_type_ids": (ids == be.model.config.video_token_id).int() * 2} \
        if hasattr(be.model.config, "video_token_id") and "second_per_grid_ts" in inputs.model_kwargs else {}
    t0 = time.perf_counter()
    out = be.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                            max_new_tokens=max_new_tokens, **inputs.model_kwargs, **extra)
    seconds, new = time.perf_counter() - t0, out[0, ids.shape[1]:].tolist()
    # tokens before EOS, as our loop counts them (both spent a forward on the EOS itself)
    return seconds, next((k for k, t in enumerate(new) if t in be.eos_token_ids), len(new))


def _timed_loop(runner: Runner, sample: dict, max_new_tokens: int) -> tuple[float, int]:
    """(seconds end to end, tokens before EOS) of our vanilla loop."""
    st = runner.generate(sample["prompt"], [sample["video"]], max_new_tokens).stats
    return st["e2e_s"], st["num_new_tokens"]


def hf_generate_baseline(runner: Runner, samples: list[dict], max_new_tokens: int) -> dict:
    """transformers' own generate() (greedy) against our vanilla loop, on the same inputs.

    Per sample, both run back to back (their order alternating), each timed end to end (prefill
    included, as generate() cannot time its decode alone), so that the two see the same machine
    state; ours also counts the video preprocessing that generate() is spared (its inputs are
    prepared before the clock starts). Returns both rates and their ratio.
    """
    totals = {"hf": [0.0, 0], "ours": [0.0, 0]}  # seconds, tokens
    timers = {"hf": lambda s: _timed_hf_generate(runner.target, s, max_new_tokens),
              "ours": lambda s: _timed_loop(runner, s, max_new_tokens)}
    for i, sample in enumerate(samples):
        for name in (("hf", "ours") if i % 2 else ("ours", "hf")):
            seconds, n = timers[name](sample)
            totals[name][0] += seconds
            totals[name][1] += n
    (hf_s, hf_n), (ours_s, ours_n) = totals["hf"], totals["ours"]
    return {"tokens_per_s": hf_n / hf_s, "seconds": hf_s, "tokens": hf_n,
            "ours_tokens_per_s": ours_n / ours_s, "ours_seconds": ours_s, "ours_tokens": ours_n,
            "ratio": (ours_n / ours_s) / (hf_n / hf_s)}


def environment(device: torch.device) -> dict:
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": str(device),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "python": platform.python_version()}


def _typed(value: str):
    for cast in (int, float):
        try:
            return cast(value)
        except ValueError:
            pass
    return value


def _parse_kv(text: str) -> dict:
    out = {}
    for item in filter(None, (text or "").split(",")):
        if "=" not in item:
            raise ValueError(f"--options entries must be key=value, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = _typed(v.strip())
    return out


def run(args: argparse.Namespace) -> dict:
    if args.cost_model:
        from . import cost_model

        return cost_model.run(args)
    torch.set_num_threads(args.threads)
    load = dict(device=args.device, dtype=args.dtype)
    target = load_backend(args.model, **load)
    draft = load_backend(args.draft, **load) if args.draft not in (None, "self") else None
    options = _parse_kv(args.options)
    runners = {m: Runner(args.model, method=m, draft=args.draft, options=options, target_backend=target,
                         draft_backend=draft, **load) for m in args.methods.split(",")}
    if "vanilla" not in runners:
        runners = {"vanilla": Runner(args.model, "vanilla", target_backend=target, **load), **runners}
    samples = make_samples(args.task, args.limit, args.frames)
    records = run_methods(runners, samples, args.max_new_tokens)
    result = {"task": args.task, "limit": args.limit, "max_new_tokens": args.max_new_tokens, "options": options,
              "frames": args.frames,
              "methods": {m: summarise(m, recs, records["vanilla"], samples) for m, recs in records.items()},
              "env": environment(target.device)}
    result["vanilla_step_ms"] = result["methods"]["vanilla"]["verify_step_ms"]
    if args.hf_baseline:
        hf = hf_generate_baseline(runners["vanilla"], samples, args.max_new_tokens)
        result["hf_generate"] = hf
        result["vanilla_vs_hf_generate"] = hf["ratio"]
    if args.records:
        Path(args.records).write_text("\n".join(json.dumps({"method": m, **r}, default=str)
                                                for m, recs in records.items() for r in recs) + "\n")
    return result


def format_table(result: dict) -> str:
    cols = ["tau", "tokens_per_step", "decode_speedup", "e2e_speedup", "decode_tokens_per_s", "draft_step_ms",
            "verify_step_ms", "quality", "retention", "facts_lost", "exact_match_rate", "kept_visual_tokens"]
    lines = ["| method | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for m, row in result["methods"].items():
        cells = [f"{row[c]:.3f}" if isinstance(row[c], float) else str(row[c]) for c in cols]
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    result = run(args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    if "methods" in result:
        print(format_table(result))
    if "vanilla_vs_hf_generate" in result:
        print(f"vanilla loop vs transformers generate(): {result['vanilla_vs_hf_generate']:.3f}x tokens/s")
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench", help="time methods against vanilla on the same samples in one process")
    p.add_argument("--model", default="demo", help="target: demo, a local folder or a hub id")
    p.add_argument("--draft", default="demo-draft", help="draft model, or 'self' for Self-SD")
    p.add_argument("--methods", default="vanilla,sd_tree,specvlm", help="comma-separated method names")
    p.add_argument("--task", default="synthvid_caption", help=f"one of {', '.join(TASKS)}")
    p.add_argument("--limit", type=int, default=10, help="number of samples")
    p.add_argument("--frames", type=int, default=None, help="override the task's frame count (video length)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--options", default="", help="decoding options as model_args, e.g. tree=static,tree_depth=4")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--hf-baseline", action="store_true", help="also time transformers' generate() (vanilla ratio)")
    p.add_argument("--records", default=None, help="write per-sample records (JSONL) here")
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.add_argument("--cost-model", action="store_true", help="real-size random-weight cost model (see cost_model.py)")
    try:
        from . import cost_model

        cost_model.add_arguments(p)
    except ImportError:
        pass
    p.set_defaults(func=_main)
