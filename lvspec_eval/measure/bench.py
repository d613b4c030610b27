"""`lvspec-eval bench`: methods side by side on the same samples, in one process, interleaved.

Speedups are ratios to vanilla measured in this run on these samples, never against a number
from another run. For each sample the methods run back to back (in rotating order, after one
untimed warm-up sample), so drift of a shared machine hits all of them alike. Headline speedups
are medians over samples of the per-sample ratio of per-token decode (end-to-end) times (the
project's one definition of speed, judges.stats.per_token_speedup), with a 95 % distribution-free
interval (e2e_speedup_ci; e2e_verdict says "no clear difference" when it holds 1.0, "too few
requests" under 6 samples); e2e_request_speedup and length_ratio (the method's tokens / vanilla's)
sit beside it for methods whose answers differ; e2e_speedup_total (decode_speedup_total) is the
summed figure the report and `check` give too: vanilla's summed seconds per summed generated token over
the method's (judges.stats.per_token_speedup, docs/TIMING.md), and
draft_prepare_ms / draft_prepared_share say what the draft's preparation cost per sample and on how
many samples the draft was prepared at all (draft_prepare=lazy skips it where drafting cannot pay).

The samples come straight from the demo world (scenes of the task's test seeds, rendered at the
task's length): the same scenes the synthvid tasks use, without the mp4 round trip, so only
decoding is timed. With `--prompts` they are text-only prompts instead (bench_prompts.py), for
pairs whose language models are real and whose vision towers are not; text samples have no
quality metric beyond exact match to vanilla.

`--hf-baseline` and `--hf-assisted` add transformers' own greedy `generate()` on the target and its
assisted generation (`assistant_model=` the draft) as two more entries of the same rotation:
same samples, same prepared inputs, back to back with our methods. The assistant is the draft our
methods run, in its precision (`--draft-dtype`; `--hf-assistant-dtype same`), so "ahead of
transformers" compares like with like; `--hf-assistant-dtype same,float32` adds a row with a float32
assistant beside it.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch
from tqdm import tqdm

from judges import stats as judge_stats
from judges.oracle import correct_facts, score_caption

from . import prompts as bench_prompts
from . import timing_checks
from ..backends import contention, draft_precision, linear_kernels
from ..backends.base import Backend
from ..backends.loading import load_backend, load_draft
from ..decoding import loop
from ..demo import data, models, world
from ..decoding.runner import Generation, Runner, VideoInput, paused_gc

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


def make_text_samples(source: str, limit: int) -> list[dict]:
    """Text-only samples from `--prompts` (`builtin` or a file): no video, no scene, no answer."""
    prompts = bench_prompts.load(source)[:limit]
    return [{"id": k, "scene": None, "prompt": p, "video": None, "answer": None} for k, p in enumerate(prompts)]


def _videos(sample: dict) -> list[VideoInput]:
    return [] if sample["video"] is None else [sample["video"]]


def quality(sample: dict, text: str) -> float | None:
    """The task's own metric on one sample: oracle caption F1, or MC correctness; None for a text
    prompt (no reference to score against)."""
    if sample["scene"] is None:
        return None
    if sample["answer"] is None:
        return score_caption(text, sample["scene"])["f1"]
    letter = next((c for c in text.strip() if c in world.LETTERS), "")
    return float(letter == sample["answer"])


def fact_errors(samples: list[dict], recs: list[dict], base: list[dict]) -> tuple[int, int]:
    """(facts vanilla had right that these records have wrong, facts vanilla had right): caption
    facts (judges.oracle.correct_facts) and MC answers, over the samples both ran without error."""
    lost = right = 0
    for s, r, b in zip(samples, recs, base):
        if r.get("error") or b.get("error") or s["scene"] is None:
            continue
        if s["answer"] is None:
            vanilla = correct_facts(b["text"], s["scene"])
            lost += len(vanilla - correct_facts(r["text"], s["scene"]))
            right += len(vanilla)
        else:
            lost += int(b["quality"] > r["quality"])
            right += int(b["quality"] > 0)
    return lost, right


def _per_token(recs: list[dict], *keys: str) -> list[dict]:
    """Seconds per generated token of each record: 'd' decode, 'e' end to end."""
    seconds = {"d": "decode_s", "e": "e2e_s"}
    return [{k: r[seconds[k]] / max(1, r["num_new_tokens"]) for k in keys} for r in recs]


def _median_ratio(base: list[dict], other: list[dict], key: str) -> float:
    ratios = [b[key] / o[key] for b, o in zip(base, other) if b[key] > 0 and o[key] > 0]
    return statistics.median(ratios) if ratios else 0.0


def _mean_quality(recs: list[dict]) -> float | None:
    """Mean of the task metric; None for text prompts, which have none."""
    values = [r["quality"] for r in recs if r["quality"] is not None]
    return statistics.fmean(values) if values else None


def _tokens_per_s(recs: list[dict]) -> float:
    """End-to-end rate over all samples: tokens before EOS / seconds from prompt to last token."""
    return sum(r["num_new_tokens"] for r in recs) / sum(r["e2e_s"] for r in recs)


def _speedups(base: list[dict], recs: list[dict]) -> dict:
    """Per figure (decode, e2e), as the report gives it (judges.stats.per_token_speedup): the median of
    per-sample ratios of per-token times, its order-statistic interval and verdict ("no clear
    difference" when the interval holds 1.0, "too few requests" without one), and the summed figure
    (<figure>_speedup_total: summed seconds per summed generated token, vanilla's over the method's)."""
    out = {}
    base_tokens, tokens = [b["num_new_tokens"] for b in base], [r["num_new_tokens"] for r in recs]
    for key, figure in (("decode_s", "decode"), ("e2e_s", "e2e")):
        s = judge_stats.per_token_speedup([b[key] for b in base], base_tokens, [r[key] for r in recs], tokens)
        out.update({f"{figure}_speedup": s.median if s.n else 0.0, f"{figure}_speedup_ci": [s.lo, s.hi],
                    f"{figure}_verdict": s.verdict, f"{figure}_speedup_total": s.total})
    return out


def _median_of(recs: list[dict], key: str) -> float | None:
    """The median of a per-request field over the records that have it (None: none has)."""
    values = [r[key] for r in recs if key in r]
    return statistics.median(values) if values else None


def summarise(method: str, recs: list[dict], base: list[dict], samples: list[dict]) -> dict:
    """One method's figures; `base` is vanilla's records on the same `samples`."""
    steps = sum(r["num_steps"] for r in recs)
    q, qv = _mean_quality(recs), _mean_quality(base)
    lost, right = fact_errors(samples, recs, base)
    return {
        "tau": sum(sum(r["accepted_lengths"]) for r in recs) / max(1, steps),
        "tokens_per_step": 1 + sum(sum(r["accepted_lengths"]) for r in recs) / max(1, steps),
        "decode_tokens_per_s": sum(r["num_new_tokens"] for r in recs) / sum(r["decode_s"] for r in recs),
        "e2e_tokens_per_s": _tokens_per_s(recs),
        **_speedups(base, recs),
        # beside the per-token figures: per request, whatever each answer's length, and the length ratio
        "e2e_request_speedup": judge_stats.speedup_interval([b["e2e_s"] for b in base], [r["e2e_s"] for r in recs]).median,
        "length_ratio": sum(r["num_new_tokens"] for r in recs) / max(1, sum(b["num_new_tokens"] for b in base)),
        "exact_match_rate": statistics.fmean(float(r["tokens"] == b["tokens"]) for r, b in zip(recs, base)),
        "draft_step_ms": 1000 * sum(r["draft_s"] for r in recs) / max(1, steps),
        "draft_ms_per_draft": 1000 * sum(r["drafted_draft_s"] for r in recs)
        / max(1, sum(1 for r in recs for n in r["num_draft_nodes"] if n)),  # steps that drafted only
        "verify_step_ms": 1000 * sum(r["verify_s"] for r in recs) / max(1, steps),
        # the engine's own cost per step (median over requests): host work outside the models' forwards,
        # and host synchronisations made by its code (decoding/host_sync.py)
        "host_step_ms": _median_of(recs, "overhead_step_ms"),
        "host_syncs_per_step": _median_of(recs, "host_syncs_per_step"),
        # the draft's bill: its share of the decode time (drafting, its catch-up forwards included)
        "draft_share": sum(r["draft_s"] for r in recs) / max(1e-12, sum(r["decode_s"] for r in recs)),
        "mean_draft_nodes": sum(sum(r["num_draft_nodes"]) for r in recs) / max(1, steps),
        "prefill_ms": 1000 * statistics.fmean(r["prefill_s"] for r in recs),
        "prune_ms": 1000 * statistics.fmean(r["prune_s"] for r in recs),
        "draft_prefill_ms": 1000 * statistics.fmean(r["draft_prefill_s"] for r in recs),
        "draft_vision_ms": 1000 * statistics.fmean(r.get("draft_vision_s", 0.0) for r in recs),
        # all draft-side preparation (pruning, the draft's vision tower, its prefill), per sample
        "draft_prepare_ms": 1000 * statistics.fmean(r.get("draft_prepare_s", 0.0) for r in recs),
        "draft_prepared_share": statistics.fmean(float(r.get("draft_prepared_at") is not None) for r in recs),
        "visual_tokens": statistics.fmean(r["visual_tokens"] for r in recs),
        "kept_visual_tokens": statistics.fmean(r["kept_visual_tokens"] for r in recs),
        "quality": q,
        "retention": q / qv if q is not None and qv else None,
        "facts_lost": lost,  # visual-fact errors introduced: facts (or MC answers) vanilla had right
        "fact_error_rate": lost / right if right else None,
        "n": len(recs),
        "failed": sum(1 for r in recs if r.get("error")),
    }


def run_methods(runners: dict, samples: list[dict], max_new_tokens: int, first_index: int = 0,
                on_sample=None) -> dict[str, list[dict]]:
    """Per sample, every runner back to back, the order rotating by one per sample.

    runners: name -> anything with Runner's `generate(prompt, videos, max_new_tokens)` (our
    methods, and HFGenerate for transformers' own). `first_index`: the first sample's place in the
    whole set (the rotation of a resumed run goes on where it stopped); `on_sample(records)`, where
    given, gets each sample's records (name -> record) as soon as its rows are done."""
    names = list(runners)
    first = samples[0]
    for r in runners.values():  # warm-up, untimed
        r.generate(first["prompt"], _videos(first), min(8, max_new_tokens))
    records: dict[str, list[dict]] = {n: [] for n in names}
    for i, s in enumerate(tqdm(samples, desc="bench", unit="sample"), start=first_index):
        done = {}
        for name in names[i % len(names):] + names[: i % len(names)]:
            gen = runners[name].generate(s["prompt"], _videos(s), max_new_tokens)
            done[name] = dict(gen.stats, quality=quality(s, gen.text), text=gen.text, sample=s["id"])
        for name in names:
            records[name].append(done[name])
        if on_sample is not None:
            on_sample(done)
    return records


HF_NAMES = ("hf_generate", "hf_assisted")  # --hf-baseline, --hf-assisted
# --hf-assisted-variants: transformers' own settings of its assistant (generation config keys read by
# its AssistedCandidateGenerator), one row hf_assisted:<name> each. heuristic: the draft length +2
# after a fully accepted step, -1 otherwise, kept across calls (transient: reset per call), from 5
# tokens as transformers 4 began; constant: 20 tokens, no confidence stop; confidence: 20 tokens,
# stopped where the assistant's probability falls below a threshold it tunes (from 0.4), transformers
# 5's defaults made explicit
HF_ASSISTED_VARIANTS = {
    "heuristic": {"num_assistant_tokens_schedule": "heuristic", "num_assistant_tokens": 5,
                  "assistant_confidence_threshold": 0.0},
    "heuristic_transient": {"num_assistant_tokens_schedule": "heuristic_transient", "num_assistant_tokens": 5,
                            "assistant_confidence_threshold": 0.0},
    "constant": {"num_assistant_tokens_schedule": "constant", "num_assistant_tokens": 20,
                 "assistant_confidence_threshold": 0.0},
    "confidence": {"num_assistant_tokens_schedule": "constant", "num_assistant_tokens": 20,
                   "assistant_confidence_threshold": 0.4},
}


class HFGenerate:
    """transformers' own greedy `generate()` on the target, or its assisted generation when an
    assistant (the draft's backend) is given: the one difference is `assistant_model=`.

    Timed like our methods end to end: the clock covers the target backend's `prepare()` (chat
    template, tokenising, video preprocessing: what our loop's e2e time covers too), then
    `generate()` on exactly those inputs (input_ids and the visual inputs). generate() cannot time
    its decode alone, so only end-to-end rates compare.
    """

    def __init__(self, target: Backend, assistant: Backend | None = None, settings: dict | None = None):
        self.target, self.assistant = target, assistant
        # the assistant's generation-config settings this row runs with (HF_ASSISTED_VARIANTS; None:
        # as the assistant's config has them); what transformers updates in them between calls (a
        # heuristic's draft length, a tuned threshold) stays this row's, not the shared draft's
        self.settings = None if settings is None else dict(settings)

    @torch.no_grad()
    def generate(self, prompt: str, videos: list[VideoInput], max_new_tokens: int) -> Generation:
        # as our methods' requests are timed (runner.paused_gc); transformers' own kernels throughout
        # (a reused draft's layers otherwise take our measured one-row kernels)
        with paused_gc(), linear_kernels.disabled(), self._assistant_settings():
            return self._generate(prompt, videos, max_new_tokens)

    @contextlib.contextmanager
    def _assistant_settings(self):
        """The row's settings in the shared assistant's generation config for one call, then the
        config as it was (what the call changed in them kept for the row's next call)."""
        if self.settings is None or self.assistant is None:
            yield
            return
        config = self.assistant.model.generation_config
        saved = {k: getattr(config, k, None) for k in self.settings}
        try:
            for k, v in self.settings.items():
                setattr(config, k, v)
            yield
        finally:
            self.settings = {k: getattr(config, k, None) for k in self.settings}
            for k, v in saved.items():
                setattr(config, k, v)

    def _generate(self, prompt: str, videos: list[VideoInput], max_new_tokens: int) -> Generation:
        be = self.target
        clock = loop.make_clock(be.device)
        t0 = clock()
        inputs = be.prepare(prompt, [(v.frames, v.fps) for v in videos])
        ids = inputs.input_ids
        kwargs = {**inputs.model_kwargs, **hf_visual_kwargs(be, inputs)}
        if self.assistant is not None:
            kwargs["assistant_model"] = self.assistant.model
        # plain greedy, as our loop decodes: a checkpoint's sampling or repetition-penalty defaults
        # (generation_config.json) would change the tokens
        out = be.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                repetition_penalty=1.0, max_new_tokens=max_new_tokens,
                                eos_token_id=sorted(be.eos_token_ids), **kwargs)
        seconds = clock() - t0
        new = out[0, ids.shape[1]:].tolist()
        # tokens before EOS, as our loop counts them (both spent a forward on the EOS itself)
        n = next((k for k, t in enumerate(new) if t in be.eos_token_ids), len(new))
        record = {"e2e_s": seconds, "num_new_tokens": n, "tokens": new[:n]}
        return Generation(be.tokenizer.decode(new[:n], skip_special_tokens=True), new[:n], record)


