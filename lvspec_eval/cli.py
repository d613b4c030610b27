"""`lvspec-eval`: the command line.

Each sub-command lives in the module that does the work and exposes `register(subparsers)`,
which adds its parser and sets `func` (called with the parsed args; its return value is the exit
code). This file only collects them.
"""
from __future__ import annotations

import argparse
import importlib
import sys

COMMAND_MODULES = (
    "lvspec_eval.training.build_demo",  # build-demo
    "lvspec_eval.measure.demo_run",  # demo
    "lvspec_eval.measure.bench",  # bench
    "lvspec_eval.measure.sweep",  # sweep
    "lvspec_eval.reporting.report",  # report
    "lvspec_eval.reporting.check",  # check
    "lvspec_eval.measure.dry_run",  # dry-run
    "lvspec_eval.training.sparrow",  # train-sparrow
    "lvspec_eval.training.draft_vocab",  # draft-vocab
    "judges.cli",  # judge, judge-check
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="lvspec-eval",
        description="Speculative decoding for Video-LLMs: run, benchmark, judge and report.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name:  # a command not built yet; never hide a broken import inside one
                continue
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, FileNotFoundError) as err:  # bad input: a message, not a traceback
        print(f"lvspec-eval {args.command}: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
