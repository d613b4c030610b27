"""`lvspec-eval sweep`: LVSpec's knobs against speed and quality on the demo world.

For each setting of lv_threshold, lv_lambda, lv_topn, lv_layer, pst_window (one axis at a time
around a base setting, or a full grid), the lvspec method runs on the same N caption and N
multiple-choice samples as `bench` (demo scenes of the test seeds), interleaved per sample with
vanilla in one process, so speedups are same-process ratios. Reported per setting: decode
speedup (median over caption samples of the per-token decode-time ratio; MCQ answers are one or
two tokens, too short to time), tau, caption-fidelity retention (oracle F1 / vanilla's), MCQ
retention, and visual-fact errors introduced (facts vanilla stated right and the method got
wrong, plus MCQ answers vanilla had right and the method has wrong). The Pareto front over
(estimated speedup, mean retention) is marked; see add_estimated_speedup for why the estimate.

Relevance probe: before the sweep, one target forward per caption over vanilla's own output
gives every token's visual relevance under each swept relevance setting (lv_layer, lv_topn,
lv_anchor, lv_center), computed by the verifier's own code; it reports how well relevance
separates the caption's visual words (colours, shapes, sizes, motions, counts, backgrounds) from
fillers (AUC), and the threshold that separates them best (Youden's J). `lv_threshold=auto`
(or auto+X / auto-X) uses that threshold for the setting's own relevance settings, which keeps
those axes comparable (their similarity scales differ).
"""
from __future__ import annotations

import argparse
import itertools
import json
import statistics
from pathlib import Path

import torch
from tqdm import tqdm

from . import bench
from ..backends.loading import load_backend
from ..decoding import tree
from ..decoding.types import LOOSE, PST, Draft, Scores
from ..decoding.verifiers.lvspec import LVSpecVerifier
from ..demo import world
from ..decoding.runner import Runner

AXES_HELP = "NAME=v1,v2,... (repeatable); values of one option to sweep"
# The default sweep (axes mode, 15 settings + vanilla; about 15 minutes on 2 shared CPU cores at
# --limit 6): the base is the verifier's defaults; settings that change how relevance is computed
# take the probe's threshold for themselves (their similarity scales differ).
DEFAULT_BASE: list[str] = []
DEFAULT_AXES = ["lv_threshold=auto,auto-0.1,auto+0.05", "lv_lambda=0,0.02,0.3", "pst_window=0"]
DEFAULT_ALSO = [*(f"{change},lv_threshold=auto" for change in ("lv_layer=4", "lv_layer=6", "lv_layer=8", "lv_topn=1",
                                                               "lv_topn=32", "lv_anchor=node", "lv_center=none")),
                "lv_relevance=off"]  # the last: the visually blind loose verifier
VISUAL_WORDS = (set(world.COLOURS) | set(world.SHAPES) | set(world.SIZES) | set(world.BACKGROUNDS)
                | set(world.COUNT_WORDS[1:]) | set(world.MOTIONS) | {"upward", "downward", "rises", "falls"})


# ---- settings -----------------------------------------------------------------------------------

def parse_assignments(items: list[str], many: bool) -> dict:
    """['a=1,2', 'b=x'] -> {'a': [1, 2], 'b': ['x']} (many) or 'a=1,b=x' items -> {'a': 1, 'b': 'x'}."""
    out: dict = {}
    for item in items:
        for part in ([item] if many else filter(None, item.split(","))):
            if "=" not in part:
                raise ValueError(f"expected NAME=value, got {part!r}")
            name, value = (s.strip() for s in part.split("=", 1))
            out[name] = [bench._typed(v) for v in value.split(",")] if many else bench._typed(value)
    return out