def hf_visual_kwargs(backend: Backend, inputs) -> dict:
    """What transformers' Qwen2.5-VL generate() needs beside prepare()'s visual inputs: which
    tokens are video (mm_token_type_ids, 2 = video); without it the model silently falls back to
    1-D positions (DESIGN.md). Other families and text-only prompts need nothing more."""
    if "second_per_grid_ts" not in inputs.model_kwargs:
        return {}
    return {"mm_token_type_ids": (inputs.input_ids == backend.model.config.video_token_id).int() * 2}


def summarise_hf(recs: list[dict], records: dict[str, list[dict]], ours: list[str]) -> dict:
    """One transformers baseline beside our methods on the same samples: its end-to-end rate,
    whether it said what vanilla said, and each of our methods' rate over its rate (>1: ours is
    faster), as a ratio of totals and as the median of per-sample ratios."""
    hf_rate = _tokens_per_s(recs)
    per_tok = _per_token(recs, "e")
    return {
        "tokens_per_s": hf_rate,
        "seconds": sum(r["e2e_s"] for r in recs),
        "tokens": sum(r["num_new_tokens"] for r in recs),
        "exact_match_rate": statistics.fmean(float(r["tokens"] == b["tokens"])
                                             for r, b in zip(recs, records["vanilla"])),
        "ours_ratio": {m: _tokens_per_s(records[m]) / hf_rate for m in ours},
        "ours_ratio_median": {m: _median_ratio(per_tok, _per_token(records[m], "e"), "e") for m in ours},
        "n": len(recs),
    }


