"""FR-Spec's cut draft vocabulary: the draft's LM head keeps its K most frequent tokens, verification
stays over the full vocabulary, so exact methods output exactly what vanilla does."""
from __future__ import annotations

import json
from pathlib import Path
from collections import Counter

import pytest
import torch

from lvspec_eval import cli
from lvspec_eval.backends.loading import load_backend, load_draft
from lvspec_eval.backends import draft_vocab
from lvspec_eval.decoding import loop, methods
from lvspec_eval.training import draft_vocab as draft_vocab_table
from lvspec_eval.measure.bench import make_samples
from lvspec_eval.models.args import ModelArgs


@pytest.fixture(scope="module")
def target():
    return load_backend("demo")


def test_subset_head_scores_kept_tokens_as_the_full_head_and_never_picks_the_others():
    torch.manual_seed(0)
    head = torch.nn.Linear(8, 50, bias=False)
    ids = torch.tensor([3, 7, 20, 41])
    cut = draft_vocab.SubsetHead(head, ids)
    h = torch.randn(5, 8)
    full, out = head(h), cut(h)
    assert out.shape == full.shape
    torch.testing.assert_close(out[:, ids], full[:, ids])
    assert set(out.argmax(-1).tolist()) <= set(ids.tolist())
    assert torch.equal(out.argmax(-1), ids[full[:, ids].argmax(-1)])  # argmax over the kept rows, mapped back
    others = torch.ones(50, dtype=torch.bool)
    others[ids] = False
    assert (out[:, others] == torch.finfo(out.dtype).min).all()


def test_kept_ids_are_the_most_frequent_plus_eos(target):
    tok = target.tokenizer
    text = "a red ball, a red ball, a red cube"
    table = draft_vocab_table.build_table(tok, [text], "test")
    counts = Counter(tok.encode(text, add_special_tokens=False))
    assert list(zip(table["ids"], table["counts"])) == sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    red, ball = table["ids"][:2]
    eos = sorted(target.eos_token_ids)
    assert draft_vocab.kept_ids(table, 1, tok, eos).tolist() == sorted({red, *eos})
    assert ball in draft_vocab.kept_ids(table, 2, tok).tolist()
    with pytest.raises(ValueError, match="positive"):
        draft_vocab.kept_ids(table, 0, tok)
    with pytest.raises(ValueError, match="another tokenizer"):
        draft_vocab.kept_ids({**table, "tokenizer": "0" * 16}, 5, tok)


def _decode(target, draft, method, sample, max_new_tokens=32, tree=None):
    spec = methods.resolve(method)
    drafter, verifier = methods.build(spec, methods.make_options(spec, tree or {}), draft, target)
    return loop.generate(target, drafter, verifier, sample["prompt"], [sample["video"].request()], max_new_tokens)


@pytest.mark.parametrize("k,dtype", [(30, None), (60, "bfloat16"), (10_000, None)])
def test_a_cut_draft_vocabulary_keeps_exact_methods_token_identical(target, k, dtype):
    draft = load_draft("demo-draft", dtype, vocab=k)
    kept = draft.model.lm_head.ids.numel()
    assert kept <= k + len(target.eos_token_ids) and kept < 512  # the demo uses 92 of its 512 tokens
    accepted = 0
    for sample in make_samples("synthvid_caption", 2):
        want = _decode(target, None, "vanilla", sample).tokens
        for method, tree in (("sd_tree", None), ("specvlm", {"tree": "chain", "tree_depth": 5})):
            out = _decode(target, draft, method, sample, tree=tree)
            assert out.tokens == want, f"{method} draft_vocab={k} sample {sample['id']}"
            accepted += sum(out.stats.accepted_lengths)
    assert accepted > 0


def test_draft_vocab_needs_a_table_except_for_the_demo(tmp_path, qwen_family):
    with pytest.raises(ValueError, match="draft_vocab_table"):
        load_draft(str(qwen_family.draft.model.name_or_path), vocab=100)
    with pytest.raises(ValueError, match="draft_vocab=0"):
        ModelArgs.parse({"draft_vocab": 0})
    bad = tmp_path / "t.json"
    bad.write_text('{"version": 99}')
    with pytest.raises(ValueError, match="not a version-1 frequency table"):
        draft_vocab.load_table(bad)
    kwargs = ModelArgs.parse({"draft_vocab": 64, "draft_vocab_table": str(bad)}).runner_kwargs()
    assert (kwargs["draft_vocab"], kwargs["draft_vocab_table"]) == (64, str(bad))


def test_the_draft_vocab_command_counts_a_corpus(tmp_path, target):
    corpus = tmp_path / "docs"
    corpus.mkdir()
    (corpus / "a.md").write_text("a red ball moves left. a red cube.")
    (corpus / "b.bin").write_text("red " * 1000)  # not a text file: not counted
    out = tmp_path / "table.json"
    assert cli.main(["draft-vocab", "--tokenizer", "demo-draft", "--corpus", str(corpus), "--out", str(out)]) == 0
    table = json.loads(out.read_text())
    assert table["num_tokens"] == len(target.tokenizer.encode("a red ball moves left. a red cube.",
                                                              add_special_tokens=False))
    assert draft_vocab.coverage(table, len(table["ids"])) == 1.0
    assert draft_vocab.kept_ids(draft_vocab.load_table(out), 3, target.tokenizer).numel() == 3


def test_the_demo_draft_ships_the_table_its_builder_counts():
    """draft_vocab=K on the demo needs no table argument: the demo drafts ship draft_vocab.json, which
    must be exactly what `lvspec-eval draft-vocab --demo` counts (rebuild it when the world changes)."""
    from lvspec_eval.backends.loading import resolve_path

    for name in ("demo-draft",):
        folder = Path(resolve_path(name))
        shipped = draft_vocab.load_table(folder / draft_vocab.TABLE_FILE)
        tokenizer = load_draft(name).tokenizer
        assert shipped == draft_vocab_table.demo_table(tokenizer)
