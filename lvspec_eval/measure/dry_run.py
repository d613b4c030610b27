"""`lvspec-eval dry-run`: check a run's settings before it spends hours of GPU time.

    lvspec-eval dry-run --model_args "pretrained=...,draft=...,method=specvlm" --tasks lvspec_videomme,vdc

Checks, in order, and prints one line each (OK / WARN / FAIL):
1. model_args: parsed and validated exactly as the lvspec model will (models/args.py), and which
   attention kernel serves which forwards (backends/attention.py). A CUDA device asked for on a
   machine without one is a warning (dry runs often happen on a login node).
2. draft pairing, from files alone (config.json, tokenizer files, preprocessor configs; no weights
   are loaded): same model family (dense and MoE alike), same tokenizer vocabulary, same video token id, and the same
   visual-token layout as the backends compute it (so SpecVLM's pruned indices and LVSpec's visual
   states line up).
3. chat template and visual tokens, per model (target, and the draft if it is a separate
   checkpoint): the chat template (the processor's, as the run loads it) renders a video + text turn
   with exactly one video token, and the backend's own preprocessing of a video (--video, else the
   first video of the tasks' data, else a nominal one) gives so many visual and prompt tokens, within
   the model's context, and the cache they fill (KV of the attention layers; Qwen3.5's Gated DeltaNet
   layers hold a fixed state instead, measure/cache_memory.py). The backend runs on an empty
   (meta-device) model: no weights are read.
4. data, per task of this project's (tasks/_common/benchmarks.py): the data root exists (its
   LVSPEC_<NAME>_ROOT, else lmms-eval's $HF_HOME layout), the annotations load in one of the
   benchmark's layouts, every row has the fields its tasks need (the schema check a run does at
   its start; the first problems are printed), and the first --videos video files exist. Judged
   tasks warn when no judge is configured.
Exit code 1 if anything failed, else 0.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from ..tasks import TASKS_DIR

STATUSES = ("OK", "WARN", "FAIL")
JUDGED_BENCHMARKS = ("vdc", "vdd", "moviechat")


@dataclass(frozen=True)
class Check:
    status: str  # OK, WARN or FAIL
    what: str
    detail: str


def register(subparsers) -> None:
    p = subparsers.add_parser("dry-run", help="check model_args, draft pairing and data roots without running")
    p.add_argument("--model_args", required=True, help='as for lmms-eval, e.g. "pretrained=X,draft=Y,method=specvlm"')
    p.add_argument("--tasks", required=True, help="comma-separated task or group names")
    p.add_argument("--include_path", default=str(TASKS_DIR),
                   help="the project's task folder (default: the one installed with the package)")
    p.add_argument("--videos", type=int, default=3, help="video files checked per benchmark (default 3)")
    p.add_argument("--video", default=None, help="a video file to count visual tokens on (default: the first "
                                                 "video of the tasks' data, else a nominal 640x360 30 s video)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    names = [t.strip() for t in args.tasks.split(",") if t.strip()]
    checks, parsed = check_model_args(args.model_args)
    if parsed is not None:
        checks += check_pairing(parsed)
        video = getattr(args, "video", None) or first_task_video(names, Path(args.include_path))
        checks += check_templates(parsed, video)
    checks += check_tasks(names, Path(args.include_path), args.videos)
    print(format_report(checks))
    return 1 if any(c.status == "FAIL" for c in checks) else 0


def format_report(checks: list[Check]) -> str:
    lines = [f"{c.status:4s}  {c.what}: {c.detail}" for c in checks]
    counts = {s: sum(c.status == s for c in checks) for s in STATUSES}
    verdict = "dry run FAILED" if counts["FAIL"] else "dry run passed"
    return "\n".join(lines + [f"{verdict}: {counts['OK']} ok, {counts['WARN']} warnings, {counts['FAIL']} failures"])


# ---- 1. model_args -----------------------------------------------------------------------------

def check_model_args(text: str):
    """(checks, ModelArgs or None). lmms-eval's own parser types the values, as in a real run."""
    import torch
    from lmms_eval.utils import simple_parse_args_string

    from ..models.args import ModelArgs

    try:
        raw = simple_parse_args_string(text)
    except ValueError as err:
        return [Check("FAIL", "model_args", f"cannot be parsed ({err}); expected key=value,key=value")], None
    checks = []
    if str(raw.get("device", "")).startswith("cuda") and not torch.cuda.is_available():
        checks.append(Check("WARN", "model_args", f"device={raw['device']} but no CUDA here; checked as device=cpu"))
        raw = {**raw, "device": "cpu"}
    try:
        parsed = ModelArgs.parse(raw)
    except ValueError as err:
        return checks + [Check("FAIL", "model_args", str(err))], None
    from ..backends.attention import describe

    summary = f"method={parsed.method} pretrained={parsed.pretrained} draft={parsed.draft} dtype={parsed.dtype}"
    return checks + [Check("OK", "model_args", summary), Check("OK", "method", describe_method(parsed)),
                     Check("OK", "attention", describe(parsed.attn_implementation))], parsed


