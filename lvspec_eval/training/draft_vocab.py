"""`lvspec-eval draft-vocab`: the token-frequency table that `draft_vocab=K` cuts a draft's LM head to
(FR-Spec; the runtime side is lvspec_eval/backends/draft_vocab.py).

`lvspec-eval draft-vocab --tokenizer PATH --corpus FILE_OR_DIR ... --out T.json` counts the tokens of a
text corpus with the model's tokenizer (`--module NAME` adds the text files of an installed Python
package: offline text in quantity, code and prose); `ids` lists every token seen, most frequent first.
`--demo` counts the demo world's captions and answers instead (the table the demo draft ships, as
`draft_vocab.json` in its folder).
"""
from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

from ..backends.draft_vocab import TABLE_VERSION, coverage, vocab_fingerprint

TEXT_SUFFIXES = (".py", ".md", ".rst", ".txt")


def count_tokens(tokenizer, texts: Iterable[str]) -> Counter:
    counts: Counter = Counter()
    for text in texts:
        counts.update(tokenizer.encode(text, add_special_tokens=False))
    return counts


def build_table(tokenizer, texts: Iterable[str], source: str) -> dict:
    """The frequency table of `texts`: token ids most frequent first, their counts, and what it fits."""
    counts = count_tokens(tokenizer, texts)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return {"version": TABLE_VERSION, "tokenizer": vocab_fingerprint(tokenizer), "vocab_size": len(tokenizer),
            "source": source, "num_tokens": sum(counts.values()),
            "ids": [t for t, _ in ranked], "counts": [c for _, c in ranked]}


def corpus_files(paths: Iterable[str], max_bytes: int) -> list[Path]:
    """Text files under the given files and folders (TEXT_SUFFIXES), in a stable order, up to max_bytes."""
    files, total = [], 0
    for path in map(Path, paths):
        if not path.exists():
            raise ValueError(f"corpus path {path} does not exist")
        candidates = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.suffix in TEXT_SUFFIXES)
        for file in candidates:
            size = file.stat().st_size
            if total + size > max_bytes:
                return files
            files.append(file)
            total += size
    return files


def read_texts(files: Iterable[Path]) -> Iterable[str]:
    for file in files:
        yield file.read_text(encoding="utf-8", errors="ignore")


def save_table(table: dict, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(table) + "\n")


def demo_table(tokenizer, num_scenes: int = 200) -> dict:
    """The demo world's table: the captions and multiple-choice answers of its training scenes."""
    from ..demo import world

    def texts():
        for seed in range(num_scenes):
            scene = world.make_scene(seed)
            yield world.make_caption(scene, seed=seed)
            for q in world.make_questions(scene):
                yield world.format_mcq(q) + " " + q["answer"]

    return build_table(tokenizer, texts(), f"demo world captions and questions, {num_scenes} scenes")


# ---- `lvspec-eval draft-vocab` ----------------------------------------------------------------------
COVERAGE_KS = (1024, 4096, 8192, 16384, 32768, 65536)


def module_folder(name: str) -> str:
    """The folder of an installed Python package (its text files are offline corpus)."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(f"--module {name}: not an installed package")
    return next(iter(spec.submodule_search_locations))


def _main(args) -> int:
    from ..backends.chat_template import load_tokenizer
    from ..backends.loading import resolve_path

    tokenizer = load_tokenizer(resolve_path(args.tokenizer))
    if args.demo:
        table = demo_table(tokenizer)
    else:
        paths = list(args.corpus) + [module_folder(m) for m in args.module]
        if not paths:
            raise ValueError("give --corpus FILE_OR_DIR and/or --module PACKAGE (or --demo)")
        files = corpus_files(paths, int(args.max_mb * 2**20))
        table = build_table(tokenizer, read_texts(files), f"{len(files)} files of {', '.join(args.corpus + args.module)}")
    save_table(table, args.out)
    print(f"{table['num_tokens']:,} tokens counted, {len(table['ids']):,} distinct of {table['vocab_size']:,}: {args.out}")
    for k in COVERAGE_KS:
        if k < len(table["ids"]):
            print(f"  top {k:>6,}: {coverage(table, k):.2%} of the counted tokens")
    return 0


def register(sub) -> None:
    p = sub.add_parser("draft-vocab", help="count token frequencies over a text corpus (the table draft_vocab=K cuts to)")
    p.add_argument("--tokenizer", required=True, help="a model folder (the draft's), or demo / demo-draft")
    p.add_argument("--corpus", nargs="*", default=[], help="text files or folders (.py .md .rst .txt within)")
    p.add_argument("--module", nargs="*", default=[], help="installed Python packages whose text files to count")
    p.add_argument("--demo", action="store_true", help="the demo world's captions and questions instead")
    p.add_argument("--max-mb", type=float, default=64.0, help="read at most this much text")
    p.add_argument("--out", required=True, help="the table (JSON) to write")
    p.set_defaults(func=_main)
