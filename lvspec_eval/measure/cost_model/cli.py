"""`lvspec-eval bench --cost-model` and `python -m lvspec_eval.measure.cost_model`: the options, the
settings they make (CostConfig), where the outputs go, and the run."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from . import measure
from .architectures import PAIRS, Scale
from .config import CPU_VISUAL_TOKENS, DEFAULT_TAU, DRAFTERS, GPU_VISUAL_TOKENS, CostConfig
from .outputs import markdown_table, output_paths, write_files

DEFAULT_OUT = Path("results/cost_model")  # relative to the working directory
DESCRIPTION = "Cost model: predicted decode speedups of each drafter at real model sizes, no trained weights."
SUMMARY_METHOD_OF = {"sd_tree": "full", "specvlm": "pruned", "sparrow": "sparrow"}


def _csv(kind):
    def parse(text: str) -> tuple:
        try:
            return tuple(kind(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {kind.__name__}") from None
    return parse


def parse_taus(text: str) -> dict:
    """"full=3.1,sparrow=3.8" -> {"full": 3.1, "sparrow": 3.8} (unnamed drafters keep the default)."""
    taus = dict(DEFAULT_TAU)
    for item in filter(None, (x.strip() for x in text.split(","))):
        name, _, value = item.partition("=")
        if name not in DRAFTERS:
            raise ValueError(f"--tau {item!r}: drafter {name!r}; allowed: {', '.join(DRAFTERS)}")
        taus[name] = float(value)
    return taus


def taus_from_summary(path: Path) -> dict:
    """Measured tau per drafter from a report's summary.json (sd_tree, specvlm, sparrow rows;
    the mean over tasks). Drafters without a row keep the assumed value."""
    rows = json.loads(Path(path).read_text(encoding="utf-8"))["rows"]
    taus = dict(DEFAULT_TAU)
    for method, drafter in SUMMARY_METHOD_OF.items():
        values = [r["tau"] for r in rows if r.get("method") == method and isinstance(r.get("tau"), (int, float))]
        if values:
            taus[drafter] = sum(values) / len(values)
    return taus


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The cost model's options (none clashes with `bench`'s own; device/dtype/out carry a cost- prefix)."""
    g = parser.add_argument_group("cost model (bench --cost-model)")
    g.add_argument("--pairs", type=_csv(str), default=tuple(PAIRS), help=f"target/draft pairs: {', '.join(PAIRS)}")
    g.add_argument("--drafters", type=_csv(str), default=DRAFTERS, help=f"drafters: {', '.join(DRAFTERS)}")
    g.add_argument("--visual-tokens", type=_csv(int), default=None,
                   help=f"counts to time (default GPU {GPU_VISUAL_TOKENS}, CPU {CPU_VISUAL_TOKENS})")
    g.add_argument("--scale", type=float, default=None, help="width factor (default 1 on GPU, 1/8 on CPU)")
    g.add_argument("--max-layers", type=int, default=None, help="cap on layers (default none on GPU, 2 on CPU)")
    g.add_argument("--vocab-size", type=int, default=None, help="shrink the vocabulary (default: the real one)")
    g.add_argument("--head-dim", type=int, default=None, help="override head_dim (default: the real one)")
    g.add_argument("--tau", default="", help="acceptance lengths, e.g. full=3.1,pruned=2.9,sparrow=3.8")
    g.add_argument("--tau-from", type=Path, default=None, help="take tau from a report's summary.json")
    g.add_argument("--tree-depth", type=int, default=5, help="levels of the draft tree")
    g.add_argument("--level-width", type=int, default=8, help="nodes expanded per level (the dynamic tree's top-k)")
    g.add_argument("--tree-nodes", type=int, default=25, help="draft nodes verified per step")
    g.add_argument("--prune-ratio", type=float, default=0.9, help="share of visual tokens the pruned draft drops")
    g.add_argument("--new-tokens", type=int, default=256, help="generated tokens for the e2e speedup")
    g.add_argument("--prompt-tokens", type=int, default=64, help="text tokens around the video")
    g.add_argument("--timing-repeats", type=int, default=5, help="timed repeats per forward (the fastest counts)")
    g.add_argument("--cost-device", default=None, help="default: cuda if available, else cpu")
    g.add_argument("--cost-dtype", default=None, choices=("float32", "bfloat16", "float16"),
                   help="default: bfloat16 on GPU, float32 on CPU")
    g.add_argument("--cost-attn", default="sdpa", choices=("sdpa", "eager", "flash_attention_2"))
    g.add_argument("--cost-out", type=Path, default=None,
                   help=f"output folder (default {DEFAULT_OUT}; --out FILE.json names the JSON file instead)")
    g.add_argument("--no-cost-plot", action="store_true", help="skip the PNG")