def describe_method(parsed) -> str:
    """The method's composition as the run will build it (methods.describe)."""
    from ..decoding import methods

    spec = methods.resolve(parsed.method, parsed.drafter, parsed.verifier)
    return methods.describe(spec, methods.make_options(spec, parsed.options))


# ---- 2. draft pairing ----------------------------------------------------------------------------

def uses_draft_model(parsed) -> bool:
    """Whether the run loads a separate draft checkpoint (as runner.Runner decides)."""
    from ..decoding import methods

    spec = methods.resolve(parsed.method, parsed.drafter, parsed.verifier)
    return spec.drafter in ("model", "pruned") and parsed.draft not in (None, "self")


def check_pairing(parsed) -> list[Check]:
    if not uses_draft_model(parsed):
        return [Check("OK", "pairing", f"method {parsed.method} loads no separate draft model")]
    try:
        target, draft = (checkpoint_facts(name, parsed) for name in (parsed.pretrained, parsed.draft))
    except (OSError, ValueError) as err:
        return [Check("WARN", "pairing", f"not checked: {err}")]
    problems = [f"{key}: target {target[key]!r}, draft {draft[key]!r}"
                for key in ("family", "video_token_id", "layout") if target[key] != draft[key]]
    if target["vocab"] != draft["vocab"]:
        problems.append(f"tokenizers differ ({len(target['vocab'])} vs {len(draft['vocab'])} entries)")
    if problems:
        return [Check("FAIL", "pairing", "; ".join(problems))]
    return [Check("OK", "pairing", f"{parsed.draft} shares tokenizer and layout {target['layout']}")]


def checkpoint_facts(name: str, parsed) -> dict:
    """What pairing compares, from config and tokenizer files (local, or already in the hub cache)."""
    backend = backend_without_weights(name, parsed)
    # the family, not the model_type: a dense draft serves an MoE target of its family (qwen3_5 for qwen3_5_moe)
    return {"family": backend.family, "video_token_id": backend.video_token_id,
            "layout": backend.layout(), "vocab": backend.tokenizer.get_vocab()}


def backend_without_weights(name: str, parsed):
    """The family backend of checkpoint `name` as a run loads it (tokenizer with the processor's chat
    template, preprocessing overrides), around an empty model on the meta device: no weights are read."""
    import torch
    from transformers import AutoConfig

    from ..backends.chat_template import load_tokenizer
    from ..backends.loading import _families, _model_class, _preprocess_overrides, check_model_type, resolve_path

    path = resolve_path(name)
    local = {} if Path(path).is_dir() else {"local_files_only": True}  # a hub id: the cache only, no download
    config = AutoConfig.from_pretrained(path, **local)
    check_model_type(name, config.model_type)  # a family lvspec cannot decode: refused, saying why
    families = _families()
    with torch.device("meta"):
        model = _model_class(config.model_type)(config).eval()
    overrides = _preprocess_overrides(path, parsed.video_rule, min_pixels=parsed.min_pixels,
                                      max_pixels=parsed.max_pixels)
    return families[config.model_type].from_pretrained_parts(model, load_tokenizer(path, **local),
                                                             torch.device("cpu"), overrides)


def config_layout(config, path: str, parsed) -> tuple:
    """The backend's layout() as dry-run computes it, from files (tests check it equals a loaded backend's)."""
    return backend_without_weights(path, parsed).layout()


# ---- 3. chat template and visual tokens ----------------------------------------------------------------

NOMINAL_VIDEO = (30.0, 30.0, 360, 640)  # seconds, native fps, height, width of the stand-in video
NOMINAL = "a nominal"


