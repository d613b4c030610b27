"""A draft vocabulary cut to the tokens that matter (FR-Spec: frequency-ranked speculative sampling,
Zhao et al. 2025): the draft's LM head keeps the rows of its K most frequent tokens.

Why. With a 151,936-token vocabulary the Qwen2.5 0.5B draft's LM head is 545 MB of its 1.9 GB in
float32: every drafting forward reads it whole to score tokens a draft almost never proposes. Cut to
the K tokens most frequent in text like the answers, it reads K/151,936 of that. The draft then picks
its argmax (its top-k) among the kept tokens only, mapped back to full-vocabulary ids; the target
still verifies over the full vocabulary, so exact methods output exactly what vanilla does (a token
outside the K is simply never drafted: the target supplies it as its bonus token).

The frequency table (a JSON file: token ids most frequent first, their counts, the tokenizer it was
counted with) is built by `lvspec-eval draft-vocab` (lvspec_eval/training/draft_vocab.py). Without
`draft_vocab_table`, the table shipped beside the draft (`draft_vocab.json` in its folder) is used:
the demo draft ships one, counted over the demo world's captions and answers. The EOS tokens are
always kept, so a draft can end a chain.
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

import torch

TABLE_VERSION = 1
TABLE_FILE = "draft_vocab.json"  # the table a draft's folder may ship


def vocab_fingerprint(tokenizer) -> str:
    """A short hash of the tokenizer's vocabulary: a table only fits the tokenizer it was counted with."""
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1])
    return hashlib.sha256(json.dumps(vocab).encode()).hexdigest()[:16]


def load_table(path: str | Path) -> dict:
    try:
        table = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"draft_vocab_table {path}: cannot read a frequency table ({e})") from e
    if table.get("version") != TABLE_VERSION or not isinstance(table.get("ids"), list):
        raise ValueError(f"draft_vocab_table {path}: not a version-{TABLE_VERSION} frequency table "
                         "(build one with `lvspec-eval draft-vocab`)")
    return table


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


def table_for(path: str | None, tokenizer, draft_folder: str | Path) -> dict:
    """The table at `path`; without one, the one the draft's folder ships (else ValueError)."""
    if path is not None:
        return load_table(path)
    shipped = Path(draft_folder) / TABLE_FILE
    if shipped.is_file():
        return load_table(shipped)
    raise ValueError(f"draft_vocab needs draft_vocab_table=PATH: the draft {str(draft_folder)!r} ships no {TABLE_FILE} "
                     "(build a frequency table with `lvspec-eval draft-vocab`)")