def environment(device: torch.device, at_start: dict | None = None) -> dict:
    """The machine and software a bench ran on; `at_start`: how busy the machine was as the timing
    started (backends/contention.py)."""
    return {"torch": torch.__version__, "threads": torch.get_num_threads(), "device": str(device),
            "cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S"), "python": platform.python_version(),
            "at_start": at_start or {}}


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
    if args.forward_cost:
        from . import forward_cost

        return forward_cost.run(args)
    if args.cost_model:
        from . import cost_model

        return cost_model.run(args)
    samples = make_text_samples(args.prompts, args.limit) if args.prompts else \
        make_samples(args.task, args.limit, args.frames)  # bad input fails before any model loads
    if args.separate_runs:  # separate processes, each timing one arm (timing_checks.py)
        return {"separate": timing_checks.separate_runs(args)}
    if args.hf_assisted and args.draft in (None, "self"):
        raise ValueError(f"--hf-assisted needs a draft model to assist with (--draft), got {args.draft!r}")
    check_assistant_dtypes(args.hf_assistant_dtype)
    assistant_variants(getattr(args, "hf_assisted_variants", ""))
    torch.set_num_threads(args.threads)
    load = dict(device=args.device, dtype=args.dtype, cpu_kernels=args.cpu_kernels)
    # --engine-vanilla: the one-row kernels installed too, taken only by the vanilla_engine arm's steps
    one_token = "engine" if getattr(args, "engine_vanilla", False) else "torch"
    target = load_backend(args.model, **load, one_token_kernels=one_token)
    draft = load_draft(args.draft, args.draft_dtype, args.draft_vocab, args.draft_vocab_table, **load) \
        if args.draft not in (None, "self") else None
    options = _parse_kv(args.options)
    runners = {m: Runner(args.model, method=m, draft=args.draft, options=options, target_backend=target,
                         draft_backend=draft, **load) for m in args.methods.split(",")}
    # other busy processes as the timing starts (a warning where they oversubscribe the cores)
    at_start = contention.check(torch.get_num_threads()) if target.device.type == "cpu" else {}
    if args.aa or args.solo:
        return timing_check_run(args, runners, samples, target, draft, options, load, at_start)
    if "vanilla" not in runners:
        runners = {"vanilla": Runner(args.model, "vanilla", target_backend=target, **load), **runners}
    if one_token == "engine":
        runners[ENGINE_VANILLA] = Runner(args.model, "vanilla", target_backend=target, one_token_kernels="engine",
                                         **load)
    records = run_methods({**runners, **hf_runners(args, target, draft)}, samples, args.max_new_tokens)
    result = {"task": f"prompts:{args.prompts}" if args.prompts else args.task, "limit": args.limit,
              "max_new_tokens": args.max_new_tokens, "options": options, "frames": args.frames,
              "target": args.model, "draft": args.draft, "dtype": args.dtype,
              "draft_dtype": None if draft is None else draft.precision.dtype,
              "draft_precision": None if getattr(draft, "precision", None) is None else draft.precision.summary(),
              "methods": {m: summarise(m, records[m], records["vanilla"], samples) for m in runners},
              "hf": {n: summarise_hf(records[n], records, list(runners)) for n in records if n.startswith("hf_")},
              "env": environment(target.device, at_start)}
    result["vanilla_step_ms"] = result["methods"]["vanilla"]["verify_step_ms"]
    if ENGINE_VANILLA in records:
        result["over_engine_vanilla"] = over_engine_vanilla(records, list(runners))
    if "hf_generate" in result["hf"]:
        result["vanilla_vs_hf_generate"] = result["hf"]["hf_generate"]["ours_ratio"]["vanilla"]
    if (best := best_assisted(result["hf"])) is not None:
        result["best_assisted"] = best
    if args.records:
        Path(args.records).parent.mkdir(parents=True, exist_ok=True)
        Path(args.records).write_text("\n".join(json.dumps({"method": m, **r}, default=str)
                                                for m, recs in records.items() for r in recs) + "\n")
    return result


