"""`lvspec-eval judge` and `lvspec-eval judge-check`.

judge: score the captions of lmms-eval samples files (written with --log_samples as
<output_path>/<model>/<date>_samples_<task>.jsonl). lmms-eval 0.7.3 keeps in each line `doc_id`,
`target` (the reference, as a string), `input` (the prompt), `filtered_resps` (the answer; a
string, or a list for multi-request docs) and the task's metric values; it drops `doc`. The
caption is the first string in filtered_resps, the reference is `target`, the question `input`.
Mode vdc also needs reference Q&A: a `qa_list` field ([{"question","answer"}] or [[q, a]]) in the
line itself (a task can log it as a metric value) or in `doc` when present.
Output: one JSON line per sample, keyed by (task, doc_id), with the 0-5 score or null (missing).

judge-check: validate a judge against the demo world's oracle (see judges/validate.py) and write
a JSON report.

--serve [MODEL] (both commands): start a local llama.cpp judge server and judge with it. MODEL is
a name from judges/server.py's JUDGE_MODELS (default smollm2-135m, plumbing only;
qwen2.5-coder-1.5b is the smallest that judges, see docs/JUDGE.md) or the path of a .gguf file.
A judge that refuses us (key, model, URL) or stops answering ends the command with one error
(exit code 3); the judgments made before stay in the cache, so a rerun resumes.

Judge settings come from the environment as in lmms-eval (OPENAI_API_KEY, OPENAI_BASE_URL or
OPENAI_API_URL, API_TYPE, MODEL_VERSION, AZURE_*); the options below override them. Keys are
never options: they stay in the environment and out of every output.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from judges.cache import JudgeCache
from judges.client import (DEFAULT_QUESTION, MODES, CaptionItem, JudgeClient, JudgeSetupError,
                           JudgeUnreachableError, score_captions)
from judges.config import API_TYPES, RESPONSE_FORMATS, JudgeConfig
from judges.prompts import all_specs
from judges.server import DEFAULT_JUDGE, JUDGE_MODELS, JudgeServer, missing_reason, resolve_model
from lvspec_eval.jsonl import read_jsonl

DEFAULT_CACHE = ".cache/judge_cache.sqlite"
_TASK_RE = re.compile(r"_samples_(.+)\.jsonl$")


def register(subparsers: argparse._SubParsersAction) -> None:
    judge = subparsers.add_parser("judge", help="LLM-judge the captions of lmms-eval samples files")
    judge.add_argument("samples", nargs="+", type=Path, help="samples .jsonl files or folders holding them")
    judge.add_argument("--out", type=Path, required=True, help="output JSONL, one line per (task, doc_id)")
    judge.add_argument("--limit", type=int, default=None, help="judge at most this many samples per file")
    judge.add_argument("--annotate", action="store_true",
                       help="also write each score into its samples file, as the per-sample metric judge_<mode> "
                            "(then `lvspec-eval report --metric TASK=judge_<mode>` reports it)")
    _add_judge_options(judge)
    judge.set_defaults(func=_stops_with_one_error(run_judge))

    check = subparsers.add_parser("judge-check", help="validate an LLM judge against the demo-world oracle")
    check.add_argument("--num-scenes", type=int, default=20, help="demo scenes (7 captions judged per scene)")
    check.add_argument("--first-seed", type=int, default=10_000, help="seed of the first scene")
    check.add_argument("--out", type=Path, default=Path("results/judge_check.json"), help="JSON report")
    check.add_argument("--max-questions", type=int, default=None,
                       help="vdc mode: at most this many reference questions per scene, drawn by the scene seed")
    check.add_argument("--oracle", action="store_true", help="judge with the oracle itself (harness self-test)")
    check.add_argument("--reference-facts", choices=("scene", "judge"), default="scene",
                       help="facts mode: the reference's facts from the scene (default) or split by the judge")
    _add_judge_options(check)
    check.set_defaults(func=_stops_with_one_error(run_judge_check))


def _stops_with_one_error(run):
    """A judge that refused us or went away ends the command with one line, not a traceback."""
    @functools.wraps(run)
    def wrapped(args: argparse.Namespace) -> int:
        try:
            return run(args)
        except (JudgeSetupError, JudgeUnreachableError) as err:
            print(f"lvspec-eval {getattr(args, 'command', 'judge')}: error: {err}", file=sys.stderr)
            return 3
    return wrapped


def _add_judge_options(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("judge (defaults from the environment, as lmms-eval reads it)")
    g.add_argument("--mode", choices=MODES, default="detail",
                   help="detail (VDD), vcgpt (5 criteria), vdc (VDCscore), facts (F1 of atomic facts; a small judge's mode)")
    g.add_argument("--caption-facts", choices=("judge", "sentences"), default="judge",
                   help="facts mode: split each caption into facts by the judge (default) or into its sentences "
                        "(no request: for a slow CPU judge; see docs/JUDGE.md)")
    g.add_argument("--model", default=None, help="judge model (env MODEL_VERSION)")
    g.add_argument("--base-url", default=None, help="endpoint (env OPENAI_BASE_URL / OPENAI_API_URL)")
    g.add_argument("--api-type", choices=API_TYPES, default=None, help="env API_TYPE")
    g.add_argument("--response-format", choices=RESPONSE_FORMATS, default=None, help="default auto (negotiate)")
    g.add_argument("--max-concurrency", type=int, default=None)
    g.add_argument("--max-retries", type=int, default=None, help="the openai client's retries")
    g.add_argument("--parse-retries", type=int, default=None, help="re-asks after an unreadable reply")
    g.add_argument("--max-tokens", type=int, default=None)
    g.add_argument("--timeout", dest="timeout_s", type=float, default=None,
                   help="seconds per request (default 120; 600 with --serve: one CPU thread is slow)")
    g.add_argument("--seed", type=int, default=None)
    g.add_argument("--cache", type=Path, default=Path(DEFAULT_CACHE), help="sqlite reply cache")
    g.add_argument("--no-cache", action="store_true", help="ask again even when a reply is cached")
    g.add_argument("--no-progress", action="store_true")
    s = parser.add_argument_group("local judge server (llama.cpp; built by `make judge-server`)")
    s.add_argument("--serve", nargs="?", const=DEFAULT_JUDGE, default=None, metavar="MODEL",
                   help=f"start a local judge and use it: {', '.join(JUDGE_MODELS)} or a .gguf path "
                        f"(default {DEFAULT_JUDGE}: plumbing only; qwen2.5-coder-1.5b judges)")
    s.add_argument("--serve-threads", type=int, default=1, help="CPU threads of the served model")
    s.add_argument("--serve-ctx", type=int, default=2048, help="context length of the served model")


def _config(args: argparse.Namespace, **extra: object) -> JudgeConfig:
    names = ("model", "base_url", "api_type", "response_format", "max_concurrency", "max_retries",
             "parse_retries", "max_tokens", "seed", "timeout_s")
    settings = {n: getattr(args, n) for n in names}
    settings.update(extra)  # what --serve started wins over the options
    return JudgeConfig.from_env(**settings)


@contextlib.contextmanager
def _client(args: argparse.Namespace, **extra: object) -> Iterator[JudgeClient]:
    cache = None if args.no_cache else JudgeCache(args.cache)
    try:
        yield JudgeClient(_config(args, **extra), cache=cache, progress=not args.no_progress)
    finally:
        if cache is not None:
            cache.close()


# ----------------------------------------------------------------------------------------------
# judge


def sample_files(paths: list[Path]) -> list[Path]:
    """The samples files among `paths` (folders are searched for *_samples_*.jsonl)."""
    found: list[Path] = []
    for path in paths:
        if path.is_dir():
            found += sorted(path.rglob("*_samples_*.jsonl"))
        elif path.is_file():
            found.append(path)
        else:
            raise ValueError(f"samples path {str(path)!r} does not exist")
    if not found:
        raise ValueError(f"no *_samples_*.jsonl file under {[str(p) for p in paths]}")
    return found


def task_name(path: Path) -> str:
    match = _TASK_RE.search(path.name)
    return match.group(1) if match else path.stem


def response_text(sample: dict) -> str:
    """The model's answer: the first string in filtered_resps (else resps), however nested."""
    for key in ("filtered_resps", "resps"):
        stack = [sample.get(key)]
        while stack:
            value = stack.pop(0)
            if isinstance(value, str):
                return value
            if isinstance(value, (list, tuple)):
                stack = list(value) + stack
    raise ValueError(f"sample doc_id={sample.get('doc_id')!r} has no string in filtered_resps or resps")


