"""The loop's own cost around the models' forwards: stop strings looked for in the new text only,
the models' devices looked up once, and each request's overhead recorded (stats overhead_s)."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from lvspec_eval.backends.loading import load_backend
from lvspec_eval.decoding import loop, stats
from lvspec_eval.decoding.runner import Runner
from lvspec_eval.measure.bench import make_samples


class CountingTokenizer:
    """The demo tokenizer, counting the tokens it is asked to decode."""

    def __init__(self, tokenizer):
        self.tokenizer, self.decoded = tokenizer, 0

    def decode(self, ids, **kwargs):
        self.decoded += len(ids)
        return self.tokenizer.decode(ids, **kwargs)


@pytest.fixture(scope="module")
def demo_tokenizer():
    return load_backend("demo").tokenizer


def _whole_text_stop(tokenizer, generated, until) -> bool:
    """What the loop used to do every step: decode the whole answer and look for each stop string."""
    text = tokenizer.decode(generated)
    return any(s in text for s in until)


def test_stop_check_stops_exactly_where_a_whole_text_check_does(demo_tokenizer):
    vocab = sorted(demo_tokenizer.get_vocab().values())
    rng = random.Random(0)
    until = (" the", "red ball", ".\n")
    backend = SimpleNamespace(eos_token_ids={-1}, tokenizer=demo_tokenizer)
    for trial in range(40):
        ids = [rng.choice(vocab) for _ in range(60)]
        check = loop.StopCheck(backend, 1000, until)
        generated, stopped_at = [], None
        while len(generated) < len(ids):
            generated += ids[len(generated): len(generated) + rng.randint(1, 4)]  # a step commits 1-4 tokens
            if check(generated):
                stopped_at = len(generated)
                break
            assert not _whole_text_stop(demo_tokenizer, generated, until), f"trial {trial}: missed a stop string"
        if stopped_at is not None:
            assert _whole_text_stop(demo_tokenizer, generated, until)


def test_stop_check_decodes_only_the_tail(demo_tokenizer):
    """A whole-text check decodes n(n+1)/2 tokens over an n-token answer; the tail check O(n)."""
    counting = CountingTokenizer(demo_tokenizer)
    backend = SimpleNamespace(eos_token_ids={-1}, tokenizer=counting)
    word = demo_tokenizer.encode(" red")[0]
    check = loop.StopCheck(backend, 1000, ("never there",))
    generated = []
    for _ in range(200):
        generated.append(word)
        assert not check(generated)
    assert counting.decoded <= 200 * (len("never there") + check.TAIL_SLACK + 1)  # whole-text: 20,100


def test_stop_check_ends_at_eos_and_the_limit(demo_tokenizer):
    backend = SimpleNamespace(eos_token_ids={7}, tokenizer=demo_tokenizer)
    check = loop.StopCheck(backend, 5)
    assert not check([1, 2]) and check([1, 2, 7])
    assert loop.StopCheck(backend, 3)([1, 2, 3])


def test_memory_devices_walks_a_model_once(monkeypatch):
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), torch.nn.Linear(3, 3))
    assert stats.memory_devices(model) == (torch.device("cpu"),)
    walked = []
    real = torch.nn.Module.buffers
    monkeypatch.setattr(torch.nn.Module, "buffers", lambda self, *a, **k: walked.append(1) or real(self, *a, **k))
    assert stats.memory_devices(model, None) == (torch.device("cpu"),)
    assert not walked, "the second request walked every tensor of the model again"


def test_forward_clock_counts_only_the_modules_forwards():
    layer = torch.nn.Linear(4, 4)
    with stats.ForwardClock([layer]) as clock:
        layer(torch.ones(2, 4))
        first = clock.seconds
        torch.ones(100, 100) @ torch.ones(100, 100)  # not a forward of the module
        assert clock.seconds == first > 0
    layer(torch.ones(2, 4))  # the hooks are gone
    assert clock.seconds == first and not layer._forward_hooks and not layer._forward_pre_hooks


@pytest.mark.parametrize("method", ["vanilla", "sd_tree", "sparrow"])
def test_each_request_records_its_overhead(method):
    target, draft = load_backend("demo"), load_backend("demo-draft")
    runner = Runner("demo", method, draft="demo-draft", target_backend=target, draft_backend=draft)
    sample = make_samples("synthvid_caption", 1)[0]
    record = runner.generate(sample["prompt"], [sample["video"]], 12, ("\n\n",)).stats
    assert 0 < record["timed_steps"] <= record["num_steps"]
    assert record["forward_s"] > 0 and record["overhead_s"] > 0
    assert record["forward_s"] + record["overhead_s"] <= record["decode_s"] * 1.01 + 1e-4
    assert record["overhead_step_ms"] == pytest.approx(1000 * record["overhead_s"] / record["timed_steps"])