ENGINE_VANILLA = "vanilla_engine"  # --engine-vanilla: vanilla whose one-token steps run the measured kernel


def over_engine_vanilla(records: dict[str, list[dict]], names: list[str]) -> dict[str, dict]:
    """Each method's speedup over the engine's vanilla (one-token steps on the kernel measured fastest,
    linear_kernels.one_token_steps) beside its speedup over transformers' one-token path (`methods`):
    on a CPU the first is what speculation earns alone, the difference what the kernels earn."""
    return {m: _speedups(records[ENGINE_VANILLA], records[m]) for m in names if m != ENGINE_VANILLA}


def timing_check_run(args: argparse.Namespace, runners: dict, samples: list[dict], target: Backend,
                     draft: Backend | None, options: dict, load: dict, at_start: dict) -> dict:
    """--solo: time the listed methods alone (a --separate-runs process); --aa: the A/A checks on the
    listed methods (timing_checks.py)."""
    if args.solo:
        records = run_methods(runners, samples, args.max_new_tokens)
        return {"solo": {m: timing_checks.solo_summary(recs) for m, recs in records.items()},
                **timing_checks.solo_summary([r for recs in records.values() for r in recs])}

    def make_runner(method: str, **kw) -> Runner:
        return Runner(args.model, method=method, draft=args.draft, options=options, target_backend=target,
                      draft_backend=draft, **load, **kw)

    records = run_methods(timing_checks.aa_runners(make_runner, list(runners)), samples, args.max_new_tokens)
    return {"aa": timing_checks.aa_rows(records), "env": environment(target.device, at_start)}