def make_settings(base: dict, axes: dict[str, list], mode: str, also: list[dict]) -> list[dict]:
    """Option dicts to run: `base` with one axis varied at a time (axes) or every combination
    (grid), then the `also` extras (merged into base); duplicates dropped, order kept."""
    if mode == "grid":
        combos = [dict(zip(axes, values)) for values in itertools.product(*axes.values())]
        runs = [{**base, **c} for c in combos] or [dict(base)]
    else:
        runs = [dict(base)] + [{**base, name: v} for name, values in axes.items() for v in values]
    runs += [{**base, **extra} for extra in also]
    unique = {json.dumps(r, sort_keys=True): r for r in runs}
    for r in unique.values():
        LVSpecVerifier.from_options({k: v for k, v in r.items() if not str(v).startswith("auto")})  # fail early
    return list(unique.values())


def setting_name(options: dict, base: dict) -> str:
    diff = {k: v for k, v in options.items() if base.get(k) != v}
    return ",".join(f"{k}={v}" for k, v in diff.items()) or "base"


# ---- relevance probe ----------------------------------------------------------------------------

PROBE_KEYS = ("lv_layer", "lv_topn", "lv_anchor", "lv_center")  # what relevance depends on


def probe_key(options: dict) -> str:
    merged = {**LVSpecVerifier.OPTIONS, **options}
    return ",".join(str(merged[k]) for k in PROBE_KEYS)


@torch.no_grad()
def token_relevance(target, sample: dict, tokens: list[int], verifiers: dict[str, LVSpecVerifier]) -> dict:
    """probe key -> relevance of tokens[1:], computed by each verifier exactly as in decoding: the
    generated text is fed as a chain hanging off its first token (the root)."""
    inputs = target.prepare(sample["prompt"], [(sample["video"].frames, sample["video"].fps)])
    layers = sorted({v.layer for v in verifiers.values()})
    state, _ = target.prefill(inputs, hidden_layers=layers)
    n = len(tokens)
    _, hidden = target.forward(state, torch.tensor(tokens), torch.arange(n),
                               torch.tril(torch.ones(n, n, dtype=torch.bool)), hidden_layers=layers)
    chain = Draft(tokens=torch.tensor(tokens[1:]), parents=tree.chain_parents(n - 1))
    scores = Scores(logits=torch.zeros(0), hidden=hidden, num_pending=1)
    return {key: v.relevance(chain, scores, state.visual_hidden).tolist() for key, v in verifiers.items()}


def separation(visual: list[float], filler: list[float]) -> dict:
    """AUC of relevance for visual vs filler tokens and the Youden-optimal threshold."""
    if not visual or not filler:
        return {"auc": None, "threshold": None, "visual_mean": None, "filler_mean": None}
    auc = statistics.fmean(float(v > f) + 0.5 * float(v == f) for v in visual for f in filler)
    best, threshold = -1.0, 0.0
    for t in sorted(set(visual)):
        j = statistics.fmean(v >= t for v in visual) - statistics.fmean(f >= t for f in filler)
        best, threshold = (j, t) if j > best else (best, threshold)
    return {"auc": auc, "threshold": threshold, "visual_mean": statistics.fmean(visual),
            "filler_mean": statistics.fmean(filler)}


def probe(target, samples: list[dict], vanilla: list[dict], settings: list[dict]) -> dict:
    """probe key -> separation() of relevance over the caption samples' vanilla outputs."""
    verifiers = {probe_key(s): LVSpecVerifier(**{k: v for k, v in s.items() if k in PROBE_KEYS}) for s in settings
                 if s.get("lv_relevance", "on") == "on"}
    pools: dict = {key: ([], []) for key in verifiers}
    for sample, rec in zip(samples, vanilla):
        if sample["answer"] is not None or len(rec["tokens"]) < 2:
            continue
        words = [target.tokenizer.decode([t]).strip().lower() for t in rec["tokens"][1:]]
        for key, rel in token_relevance(target, sample, rec["tokens"], verifiers).items():
            for word, r in zip(words, rel):
                pools[key][0 if word in VISUAL_WORDS else 1].append(r)
    return {key: separation(*pool) for key, pool in pools.items()}


