"""Stop strings under a byte-level tokenizer (issue 52, item 3): a token may be one byte of a character,
so a 3-character CJK stop string spans 9 tokens. One token per step and many tokens per step must stop
at the same place: the end of the step that completes the stop string, on vanilla and on sd_tree."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
from tokenizers import Tokenizer, decoders, models

from lvspec_eval.decoding import loop
from lvspec_eval.decoding.runner import Runner
from lvspec_eval.measure.bench import make_samples

STOP = "停止了"  # 3 characters, 9 UTF-8 bytes


def _byte_alphabet() -> dict[int, str]:
    """Byte value -> the printable character a byte-level BPE writes for it (printable Latin-1 bytes
    stand for themselves, the others are shifted past 255, in byte order)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    shifted = (b for b in range(256) if b not in keep)
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(shifted)}}


def byte_tokenizer() -> Tokenizer:
    """A byte-level BPE with no merges: token id b is the byte b."""
    vocab = {char: b for b, char in _byte_alphabet().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.decoder = decoders.ByteLevel()
    return tok


class ByteView:
    """A model's tokenizer whose `decode` reads each model token as one byte (`table[id]`), decoded by the
    byte-level tokenizer; everything else (the chat template, encoding the prompt) is the model's."""

    def __init__(self, tokenizer, table: dict[int, int]):
        self.tokenizer, self.table, self.bytes = tokenizer, table, byte_tokenizer()

    def decode(self, ids, skip_special_tokens: bool = False, **_):
        return self.bytes.decode([self.table.get(int(i), ord("?")) for i in ids], skip_special_tokens=False)

    def __call__(self, *args, **kwargs):
        return self.tokenizer(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.tokenizer, name)


def test_the_byte_tokenizer_decodes_one_byte_per_token():
    tok = byte_tokenizer()
    data = STOP.encode()
    assert len(data) == 9 and tok.decode(list(data)) == STOP
    assert tok.decode(list(data[:4])) == "停\ufffd"  # a character cut in its middle decodes to U+FFFD


def _stop_at(check: loop.StopCheck, ids: list[int], step: int) -> int | None:
    """How many tokens were generated when `check` stopped, feeding `step` tokens at a time."""
    generated = []
    while len(generated) < len(ids):
        generated += ids[len(generated): len(generated) + step]
        if check(generated):
            return len(generated)
    return None


@pytest.mark.parametrize("step", [1, 2, 3, 4, 7])
def test_stop_check_finds_a_multi_byte_stop_string_at_any_step_size(step):
    rng = random.Random(step)
    backend = SimpleNamespace(eos_token_ids={-1}, tokenizer=byte_tokenizer())
    for trial in range(20):
        before = [rng.choice(b"abc xyz,.") for _ in range(rng.randint(0, 30))]
        ids = before + list(STOP.encode()) + [rng.choice(b"abc ") for _ in range(20)]
        end = len(before) + 9  # tokens generated when the stop string is complete
        want = -(-end // step) * step  # the end of the step that completes it
        got = _stop_at(loop.StopCheck(backend, 1000, ("\n\n", STOP)), ids, step)
        assert got == want, f"trial {trial}: step {step} stopped at {got}, the stop string ends at {end}"


@pytest.fixture(scope="module")
def vanilla_runner():
    return Runner("demo", "vanilla", cpu_kernels="torch")


def _decoded(out: loop.Output) -> int:
    """Tokens the loop generated before it stopped: the prefill's, then each step's accepted + bonus."""
    return 1 + sum(step.num_accepted + 1 for step in out.stats.steps)


def _stop_window(tokens: list[int], start: int) -> int:
    """The first position >= start where 9 tokens can stand for the stop string's bytes: no token
    both at a character's first byte and at a continuation byte."""
    for k in range(start, len(tokens) - 9):
        window = tokens[k:k + 9]
        leads, rest = set(window[0::3]), set(window[1::3] + window[2::3])
        if not leads & rest and not set(window) & set(tokens[:k]):
            return k
    pytest.skip("the demo's answer has no usable window")


def _table(tokens: list[int], k: int) -> dict[int, int]:
    """Model token -> byte: the 9 tokens at k spell a 3-character CJK string, the others ASCII letters."""
    table = {t: ord("a") + t % 26 for t in tokens}
    window = tokens[k:k + 9]
    for i, t in enumerate(dict.fromkeys(window[0::3])):
        table[t] = 0xE4 + i  # a 3-byte character's first byte
    for i, t in enumerate(dict.fromkeys(window[1::3] + window[2::3])):
        table[t] = 0x80 + i  # continuation bytes
    return table


def test_vanilla_and_sd_tree_stop_where_the_byte_stop_string_ends(vanilla_runner, monkeypatch):
    target = vanilla_runner.target
    sample = make_samples("synthvid_caption", 1)[0]
    free = vanilla_runner.generate(sample["prompt"], [sample["video"]], 40)
    k = _stop_window(free.tokens, 5)
    table = _table(free.tokens, k)
    view = ByteView(target.tokenizer, table)
    stop = view.decode(free.tokens[k:k + 9])
    assert len(stop) == 3 and len(stop.encode()) == 9
    monkeypatch.setattr(target, "tokenizer", view)
    sd_tree = Runner("demo", "sd_tree", target_backend=target, cpu_kernels="torch",
                     options={"tree": "chain", "tree_depth": 4})
    end = k + 9
    for runner in (vanilla_runner, sd_tree):
        out = loop.generate(target, runner.drafter, runner.verifier, sample["prompt"],
                            [sample["video"].request()], 40, (stop,))
        assert out.tokens == free.tokens[:end], runner.method
        assert out.text == view.decode(free.tokens[:k]), runner.method
        sizes = [1] + [step.num_accepted + 1 for step in out.stats.steps]
        boundaries = [sum(sizes[:i + 1]) for i in range(len(sizes))]
        assert _decoded(out) == next(b for b in boundaries if b >= end), runner.method
        if runner is vanilla_runner:
            assert _decoded(out) == end  # one token per step: stops right at the stop string's end
        else:
            assert max(sizes) > 1  # the target drafting for itself commits several tokens per step