def hf_runners(args: argparse.Namespace, target: Backend, draft: Backend | None) -> dict[str, HFGenerate]:
    """transformers' greedy generate() (--hf-baseline) and assisted generation (--hf-assisted), the
    latter once per --hf-assistant-dtype: `same` (the default) gives transformers' assistant the
    draft our methods run (same weights, same precision: like is compared with like; with its full
    vocabulary, a copy where --draft-vocab cut ours), a dtype a copy of the draft loaded in it (row
    hf_assisted_<dtype>; the same as `same` gets no second row)."""
    out = {}
    if args.hf_baseline:
        out["hf_generate"] = HFGenerate(target)
    if not args.hf_assisted:
        return out
    ours = draft.precision.dtype
    for dtype in dict.fromkeys(ours if d == "same" else d for d in args.hf_assistant_dtype.split(",")):
        reuse = dtype == ours and args.draft_vocab is None  # our draft itself: same weights, same precision
        # a copy in `dtype` (int8: draft_int8's layers, as our draft runs them), full vocabulary,
        # transformers' own kernels (load_draft installs none without cpu_kernels)
        assistant = draft if reuse else load_draft(args.draft, dtype, device=args.device)
        name = "hf_assisted" if dtype == ours else f"hf_assisted_{dtype}"
        out[name] = HFGenerate(target, assistant=assistant)
        if dtype == ours:  # transformers' own settings of the same assistant (same object, same precision)
            for variant in assistant_variants(args.hf_assisted_variants):
                out[f"hf_assisted:{variant}"] = HFGenerate(target, assistant, HF_ASSISTED_VARIANTS[variant])
    return out