def sample_qa(sample: dict) -> tuple[tuple[str, str], ...]:
    raw = sample.get("qa_list") or (sample.get("doc") or {}).get("qa_list") or []
    pairs = [(q["question"], q["answer"]) if isinstance(q, dict) else (q[0], q[1]) for q in raw]
    return tuple((str(q), str(a)) for q, a in pairs)


def task_reference_facts(task: str) -> dict[int, tuple[str, ...]]:
    """The reference facts a task knows, by doc_id (mode facts uses them instead of asking the judge
    to split the reference): the demo world's caption tasks (synthvid_caption*) state their
    scene's facts (judges/oracle.scene_facts); other tasks know none ({})."""
    if not task.startswith("synthvid_caption"):
        return {}
    from judges.oracle import scene_facts
    from lvspec_eval.demo import tasks_data, world

    return {n: scene_facts(world.Scene.from_dict(doc["scene"])) for n, doc in enumerate(tasks_data.load_docs(task))}


def read_samples(path: Path, limit: int | None = None, with_facts: bool = False) -> list[CaptionItem]:
    """CaptionItems of one samples file; key = '<task>/<doc_id>'. `with_facts`: the task's own
    reference facts where it has them (task_reference_facts)."""
    task, items = task_name(path), []
    facts = task_reference_facts(task) if with_facts else {}
    for sample in read_jsonl(path)[:limit]:
        doc = sample.get("doc") or {}
        question = sample.get("input") if isinstance(sample.get("input"), str) else doc.get("question")
        items.append(CaptionItem(key=f"{task}/{sample['doc_id']}", caption=response_text(sample),
                                 reference=str(sample.get("target", "")),
                                 question=question or DEFAULT_QUESTION, qa=sample_qa(sample),
                                 reference_facts=facts.get(sample["doc_id"], ())))
    return items