def config_from_args(args: argparse.Namespace) -> CostConfig:
    device = args.cost_device or ("cuda" if torch.cuda.is_available() else "cpu")
    cpu = torch.device(device).type == "cpu"
    scale = Scale(width=args.scale if args.scale is not None else (0.125 if cpu else 1.0),
                  max_layers=args.max_layers if args.max_layers is not None else (2 if cpu else None),
                  vocab_size=args.vocab_size, head_dim=args.head_dim)
    taus, source = parse_taus(args.tau), ("given" if args.tau else "assumed")
    if args.tau_from:
        taus, source = {**taus_from_summary(args.tau_from), **(parse_taus(args.tau) if args.tau else {})}, \
            f"measured ({args.tau_from})"
    return CostConfig(pairs=tuple(args.pairs), drafters=tuple(args.drafters),
                      visual_tokens=tuple(args.visual_tokens or (CPU_VISUAL_TOKENS if cpu else GPU_VISUAL_TOKENS)),
                      scale=scale, taus=taus, tau_source=source, depth=args.tree_depth,
                      level_width=args.level_width, tree_nodes=args.tree_nodes, prune_ratio=args.prune_ratio,
                      new_tokens=args.new_tokens, prompt_tokens=args.prompt_tokens, repeats=args.timing_repeats,
                      device=device, dtype=args.cost_dtype or ("float32" if cpu else "bfloat16"),
                      attn_implementation=args.cost_attn)


def destination(args: argparse.Namespace) -> dict[str, Path]:
    """Where the outputs go: `--out FILE.json` (bench's own option: the JSON there, the .md and .png
    beside it), else `--cost-out DIR` (cost_model.json, .md, .png in it), else DEFAULT_OUT."""
    plots = not args.no_cost_plot
    out = getattr(args, "out", None)
    if out is None:
        return output_paths((args.cost_out or DEFAULT_OUT) / "cost_model.json", plots)
    if args.cost_out is not None:
        raise ValueError(f"--out {out} and --cost-out {args.cost_out}: give one (--out FILE.json or --cost-out DIR)")
    if Path(out).is_dir():
        raise ValueError(f"--out {out} is a folder; with --cost-model it names the JSON file (FILE.json, with "
                         "FILE.md and FILE.png beside it); for a folder use --cost-out DIR")
    return output_paths(Path(out), plots)


def run(args: argparse.Namespace) -> dict:
    """Entry point for `lvspec-eval bench --cost-model` (and `python -m lvspec_eval.measure.cost_model`).

    Returns the result, as bench.run does (bench writes it to --out again, unchanged)."""
    paths = destination(args)  # checked before minutes of timing, not after
    result = measure.run_cost_model(config_from_args(args))
    write_files(result, paths)
    print(markdown_table(result))
    print("written: " + ", ".join(str(p) for p in paths.values()))
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m lvspec_eval.measure.cost_model", description=DESCRIPTION)
    add_arguments(parser)
    parser.add_argument("--out", type=Path, default=None, help="the JSON file (.md and .png beside it)")
    run(parser.parse_args(argv))
    return 0