def assistant_variants(value: str) -> list[str]:
    """--hf-assisted-variants: '' (none), 'all', or a comma-separated list of HF_ASSISTED_VARIANTS."""
    names = list(HF_ASSISTED_VARIANTS) if value == "all" else [v for v in value.split(",") if v]
    bad = [v for v in names if v not in HF_ASSISTED_VARIANTS]
    if bad:
        raise ValueError(f"--hf-assisted-variants {','.join(bad)}: expected 'all' or a comma-separated list of "
                         f"{', '.join(HF_ASSISTED_VARIANTS)}")
    return names


def best_assisted(hf: dict) -> dict | None:
    """The fastest of transformers' assisted rows (the one called "assisted" where they compete),
    with each of our methods' rate over it; None without assisted rows."""
    rows = {n: r for n, r in hf.items() if n.startswith("hf_assisted")}
    if not rows:
        return None
    name = max(rows, key=lambda n: rows[n]["tokens_per_s"])
    return {"row": name, "tokens_per_s": rows[name]["tokens_per_s"], "ours_ratio": rows[name]["ours_ratio"]}


def check_assistant_dtypes(value: str) -> None:
    allowed = ("same", *(d for d in draft_precision.DRAFT_DTYPES if d != "auto"))
    bad = [d for d in value.split(",") if d not in allowed]
    if bad:
        raise ValueError(f"--hf-assistant-dtype {','.join(bad)}: expected a comma-separated list of {', '.join(allowed)}")