def run_judge(args: argparse.Namespace) -> int:
    files = {path: read_samples(path, args.limit, with_facts=args.mode == "facts") for path in sample_files(args.samples)}
    items = [item for file_items in files.values() for item in file_items]
    with _served(args) as extra, _client(args, **extra) as client:
        results = score_captions(client, items, args.mode, args.caption_facts)
        judge_info = client.describe()
    if args.annotate:
        done = 0
        for path, file_items in files.items():
            annotate_samples(path, results[done:done + len(file_items)], args.mode, judge_info["model"])
            done += len(file_items)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for r in results:
            task, doc_id = r["key"].rsplit("/", 1)
            row = {"task": task, "doc_id": _doc_id(doc_id), "judge_model": judge_info["model"], **r}
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    summary = _summary(results, judge_info, args.mode)
    print(json.dumps(summary, indent=2))
    return 1 if results and summary["missing"] == len(results) else 0


def annotate_samples(path: Path, results: list[dict], mode: str, judge_model: str) -> None:
    """Add each result to its line of the samples file as metric judge_<mode> (lmms-eval's form of a
    judged value: a dict whose "score" is the number, None when missing), replacing the file."""
    by_doc = {_doc_id(r["key"].rsplit("/", 1)[1]): r for r in results}
    lines = []
    for sample in read_jsonl(path):  # a torn last line (a killed run's) is left out of the rewritten file
        result = by_doc.get(sample["doc_id"])
        if result is not None:
            sample[f"judge_{mode}"] = {"score": result["score"], "judge_error": "; ".join(result["errors"]) or None,
                                       "judge_model": judge_model}
        lines.append(json.dumps(sample, ensure_ascii=False))
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(path)


