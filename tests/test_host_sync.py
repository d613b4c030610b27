"""A lean decode step: host-device synchronisations per step are a small constant, whatever the tree.

On a GPU every `.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `int/float/bool(tensor)` and every tensor
made from host values stalls the host until the device catches up; the engine used to make one or two
per draft candidate (about 232 per default tree step, 820 for an EAGLE-2 tree of 60 nodes). The
decoding loop counts them on every request (decoding/host_sync.py: the calls made from the
project's own code, on CPU tensors too, where the same calls happen) and records them
(`host_syncs_per_step`, `host_syncs_max_step`). Every method must stay at MAX_PER_STEP in every
decode step (the step that prepares a lazy draft excluded, as it is from the timed steps), and the
count must not grow with the tree. The loop's clock, which on CUDA synchronises twice a step to
time the draft and verify phases, is timing's own and not counted here.
"""
from __future__ import annotations

import pytest
import torch

from lvspec_eval.backends.base import PreparedInputs
from lvspec_eval.decoding import host_sync, loop, tree
from lvspec_eval.decoding.runner import Runner
from lvspec_eval.measure.bench import make_samples

MAX_PER_STEP = 3
METHODS = ["vanilla", "sd_tree", "specvlm", "sparrow", "fly", "lvspec", "sage"]
# SAGE's tree decides each level's size on the host from the draft's probabilities (sage_tree.py):
# one transfer and one upload per level on top of the step's own; not yet grown on the device.
SAGE_PER_LEVEL = 2


def bound(runner: Runner) -> int:
    tree_config = runner.options.tree_config()
    return MAX_PER_STEP + (SAGE_PER_LEVEL * tree_config.depth if tree_config.kind == "sage" else 0)


def decode_counted(runner: Runner, sample: dict, monkeypatch, max_new_tokens: int = 24) -> tuple[dict, list[str]]:
    """One request's stats record, and where its syncs were made (for failure messages)."""
    counters = []

    def keeping():
        counters.append(host_sync.SyncCounter(keep_where=True))
        return counters[-1]

    monkeypatch.setattr(loop, "SyncCounter", keeping)
    record = runner.generate(sample["prompt"], [sample["video"]], max_new_tokens).stats
    return record, [w for c in counters for w in c.where]


@pytest.fixture(scope="module")
def demo():
    target = Runner("demo", "vanilla").target
    draft = Runner("demo-draft", "vanilla").target
    return target, draft, make_samples("synthvid_caption", 1)[0]


def test_counter_counts_the_projects_reads_and_uploads_only():
    visual = torch.tensor([False, True, True])
    inputs = PreparedInputs(input_ids=torch.zeros(1, 3, dtype=torch.long), visual_mask=visual, model_kwargs={})
    original = torch.Tensor.item
    with host_sync.SyncCounter(keep_where=True) as counter:
        assert torch.ones(2).sum().item() == 2.0  # this test's own read: not the project's
        assert inputs.num_visual_tokens == 2  # int(tensor) in backends/base.py
        tree.validate(torch.tensor([-1, 0]))  # .tolist() in decoding/tree.py
        tree.chain_parents(3)  # no host read
    assert counter.count == 2, counter.where
    assert [w.split()[0] for w in counter.where] == ["__int__", "tolist"]
    assert torch.Tensor.item is original and "item" not in vars(torch.Tensor), "the counter left a wrapper behind"
    with host_sync.SyncCounter():
        pass
    assert counter.count == 2  # nothing counted once exited


@pytest.mark.parametrize("method", METHODS)
def test_every_method_records_at_most_three_syncs_per_step(demo, method, monkeypatch):
    target, draft, sample = demo
    runner = Runner("demo", method, draft="demo-draft", target_backend=target, draft_backend=draft)
    record, where = decode_counted(runner, sample, monkeypatch)
    assert record["timed_steps"] > 0, "no decode step ran"
    assert record["host_syncs_per_step"] == pytest.approx(record["host_syncs"] / record["timed_steps"])
    assert record["host_syncs_per_step"] >= 1  # the step's one transfer of what the host must know
    assert record["host_syncs_max_step"] <= bound(runner), f"{method}: {where}"


TREES = {
    "small dynamic (depth 3, top-2, 6 nodes)": {"tree": "dynamic", "tree_depth": 3, "tree_topk": 2, "tree_total": 6},
    "EAGLE-2 (depth 5, top-10, 60 nodes)": {"tree": "dynamic", "tree_depth": 5, "tree_topk": 10, "tree_total": 60},
    "static specvlm26": {"tree": "static"},
    "chain of 10": {"tree": "chain", "tree_depth": 10},
    "adaptive": {"tree": "adaptive"},
}


def test_syncs_per_step_do_not_grow_with_the_tree(demo, monkeypatch):
    target, draft, sample = demo
    worst = {}
    for name, options in TREES.items():
        runner = Runner("demo", "sd_tree", draft="demo-draft", target_backend=target, draft_backend=draft,
                        options=options)
        record, where = decode_counted(runner, sample, monkeypatch)
        worst[name] = record["host_syncs_max_step"]
        assert worst[name] <= MAX_PER_STEP, f"{name}: {where}"
    # the 60-node tree does not cost more host round trips than the 6-node one (but the one upload of an
    # accepted path off the first branch, which a small tree's steps may never need)
    assert worst["EAGLE-2 (depth 5, top-10, 60 nodes)"] <= worst["small dynamic (depth 3, top-2, 6 nodes)"] + 1


@pytest.mark.parametrize("method", ["sd_tree", "specvlm", "fly", "lvspec"])
def test_hybrid_linear_attention_adds_no_syncs(qwen3_5_family, demo, method, monkeypatch):
    """Qwen3.5's Gated DeltaNet layers follow the tree and roll back on the device: a 60-node tree
    costs no more host round trips than a 6-node one, within the same bound."""
    sample = demo[2]
    worst = {}
    for name in ("small dynamic (depth 3, top-2, 6 nodes)", "EAGLE-2 (depth 5, top-10, 60 nodes)"):
        runner = Runner(str(qwen3_5_family.target.model.name_or_path), method,
                        draft=str(qwen3_5_family.draft.model.name_or_path), target_backend=qwen3_5_family.target,
                        draft_backend=qwen3_5_family.draft, options=TREES[name])
        record, where = decode_counted(runner, sample, monkeypatch)
        assert record["timed_steps"] > 0, "no decode step ran"
        worst[name] = record["host_syncs_max_step"]
        assert worst[name] <= MAX_PER_STEP, f"{method} {name}: {where}"
    assert worst["EAGLE-2 (depth 5, top-10, 60 nodes)"] <= worst["small dynamic (depth 3, top-2, 6 nodes)"] + 1


def test_a_staged_upload_carries_the_values_and_makes_no_sync():
    """The policy's calibration table reaches the device this way every few steps: counted as the
    engine's code is (decoding/staged_upload.py), it makes no host synchronisation."""
    from lvspec_eval.decoding.staged_upload import StagedUpload

    values = [0.1, 0.25, 0.7]
    staged = StagedUpload(3, "cpu")
    with host_sync.SyncCounter(keep_where=True) as counter:
        first, second = staged.upload(values), staged.upload(values[::-1])
    assert counter.count == 0, counter.where
    assert first.tolist() == torch.tensor(values).tolist() and second.tolist() == torch.tensor(values[::-1]).tolist()