VIDEO_COLUMNS = ("tau", "tokens_per_step", "decode_speedup", "e2e_speedup", "e2e_speedup_ci", "e2e_verdict",
                 "e2e_speedup_total", "draft_prepare_ms",
                 "draft_prepared_share", "decode_tokens_per_s", "draft_step_ms", "draft_ms_per_draft", "draft_share",
                 "verify_step_ms", "host_step_ms", "host_syncs_per_step", "quality", "retention", "facts_lost",
                 "exact_match_rate", "kept_visual_tokens")
# text prompts have no task metric: speed, acceptance and step costs, and exact match to vanilla
TEXT_COLUMNS = ("tau", "tokens_per_step", "decode_speedup", "e2e_speedup", "e2e_speedup_ci", "e2e_verdict",
                "e2e_speedup_total", "draft_prepare_ms",
                "draft_prepared_share", "prefill_ms", "decode_tokens_per_s", "e2e_tokens_per_s", "draft_step_ms",
                "draft_ms_per_draft", "draft_share",
                "verify_step_ms", "host_step_ms", "host_syncs_per_step", "mean_draft_nodes", "exact_match_rate")


def _cell(value) -> str:
    if isinstance(value, list):  # an interval
        return "[" + ", ".join(_cell(v) for v in value) + "]"
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def format_table(result: dict) -> str:
    cols = TEXT_COLUMNS if result["task"].startswith("prompts:") else VIDEO_COLUMNS
    lines = ["| method | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for m, row in result["methods"].items():
        lines.append(f"| {m} | " + " | ".join(_cell(row[c]) for c in cols) + " |")
    return "\n".join(lines)


def format_hf_table(result: dict) -> str:
    """transformers' rows: end-to-end tokens/s, exact match to vanilla, and each of our methods'
    end-to-end tokens/s over theirs (>1: ours is faster)."""
    ours = list(result["methods"])
    cols = ["e2e_tokens_per_s", "exact_match_rate"] + [f"{m}/this" for m in ours]
    lines = ["| transformers | " + " | ".join(cols) + " |", "|---" * (len(cols) + 1) + "|"]
    for name, row in result["hf"].items():
        cells = [row["tokens_per_s"], row["exact_match_rate"]] + [row["ours_ratio"][m] for m in ours]
        lines.append(f"| {name} | " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    result = run(args)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2, default=str) + "\n")
    if "aa" in result:
        print(timing_checks.format_aa(result))
    if "separate" in result:
        print(timing_checks.format_separate(result))
    if "methods" in result:
        print(format_table(result))
    if result.get("hf"):
        print(format_hf_table(result))
    for m, row in result.get("over_engine_vanilla", {}).items():
        print(f"{m} over {ENGINE_VANILLA}: decode {row['decode_speedup']:.3f}x, e2e {row['e2e_speedup']:.3f}x "
              f"{_cell(row['e2e_speedup_ci'])} ({row['e2e_verdict']})")
    if "best_assisted" in result:
        best = result["best_assisted"]
        print(f"best assisted: {best['row']} ({best['tokens_per_s']:.3f} tokens/s); ours over it: "
              + ", ".join(f"{m} {r:.3f}x" for m, r in best["ours_ratio"].items()))
    if "vanilla_vs_hf_generate" in result:
        print(f"vanilla loop vs transformers generate(): {result['vanilla_vs_hf_generate']:.3f}x tokens/s")
    return 0