def _doc_id(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def _summary(results: list[dict], judge_info: dict, mode: str) -> dict:
    per_task: dict[str, list[float]] = {}
    for r in results:
        if r["score"] is not None:
            per_task.setdefault(r["key"].rsplit("/", 1)[0], []).append(r["score"])
    missing = sum(r["score"] is None for r in results)
    return {"mode": mode, "num_samples": len(results), "missing": missing,
            "missing_share": missing / len(results) if results else None,
            "mean_score": {t: sum(v) / len(v) for t, v in per_task.items()},
            "prompts": {n: s.version for n, s in all_specs().items()}, "judge": judge_info}


# ----------------------------------------------------------------------------------------------
# judge-check


def run_judge_check(args: argparse.Namespace) -> int:
    from judges import validate  # scipy is only needed here

    cands = validate.make_candidates(args.num_scenes, args.first_seed, args.max_questions)
    if args.oracle:
        report = {"judge": {"oracle": True}, **validate.run_check(cands, validate.oracle_scores)}
    else:
        details: list[dict] = []
        with _served(args) as extra, _client(args, **extra) as client:
            report = validate.run_check(cands, validate.llm_judge(client, args.mode, args.reference_facts, details,
                                                                      args.caption_facts))
            report = {"judge": client.describe(), **report}
        if args.mode == "facts":
            for row, result in zip(report["rows"], details):
                row["facts"] = {k: result[k] for k in ("recall", "precision", "f1", "reference_facts_from",
                                                        "reference_facts", "caption_facts", "errors")}
    report = {"mode": args.mode, "num_scenes": args.num_scenes, "first_seed": args.first_seed,
              "max_questions": args.max_questions if args.mode == "vdc" else None,
              "reference_facts": args.reference_facts if args.mode == "facts" else None,
              "caption_facts": args.caption_facts if args.mode == "facts" else None,
              "prompts": {n: s.version for n, s in all_specs().items()}, **report}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    brief = {k: v for k, v in report.items() if k not in ("rows", "oracle_ceiling", "prompts")}
    print(json.dumps(brief, indent=2))
    print(f"report written to {args.out}", file=sys.stderr)
    return 1 if report["num_missing"] == report["num_captions"] else 0


@contextlib.contextmanager
def _served(args: argparse.Namespace) -> Iterator[dict]:
    """With --serve: start the local judge server and point the client at it; else nothing.

    If the judge stops answering, the error says what became of the server process we started.
    """
    if not args.serve:
        yield {}
        return
    reason = missing_reason(args.serve)
    if reason:
        raise JudgeSetupError(f"--serve {args.serve}: the local judge server cannot run: {reason}")
    path, alias = resolve_model(args.serve)
    with JudgeServer.start(path, alias=alias, n_threads=args.serve_threads, n_ctx=args.serve_ctx) as server:
        print(f"local judge {server.model} ({path.name}) at {server.base_url} (log {server.log_path})",
              file=sys.stderr)
        # the server answers one request at a time: more in flight would only wait in its queue
        # (and time out there), so one at a time unless asked otherwise
        served = {"base_url": server.base_url, "model": server.model, "api_type": "openai",
                  "max_concurrency": args.max_concurrency or 1, "timeout_s": args.timeout_s or 600.0}
        try:
            yield served
        except JudgeUnreachableError as err:
            raise JudgeUnreachableError(f"{err}; {server.describe_exit()}") from None