def check_templates(parsed, video: str | None) -> list[Check]:
    """Render each model's chat template with a video and count its tokens, per checkpoint loaded."""
    names = [("pretrained", parsed.pretrained)]
    if uses_draft_model(parsed):
        names.append(("draft", parsed.draft))
    try:
        request, source = sample_frames(video, parsed)
    except (OSError, ValueError) as err:  # VideoError is a ValueError; OSError: a checkpoint not found
        return [Check("FAIL", "video", f"{video}: {err}")]
    return [check_template(role, name, parsed, request, source) for role, name in names]


def check_template(role: str, name: str, parsed, request: tuple, source: str) -> Check:
    """request: the video as a run hands it to `prepare` (frames, fps, original indices, native fps)."""
    from ..backends.chat_template import check_video_template
    from .cache_memory import cache_memory
    from .cache_memory import describe as describe_cache

    what = f"chat template {role}={name}"
    try:
        backend = backend_without_weights(name, parsed)
    except (OSError, ValueError) as err:
        return Check("WARN", what, f"not checked: {err}")
    try:
        check_video_template(backend.tokenizer, backend.video_token_id, f"{role}={name}")
        inputs = backend.prepare("Describe the video.", [request])
    except ValueError as err:
        return Check("FAIL", what, str(err))
    n = int(inputs.input_ids.shape[1])
    text_config = backend.model.config.get_text_config()
    dtype_bytes = 4 if parsed.dtype == "float32" else 2
    counts = (f"{inputs.num_visual_tokens} visual tokens, {n} prompt tokens for {source}; "
              f"{describe_cache(cache_memory(text_config, dtype_bytes), n)}")
    limit = getattr(text_config, "max_position_embeddings", None)
    if limit and n >= limit:  # a nominal video only warns: the task's videos may be smaller
        return Check("WARN" if source.startswith(NOMINAL) else "FAIL", what,
                     f"{counts}: more than the context of {limit}; such samples fail (lower max_frames, fps or "
                     "max_pixels)")
    return Check("OK", what, f"renders a video; {counts}")


def sample_frames(video: str | None, parsed):
    """((frames uint8 [T, H, W, 3], fps, original indices, native fps), description) as the run samples
    them (video_rule, fps, max_frames)."""
    import numpy as np

    from ..models.video import load_video

    plan = backend_without_weights(parsed.pretrained, parsed).frame_plan(parsed.fps, parsed.max_frames)
    if video is not None:
        loaded = load_video(video, plan=plan)
        t, h, w, _ = loaded.frames.shape
        return loaded.request(), f"{video} ({t} frames of {w}x{h})"
    seconds, native_fps, h, w = NOMINAL_VIDEO
    indices = plan.indices(int(seconds * native_fps), native_fps)
    frames = np.zeros((len(indices), h, w, 3), dtype=np.uint8)
    return ((frames, len(indices) / seconds, indices, native_fps),
            f"{NOMINAL} {seconds:.0f} s {w}x{h} video ({len(indices)} frames; --video for yours)")


def first_task_video(names: list[str], include_path: Path) -> str | None:
    """The first video of the tasks' data already on this machine (benchmark or demo task), if any."""
    try:
        registry = load_task_registry(include_path)
    except ValueError:
        registry = None
    for name in names:
        for task in registry.GROUPS.get(name, (name,)) if registry else (name,):
            path = (benchmark_video(registry, task) if registry and task in registry.TASKS
                    else demo_task_video(task))
            if path:
                return path
    return None


def benchmark_video(registry, task: str) -> str | None:
    bench = registry.get(registry.TASKS[task])
    root, _ = registry.data_root(bench)
    if not root.is_dir():  # else load_rows would try the hub
        return None
    try:
        rows = registry.load_rows(bench)
    except (ValueError, OSError, ConnectionError, ImportError):
        return None
    path = registry.video_path(bench, rows[0]) if rows else None
    return path if path and os.path.isfile(path) else None


def demo_task_video(task: str) -> str | None:
    """A synthvid task's first video if its data was generated already (dry-run generates nothing)."""
    from ..demo import tasks_data

    docs = tasks_data.cache_root() / task / "docs.jsonl"
    if task not in tasks_data.TASKS or not docs.is_file():
        return None
    lines = docs.read_text(encoding="utf-8").splitlines()
    path = docs.parent / json.loads(lines[0])["video"] if lines else None
    return str(path) if path and path.is_file() else None


# ---- 4. data roots ------------------------------------------------------------------------------