def resolve_auto(options: dict, calibration: dict) -> dict:
    """lv_threshold=auto[+-offset] -> the probe's best threshold for this setting (plus offset)."""
    value = options.get("lv_threshold")
    if not (isinstance(value, str) and value.startswith("auto")):
        return options
    found = calibration.get(probe_key(options), {}).get("threshold")
    if found is None:
        raise ValueError(f"lv_threshold={value}: the relevance probe has no threshold for {probe_key(options)}")
    try:
        offset = float(value[4:] or 0)
    except ValueError as err:
        raise ValueError(f"lv_threshold={value!r}: expected auto, auto+X or auto-X") from err
    return {**options, "lv_threshold": round(min(1.0, max(-1.0, found + offset)), 4)}


# ---- running and scoring ------------------------------------------------------------------------

def run_all(runners: dict[str, Runner], samples: list[dict], max_new_tokens: int) -> dict[str, list[dict]]:
    """Every runner on every sample, in rotating order per sample (drift hits all alike)."""
    names = list(runners)
    for r in runners.values():  # warm-up at full length, untimed: the first run of each tree and
        r.generate(samples[0]["prompt"], [samples[0]["video"]], max_new_tokens)  # cache shape is slow
    records: dict[str, list[dict]] = {n: [] for n in names}
    for i, s in enumerate(tqdm(samples, desc="sweep", unit="sample")):
        limit = max_new_tokens if s["answer"] is None else min(8, max_new_tokens)
        for name in names[i % len(names):] + names[: i % len(names)]:
            gen = runners[name].generate(s["prompt"], [s["video"]], limit)
            records[name].append(dict(gen.stats, quality=bench.quality(s, gen.text), text=gen.text))
    return records


def _mean(values: list[float]) -> float | None:
    return statistics.fmean(values) if values else None


def _per_token(record: dict) -> float:
    return record["decode_s"] / max(1, record["num_new_tokens"])


def _step_s(record: dict) -> float:
    return record["decode_s"] / max(1, record["num_steps"])


def summarise(samples: list[dict], recs: list[dict], base: list[dict]) -> dict:
    caps = [i for i, s in enumerate(samples) if s["answer"] is None]
    mcq = [i for i, s in enumerate(samples) if s["answer"] is not None]
    ratios = [_per_token(base[i]) / _per_token(recs[i]) for i in caps if recs[i]["decode_s"] > 0]
    steps = sum(recs[i]["num_steps"] for i in caps)
    kinds = [k for r in recs for k in r["kinds"]]
    f1, f1_base = _mean([recs[i]["quality"] for i in caps]), _mean([base[i]["quality"] for i in caps])
    acc, acc_base = _mean([recs[i]["quality"] for i in mcq]), _mean([base[i]["quality"] for i in mcq])
    row = {
        "decode_speedup": statistics.median(ratios) if ratios else None,
        "tau": sum(sum(recs[i]["accepted_lengths"]) for i in caps) / max(1, steps),  # captions: MCQ is 1-2 tokens
        "caption_f1": f1, "caption_retention": f1 / f1_base if f1 is not None and f1_base else None,
        "mcq_accuracy": acc, "mcq_retention": acc / acc_base if acc is not None and acc_base else None,
        "facts_lost": bench.fact_errors(samples, recs, base)[0],
        "exact_match_rate": _mean([float(r["tokens"] == b["tokens"]) for r, b in zip(recs, base)]),
        "loose_share": kinds.count(LOOSE) / max(1, len(kinds)), "pst_share": kinds.count(PST) / max(1, len(kinds)),
    }
    kept = [v for v in (row["caption_retention"], row["mcq_retention"]) if v is not None]
    row["retention"] = _mean(kept)
    return row