def register(sub) -> None:
    p = sub.add_parser("bench", help="time methods against vanilla on the same samples in one process")
    p.add_argument("--model", "--target", dest="model", default="demo",
                   help="target: demo, a local folder or a hub id")
    p.add_argument("--draft", default="demo-draft", help="draft model, or 'self' for Self-SD")
    p.add_argument("--methods", default="vanilla,sd_tree,specvlm",
                   help="comma-separated method names (vanilla, sd_tree, specvlm, sage, std, sparrow, mtp, fly, lvspec)")
    p.add_argument("--task", default="synthvid_caption", help=f"one of {', '.join(TASKS)}")
    p.add_argument("--prompts", default=None,
                   help="text-only prompts instead of the task's videos: 'builtin' (coding and explanation "
                        "requests, the set the adaptive policy is tuned on), 'heldout' (code, prose, question "
                        "answering: never tuned on; headline figures come from it) or a file (one prompt per line, or JSONL with a 'prompt' field)")
    p.add_argument("--limit", type=int, default=10, help="number of samples")
    p.add_argument("--frames", type=int, default=None, help="override the task's frame count (video length)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--options", default="", help="decoding options as model_args, e.g. tree=static,tree_depth=4")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--hf-baseline", action="store_true", help="also time transformers' greedy generate()")
    p.add_argument("--hf-assisted", action="store_true",
                   help="also time transformers' assisted generation: generate(assistant_model=the draft)")
    p.add_argument("--draft-dtype", default=None, choices=draft_precision.DRAFT_DTYPES,
                   help="the draft model's precision (model_arg draft_dtype; default: --dtype; auto: measured on this CPU)")
    p.add_argument("--draft-vocab", type=int, default=None,
                   help="FR-Spec: cut the draft's LM head to its K most frequent tokens (model_arg draft_vocab)")
    p.add_argument("--draft-vocab-table", default=None, help="the frequency table for --draft-vocab (lvspec-eval draft-vocab)")
    p.add_argument("--hf-assistant-dtype", default="same",
                   help="with --hf-assisted: the assistant's precision, comma-separated for several rows: same (the "
                        "draft as our methods run it, the default), float32, bfloat16, float16")
    p.add_argument("--hf-assisted-variants", default="",
                   help="with --hf-assisted: also transformers' own assistant settings on the same draft, one row "
                        f"hf_assisted:<name> each: 'all' or a comma-separated list of {', '.join(HF_ASSISTED_VARIANTS)}; "
                        "the fastest assisted row is reported as best_assisted")
    p.add_argument("--records", default=None, help="write per-sample records (JSONL) here")
    p.add_argument("--out", default=None, help="write the JSON result here")
    p.add_argument("--cpu-kernels", default="auto", choices=linear_kernels.MODES,
                   help="on a CPU, the linear layers' kernels for multi-token forwards (backends/linear_kernels.py)")
    p.add_argument("--engine-vanilla", action="store_true",
                   help=f"also time {ENGINE_VANILLA}: vanilla whose one-token steps run the kernel measured fastest "
                        "for one row (model_arg one_token_kernels=engine), and give each method's speedup over it "
                        "(over_engine_vanilla): on a CPU, speculation apart from kernels")
    p.add_argument("--aa", action="store_true",
                   help="A/A checks instead of methods against vanilla: vanilla paired with vanilla, each method "
                        "paired with itself, each method with drafting off against vanilla (each must read 1.00x within its "
                        "interval; timing_checks.py)")
    p.add_argument("--separate-runs", type=int, default=0, metavar="N",
                   help="N separate processes of vanilla and N of the first other method, alternated, and one paired "
                        "process: do the separate runs' speedups bracket the paired figure? (timing_checks.py)")
    p.add_argument("--solo", action="store_true", help="time only the listed methods, no vanilla beside them "
                                                       "(the processes of --separate-runs)")
    p.add_argument("--forward-cost", action="store_true",
                   help="print the target's (and draft's) forward cost for 1..64 new tokens against the one-token "
                        "step and the hardware's floor (forward_cost.py), instead of timing methods")
    p.add_argument("--cache-len", type=int, default=1024, help="with --forward-cost: the cache length to forward over")
    p.add_argument("--repeats", type=int, default=5, help="with --forward-cost: forwards timed per token count")
    p.add_argument("--cost-model", action="store_true", help="real-size random-weight cost model (see measure/cost_model/)")
    try:
        from . import cost_model

        cost_model.add_arguments(p)
    except ImportError:
        pass
    p.set_defaults(func=_main)
