"""A lean decode step: host-device synchronisations per step are a small constant, whatever the tree.

On a GPU every `.item()`, `.tolist()`, `int/float/bool(tensor)` and every tensor made from a Python
list stalls the host until the device catches up (or copies through pageable memory); the engine
used to do one or two per draft candidate (about 232 per default tree step, 820 for an EAGLE-2
tree of 60 nodes). These tests count them on the CPU, where the same calls happen: a
TorchFunctionMode sees every such call, and we count the ones made from the project's own code
(transformers' internals are not ours to change), per decode step, with the loop's clock counted
as a synchronisation too (on CUDA it synchronises the device). The count must stay at most 8 and
must not grow with the tree.
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from torch.overrides import TorchFunctionMode

from lvspec_eval.measure.bench import make_samples
from lvspec_eval.decoding import loop
from lvspec_eval.decoding.drafters.model import ModelDrafter
from lvspec_eval.decoding.drafters.sparrow import SparrowDrafter
from lvspec_eval.decoding.runner import Runner

SYNCING = {"item", "tolist", "__int__", "__float__", "__bool__", "__index__", "tensor"}
PROJECT = str(Path(loop.__file__).resolve().parents[1])  # .../lvspec_eval
MAX_PER_STEP = 8


class SyncCounter(TorchFunctionMode):
    """Counts host-syncing tensor calls made from lvspec_eval's own code."""

    def __init__(self):
        super().__init__()
        self.count = 0
        self.where: list[str] = []
        self.paused = False

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if not self.paused and getattr(func, "__name__", "") in SYNCING:
            caller = sys._getframe(1)
            if caller.f_code.co_filename.startswith(PROJECT):
                self.count += 1
                self.where.append(f"{func.__name__} {Path(caller.f_code.co_filename).name}:{caller.f_lineno}")
        return func(*args, **(kwargs or {}))


def per_step_counts(runner: Runner, sample: dict, monkeypatch) -> tuple[list[int], list[list[str]]]:
    """Syncs of each decode step of one request (the prefill and the first token excluded, and so is
    the draft's one-time preparation, which a lazy drafter makes inside the first step that drafts)."""
    counter = SyncCounter()
    for cls in (ModelDrafter, SparrowDrafter):
        monkeypatch.setattr(cls, "prepare", _uncounted(cls.prepare, counter))
    marks: list[int] = []
    wheres: list[int] = []
    real_finished = loop._finished

    def finished(*args):  # called once before every step: the step boundary
        marks.append(counter.count)
        wheres.append(len(counter.where))
        return real_finished(*args)

    def counting_clock(device):
        base = loop.time.perf_counter

        def clock():
            if marks and not counter.paused:  # inside the decode loop, a CUDA clock would synchronise
                counter.count += 1
                counter.where.append("clock")
            return base()
        return clock

    monkeypatch.setattr(loop, "_finished", finished)
    monkeypatch.setattr(loop, "make_clock", counting_clock)
    with counter:
        runner.generate(sample["prompt"], [sample["video"]], 24)
    steps = [b - a for a, b in zip(marks[:-1], marks[1:])]
    where = [counter.where[a:b] for a, b in zip(wheres[:-1], wheres[1:])]
    return steps, where


def _uncounted(prepare, counter: SyncCounter):
    def wrapped(self, *args, **kwargs):
        counter.paused = True
        try:
            return prepare(self, *args, **kwargs)
        finally:
            counter.paused = False
    return wrapped


@pytest.fixture(scope="module")
def demo():
    target = Runner("demo", "vanilla").target
    draft = Runner("demo-draft", "vanilla").target
    return target, draft, make_samples("synthvid_caption", 1)[0]


TREES = {
    "small dynamic (depth 3, top-2, 6 nodes)": {"tree": "dynamic", "tree_depth": 3, "tree_topk": 2, "tree_total": 6},
    "EAGLE-2 (depth 5, top-10, 60 nodes)": {"tree": "dynamic", "tree_depth": 5, "tree_topk": 10, "tree_total": 60},
    "static specvlm26": {"tree": "static"},
    "chain of 10": {"tree": "chain", "tree_depth": 10},
    "adaptive": {"tree": "adaptive"},
}


@pytest.mark.parametrize("method", ["vanilla", "sd_tree", "specvlm", "sparrow", "fly", "lvspec"])
def test_syncs_per_step_are_few_for_every_method(demo, method, monkeypatch):
    target, draft, sample = demo
    runner = Runner("demo", method, draft="demo-draft", target_backend=target, draft_backend=draft)
    steps, where = per_step_counts(runner, sample, monkeypatch)
    assert steps, "no decode step ran"
    worst = max(range(len(steps)), key=steps.__getitem__)
    assert steps[worst] <= MAX_PER_STEP, f"{method}: {steps[worst]} syncs in one step: {where[worst]}"


def test_syncs_per_step_do_not_grow_with_the_tree(demo, monkeypatch):
    target, draft, sample = demo
    worst = {}
    for name, tree in TREES.items():
        runner = Runner("demo", "sd_tree", draft="demo-draft", target_backend=target, draft_backend=draft,
                        options=tree)
        steps, where = per_step_counts(runner, sample, monkeypatch)
        worst[name] = max(steps)
        assert worst[name] <= MAX_PER_STEP, f"{name}: {where[steps.index(worst[name])]}"
    # the 60-node tree does not cost more host round trips than the 6-node one
    assert worst["EAGLE-2 (depth 5, top-10, 60 nodes)"] <= worst["small dynamic (depth 3, top-2, 6 nodes)"] + 1


@pytest.mark.parametrize("method", ["sd_tree", "specvlm", "fly", "lvspec"])
def test_hybrid_linear_attention_adds_no_syncs(qwen3_5_family, demo, method, monkeypatch):
    """Qwen3.5's Gated DeltaNet layers follow the tree and roll back on the device: a 60-node tree
    costs no more host round trips than a 6-node one, within the same bound."""
    sample = demo[2]
    worst = {}
    for name in ("small dynamic (depth 3, top-2, 6 nodes)", "EAGLE-2 (depth 5, top-10, 60 nodes)"):
        runner = Runner(str(qwen3_5_family.target.model.name_or_path), method,
                        draft=str(qwen3_5_family.draft.model.name_or_path), target_backend=qwen3_5_family.target, draft_backend=qwen3_5_family.draft,
                        options=TREES[name])
        steps, where = per_step_counts(runner, sample, monkeypatch)
        assert steps, "no decode step ran"
        worst[name] = max(steps)
        assert worst[name] <= MAX_PER_STEP, f"{method} {name}: {where[steps.index(worst[name])]}"
    assert worst["EAGLE-2 (depth 5, top-10, 60 nodes)"] <= worst["small dynamic (depth 3, top-2, 6 nodes)"] + 1