def add_estimated_speedup(rows: dict[str, dict], records: dict[str, list[dict]], samples: list[dict]) -> None:
    """rows[name]['est_speedup'] = (tau + 1) x vanilla step time / method step time, where the
    method step time is the median over ALL lvspec runs' caption samples (every setting drafts
    the same tree and verifies it in one forward, so their step costs are alike). On a shared
    CPU the per-setting timings drift by tens of percent; this estimate orders settings by tau
    alone, at a step cost measured on many more steps."""
    caps = [i for i, s in enumerate(samples) if s["answer"] is None]
    vanilla = statistics.median(_step_s(records["vanilla"][i]) for i in caps)
    pooled = statistics.median(_step_s(recs[i]) for name, recs in records.items() if name != "vanilla" for i in caps)
    for name, row in rows.items():
        row["est_speedup"] = 1.0 if name == "vanilla" else (row["tau"] + 1) * vanilla / pooled


def mark_pareto(rows: dict[str, dict], speed: str = "est_speedup") -> None:
    """rows[name]['pareto'] = no other row is at least as fast and as good, and better in one."""
    def point(r):
        return (r[speed] or 0.0, r["retention"] if r["retention"] is not None else 0.0)

    for name, row in rows.items():
        s, q = point(row)
        row["pareto"] = not any((s2 >= s and q2 >= q) and (s2 > s or q2 > q)
                                for other, r in rows.items() if other != name for s2, q2 in [point(r)])


# ---- driver -------------------------------------------------------------------------------------

def build_runners(args, target, draft, settings: list[dict], base: dict, calibration: dict) -> tuple[dict, dict]:
    """(name -> Runner with vanilla first, name -> resolved options) sharing the loaded models."""
    load = {"device": args.device, "dtype": args.dtype}
    runners = {"vanilla": Runner(args.model, "vanilla", target_backend=target, **load)}
    resolved = {}
    for options in settings:
        name = setting_name(options, base)
        resolved[name] = resolve_auto(options, calibration)
        runners[name] = Runner(args.model, "lvspec", draft=args.draft, options={**resolved[name], **args.tree},
                               target_backend=target, draft_backend=draft, **load)
    return runners, resolved


def calibrate(args, target, samples: list[dict], settings: list[dict]) -> dict:
    """The relevance probe over vanilla's captions (empty with --no-probe)."""
    if args.no_probe:
        return {}
    vanilla = Runner(args.model, "vanilla", target_backend=target, device=args.device, dtype=args.dtype)
    caps = [s for s in samples if s["answer"] is None]
    outs = [dict(vanilla.generate(s["prompt"], [s["video"]], args.max_new_tokens).stats) for s in caps]
    return probe(target, caps, outs, settings)


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    target = load_backend(args.model, device=args.device, dtype=args.dtype)
    draft = load_backend(args.draft, device=args.device, dtype=args.dtype)
    samples = bench.make_samples("synthvid_caption", args.limit) + bench.make_samples("synthvid_mcq", args.limit)
    base = {**LVSpecVerifier.OPTIONS, **parse_assignments(args.base if args.base is not None else DEFAULT_BASE,
                                                          many=False)}
    axes = parse_assignments(args.vary if args.vary is not None else DEFAULT_AXES, many=True)
    also = [parse_assignments([a], many=False) for a in (args.also if args.also is not None else DEFAULT_ALSO)]
    settings = make_settings(base, axes, args.mode, also)
    calibration = calibrate(args, target, samples, settings)
    runners, resolved = build_runners(args, target, draft, settings, base, calibration)
    records = run_all(runners, samples, args.max_new_tokens)
    rows = {n: summarise(samples, recs, records["vanilla"]) for n, recs in records.items()}
    add_estimated_speedup(rows, records, samples)
    mark_pareto(rows)
    auto = [n for n, o in zip(resolved, settings) if str(o.get("lv_threshold")).startswith("auto")]
    return {"model": args.model, "draft": args.draft, "tree": args.tree,
            "limit": args.limit, "max_new_tokens": args.max_new_tokens, "base": base, "settings": resolved,
            "auto": auto, "rows": rows, "relevance_probe": calibration, "env": bench.environment(target.device),
            "records": records if args.keep_records else None}