def load_task_registry(include_path: Path):
    """tasks/_common/benchmarks.py of the include path (lmms-eval reads the tasks from there too)."""
    if not (include_path / "_common" / "benchmarks.py").is_file():
        raise ValueError(f"--include_path {str(include_path)!r} has no _common/benchmarks.py; give the "
                         "project's tasks folder")
    if str(include_path.resolve()) not in sys.path:
        sys.path.insert(0, str(include_path.resolve()))
    return importlib.import_module("_common.benchmarks")


def check_tasks(names: list[str], include_path: Path, num_videos: int) -> list[Check]:
    try:
        registry = load_task_registry(include_path)
    except ValueError as err:
        return [Check("FAIL", "tasks", str(err))]
    checks, benches = [], {}
    for name in names:
        for task in registry.GROUPS.get(name, (name,)):
            if task in registry.TASKS:
                benches.setdefault(registry.TASKS[task], []).append(task)
            else:
                checks.append(Check("WARN", f"task {task}", unknown_task_note(registry, task)))
    for bench_name, tasks in benches.items():
        checks += check_benchmark(registry, registry.get(bench_name), ",".join(tasks), num_videos)
    return checks


def unknown_task_note(registry, task: str) -> str:
    note = "not one of this project's benchmark tasks (a demo, built-in or unknown task): its data is not checked here"
    if f"lvspec_{task}" in registry.TASKS:  # lmms-eval's built-in of the same benchmark
        note += (f"; did you mean lvspec_{task}? lmms-eval's built-in {task} downloads from the hub and "
                 "exits the whole run on a missing video")
    return note


def check_benchmark(registry, bench, tasks: str, num_videos: int) -> list[Check]:
    what = f"data {bench.name} ({tasks})"
    root, from_env = registry.data_root(bench)
    source = f"{bench.env_var}={root}" if from_env else f"$HF_HOME layout {root} ({bench.env_var} unset)"
    if not root.is_dir():
        return [Check("FAIL", what, f"{source}: no such folder")]
    try:
        rows = registry.load_rows(bench)
    except (ValueError, OSError, ConnectionError, ImportError) as err:
        return [Check("FAIL", what, f"{source}: annotations do not load: {type(err).__name__}: {err}")]
    checks = [Check("OK", what, f"{source}: {len(rows)} annotated samples"), schema_check(registry, bench, tasks, rows)]
    missing = [registry.video_path(bench, row) for row in rows[:num_videos]]
    missing = [p for p in missing if not os.path.isfile(p)]
    if missing:
        checks.append(Check("FAIL", what, f"{len(missing)} of the first {min(num_videos, len(rows))} videos "
                                          f"missing: {', '.join(missing)}"))
    else:
        checks.append(Check("OK", what, f"the first {min(num_videos, len(rows))} videos exist"))
    return checks + judge_check(bench, what)


def schema_check(registry, bench, tasks: str, rows: list[dict], shown: int = 5) -> Check:
    """Every row against the fields each of the tasks needs (what process_docs checks at a run's start)."""
    schema = importlib.import_module("_common.schema")
    what = f"schema {bench.name} ({tasks})"
    required = tuple(dict.fromkeys(f for t in tasks.split(",") for f in registry.TASK_FIELDS[t]))
    rules = {t: registry.TASK_RULES.get(t, ()) for t in tasks.split(",")}
    try:  # each task on its own rows (VDC's dimensions, MovieChat's modes: registry.task_rows)
        problems = list(dict.fromkeys(p for t in rules for p in schema.row_problems(
            registry.task_rows(t, rows), registry.TASK_FIELDS[t], rules=list(rules[t]))))
    except ValueError as err:
        return Check("FAIL", what, str(err))
    if not problems:
        return Check("OK", what, f"all {len(rows)} rows have {', '.join(required)}")
    first = "; ".join(problems[:shown]) + (" ..." if len(problems) > shown else "")
    layouts = schema.accepted(registry.layouts_of(bench))
    return Check("FAIL", what, f"{len(problems)} of {len(rows)} rows do not fit the task: {first} ({layouts})")


def judge_check(bench, what: str) -> list[Check]:
    if bench.name not in JUDGED_BENCHMARKS:
        return []
    judge = importlib.import_module("_common.judge")
    reason = judge.unavailable_reason()
    return [Check("WARN", what, f"judged scores will be missing: {reason}")] if reason else \
        [Check("OK", what, "a judge endpoint is configured")]
