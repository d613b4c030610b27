"""A draft vocabulary cut to the tokens that matter (FR-Spec: frequency-ranked speculative sampling,
Zhao et al. 2025): the draft's LM head keeps the rows of its K most frequent tokens.

Why. With a 151,936-token vocabulary the Qwen2.5 0.5B draft's LM head is 545 MB of its 1.9 GB in
float32: every drafting forward reads it whole to score tokens a draft almost never proposes. Cut to
the K tokens most frequent in text like the answers, it reads K/151,936 of that. The draft then picks
its argmax (its top-k) among the kept tokens only, mapped back to full-vocabulary ids; the target
still verifies over the full vocabulary, so exact methods output exactly what vanilla does (a token
outside the K is simply never drafted: the target supplies it as its bonus token).

The frequency table: `lvspec-eval draft-vocab --tokenizer PATH --corpus FILE_OR_DIR ... --out T.json`
counts the tokens of a text corpus with the model's tokenizer (`--module NAME` adds the text files of
an installed Python package: offline text in quantity, code and prose); `ids` lists every token seen,
most frequent first. For the demo the table is the demo world's captions and answers
(`demo_table()`, computed when asked for). The EOS tokens are always kept, so a draft can end a
chain.
"""
from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch

TABLE_VERSION = 1
TEXT_SUFFIXES = (".py", ".md", ".rst", ".txt")


def vocab_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's vocabulary: a table only fits the tokenizer it was counted with."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


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


def load_table(path: str | Path) -> dict:
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"draft_vocab_table {path}: cannot read a frequency table ({e})") from e
    if table.get("version") != TABLE_VERSION or not isinstance(table.get("ids"), list):
        raise ValueError(f"draft_vocab_table {path}: not a version-{TABLE_VERSION} frequency table "
                         "(build one with `lvspec-eval draft-vocab`)")
    return table


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


def kept_ids(table: dict, k: int, tokenizer, always: Iterable[int] = ()) -> torch.Tensor:
    """The K most frequent tokens of `table` (fewer if it saw fewer) plus `always` (the EOS tokens),
    sorted. ValueError when the table was counted with another tokenizer or K is not positive."""
    if k < 1:
        raise ValueError(f"draft_vocab={k} must be a positive number of tokens")
    if table["tokenizer"] != vocab_fingerprint(tokenizer):
        raise ValueError(f"draft_vocab_table ({table['source']}) was counted with another tokenizer "
                         f"({table['tokenizer']}, this one is {vocab_fingerprint(tokenizer)})")
    ids = set(table["ids"][:k]) | set(always)
    return torch.tensor(sorted(ids), dtype=torch.long)


def coverage(table: dict, k: int) -> float:
    """The share of the table's counted tokens that the K most frequent cover."""
    return sum(table["counts"][:k]) / max(1, table["num_tokens"])


class SubsetHead(torch.nn.Module):
    """An LM head restricted to `ids`: logits over the full vocabulary, the kept tokens' computed from
    their rows only ([k, hidden], a copy), every other token's the dtype's minimum (never the argmax,
    nor in a top-k while kept tokens remain)."""

    def __init__(self, head: torch.nn.Linear, ids: torch.Tensor):
        super().__init__()
        weight = head.weight.detach()
        self.vocab_size = weight.shape[0]
        self.proj = torch.nn.Linear(weight.shape[1], ids.numel(), bias=head.bias is not None,
                                    device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            self.proj.weight.copy_(weight[ids.to(weight.device)])
            if head.bias is not None:
                self.proj.bias.copy_(head.bias.detach()[ids.to(weight.device)])
        self.register_buffer("ids", ids.to(weight.device), persistent=False)

    @property
    def weight(self) -> torch.Tensor:  # what code reading `lm_head.weight` (dtype, device, rows) sees
        return self.proj.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        small = self.proj(hidden)  # [..., k] (through the CPU kernels linear_kernels installs on it)
        full = small.new_full((*small.shape[:-1], self.vocab_size), torch.finfo(small.dtype).min)
        return full.index_copy_(-1, self.ids, small)


def restrict(model: torch.nn.Module, ids: torch.Tensor) -> SubsetHead:
    """Replace `model.lm_head` by its restriction to `ids` (the input embeddings, tied or not, stay)."""
    head = SubsetHead(model.lm_head, ids)
    model.lm_head = head
    return head


def table_for(path: str | None, tokenizer, draft_name: str) -> dict:
    """The table at `path`; without one, the demo's for the demo draft (else ValueError)."""
    if path is not None:
        return load_table(path)
    from ..backends.loading import DEMO_NAMES

    if draft_name in DEMO_NAMES:
        return demo_table(tokenizer)
    raise ValueError(f"draft_vocab needs draft_vocab_table=PATH for draft {draft_name!r} (a frequency table built "
                     "with `lvspec-eval draft-vocab`); only the demo draft has a default")


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