def _fmt(value, pct: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{100 * value:.1f}%" if pct else f"{value:.3f}"
    return str(value)


def format_markdown(result: dict) -> str:
    cols = [("est_speedup", False), ("decode_speedup", False), ("tau", False), ("caption_f1", False), ("caption_retention", True),
            ("mcq_accuracy", False), ("mcq_retention", True), ("facts_lost", False), ("loose_share", True),
            ("pst_share", True), ("exact_match_rate", True)]
    drafter = ", ".join(f"{k}={v}" for k, v in result.get("tree", {}).items()) or "the drafter's defaults"
    lines = [f"LVSpec sweep: {result['limit']} caption + {result['limit']} MCQ demo samples, "
             f"max_new_tokens {result['max_new_tokens']}; target {result.get('model', 'demo')}, draft "
             f"{result.get('draft', 'demo-draft')} ({drafter}); base: "
             + ", ".join(f"{k}={v}" for k, v in result["base"].items()) + ". * = Pareto front (est_speedup, retention). "
             "est_speedup = (tau + 1) x vanilla step time / pooled lvspec step time; decode_speedup = measured median "
             "per-sample ratio (noisy on a shared CPU); tau over captions; retention = mean of caption and MCQ.",
             "", "| setting | " + " | ".join(c for c, _ in cols) + " | pareto |", "|---" * (len(cols) + 2) + "|"]
    for name, row in result["rows"].items():
        cells = [_fmt(row[c], pct) for c, pct in cols]
        resolved = result["settings"].get(name, {})
        auto = name in result["auto"] and resolved.get("lv_relevance") == "on"
        label = name + (f" (lv_threshold={resolved['lv_threshold']})" if auto else "")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {'*' if row['pareto'] else ''} |")
    if result["relevance_probe"]:
        lines += ["", "Relevance probe (vanilla captions): visual words vs fillers", "",
                  f"| {','.join(PROBE_KEYS)} | AUC | best threshold | visual mean | filler mean |", "|---|---|---|---|---|"]
        for key, sep in result["relevance_probe"].items():
            lines.append(f"| {key} | " + " | ".join(_fmt(sep[k]) for k in ("auc", "threshold", "visual_mean",
                                                                         "filler_mean")) + " |")
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    args.tree = parse_assignments(args.tree_options, many=False)
    result = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sweep.json").write_text(json.dumps(result, indent=2, default=str) + "\n")
    (out / "sweep.md").write_text(format_markdown(result) + "\n")
    print(format_markdown(result))
    return 0


def register(sub) -> None:
    p = sub.add_parser("sweep", help="LVSpec thresholds vs speed and quality on the demo world (Pareto table)")
    p.add_argument("--model", default="demo", help="target: demo or a local folder")
    p.add_argument("--draft", default="demo-draft", help="draft model (the lvspec method's pruned-video drafter)")
    p.add_argument("--limit", type=int, default=6, help="caption samples and MCQ samples (N each)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--mode", choices=("axes", "grid"), default="axes",
                   help="axes: vary one option at a time around --base; grid: every combination of --vary")
    p.add_argument("--vary", action="append", default=None,
                   help=f"{AXES_HELP}; lv_threshold=auto uses the relevance probe (default: {' '.join(DEFAULT_AXES)})")
    p.add_argument("--base", action="append", default=None, help="NAME=value,... base LVSpec options over the "
                   f"verifier's defaults (default: {' '.join(DEFAULT_BASE)})")
    p.add_argument("--also", action="append", default=None,
                   help=f"extra settings NAME=value,... merged into base (default: {' '.join(DEFAULT_ALSO)})")
    p.add_argument("--tree-options", action="append", default=[], help="tree_*/prune_* options, NAME=value,...")
    p.add_argument("--no-probe", action="store_true", help="skip the relevance probe (no lv_threshold=auto)")
    p.add_argument("--keep-records", action="store_true", help="store per-sample records in sweep.json")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="results/sweep", help="folder for sweep.json and sweep.md")
    p.set_defaults(func=_main)
