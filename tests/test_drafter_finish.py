"""What a drafter holds once a request is over (issue 52, item 6): `finish()` lets go of everything the
size of the prompt (caches over it, its positions, the target's state), so the next request's timed
window does not carry (nor free) the last one's tensors. Checked for every drafter the methods registry
builds: after a short request and after a long one, the tensors a drafter still reaches through its
attributes (its models' weights and the backends left out) are the same, shape for shape."""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch
from conftest import Case, build_qwen3_checkpoint
from test_mtp import add_mtp, layer_shapes, random_mtp

from lvspec_eval.backends.base import Backend
from lvspec_eval.backends.loading import load_backend
from lvspec_eval.decoding import loop, methods
from lvspec_eval.decoding.drafters.sparrow import SparrowHead

TREE = {"tree": "chain", "tree_depth": 3, "draft_prepare": "eager"}  # every drafter prepares at start
# drafter -> (its draft model: "draft", the family's small one, or None: none or the target's own; options)
SETUPS = {
    "none": (None, {}),
    "model": ("draft", {}),
    "pruned": ("draft", {}),
    "sparrow": (None, {"sparrow_head": "HEAD"}),
    "mtp": (None, {}),
    "sparse_view": (None, {"std_keep": 0.25}),
}
SELF_DRAFTING = ("model", "pruned")  # also run with the target drafting for itself (draft=None)


def _video(frames: int, side: int, seed: int):
    return np.random.default_rng(seed).integers(0, 256, size=(frames, side, side, 3), dtype=np.uint8), 2.0


SHORT = Case("red ball", [_video(1, 28, 0)])
LONG = Case("the red ball moves left past a small blue cube, then stops near the green wall and turns around",
            [_video(4, 96, 1)])


@pytest.fixture(scope="module")
def mtp_target(tmp_path_factory):
    """The qwen3_vl family's target with an MTP layer (so one target serves every drafter)."""
    folder = build_qwen3_checkpoint(tmp_path_factory.mktemp("finish") / "target", 64, 3, seed=5)
    add_mtp(folder, random_mtp(layer_shapes(folder), seed=3), sharded=False)
    return load_backend(str(folder))


def held_tensors(drafter, root: str = "drafter") -> dict[str, tuple]:
    """Attribute path -> shape of every tensor the drafter (or verifier) reaches (through dicts, lists, tuples and
    objects: caches, states, planners); models (their weights) and backends are not walked."""
    found, seen = {}, set()

    def walk(value, path: str) -> None:
        if id(value) in seen or isinstance(value, (torch.nn.Module, Backend, type, types.FunctionType,
                                                   types.MethodType, types.ModuleType)):
            return
        seen.add(id(value))
        if isinstance(value, torch.Tensor):
            found[path] = tuple(value.shape)
        elif isinstance(value, dict):
            for key, item in value.items():
                walk(item, f"{path}[{key!r}]")
        elif isinstance(value, (list, tuple)):
            for k, item in enumerate(value):
                walk(item, f"{path}[{k}]")
        elif hasattr(value, "__dict__"):
            for name, item in vars(value).items():
                walk(item, f"{path}.{name}")

    walk(drafter, root)
    return found


def test_every_registered_drafter_is_checked():
    assert set(SETUPS) == set(methods.DRAFTERS), "give a new drafter its setup in SETUPS"


@pytest.mark.parametrize("name,self_drafting", [(name, False) for name in SETUPS]
                         + [(name, True) for name in SELF_DRAFTING])
def test_nothing_the_size_of_the_prompt_is_held_after_finish(name, self_drafting, mtp_target, qwen3_family,
                                                             tmp_path):
    draft, options = SETUPS[name]
    if options.get("sparrow_head") == "HEAD":
        torch.manual_seed(0)
        SparrowHead.for_target(mtp_target).save(tmp_path / "head")
        options = {**options, "sparrow_head": str(tmp_path / "head")}
    spec = methods.resolve("custom", name, "exact")
    draft_backend = qwen3_family.draft if draft == "draft" and not self_drafting else None
    drafter, verifier = methods.build(spec, methods.make_options(spec, {**TREE, **options}), draft_backend,
                                      mtp_target)
    held = []
    for case in (SHORT, LONG):
        out = loop.generate(mtp_target, drafter, verifier, case.prompt, case.videos, 8)
        assert name == "none" or out.stats.steps[0].num_draft_nodes > 0  # the drafter did draft
        held.append(held_tensors(drafter))
    short, long = held
    grown = {path: (short.get(path), shape) for path, shape in long.items() if short.get(path) != shape}
    assert not grown, f"{name}: after finish() it holds what grows with the prompt (short -> long): {grown}"


@pytest.mark.parametrize("name", list(methods.VERIFIERS))
def test_no_verifier_holds_the_prompts_tensors_after_a_request(name, mtp_target, qwen3_family):
    """The verifiers keep nothing of a request once it is over (LVSpec indexed the video's hidden states
    and held them, and the index, into the next request)."""
    spec = methods.resolve("custom", "pruned", name)
    options = methods.make_options(spec, {**TREE, "lv_layer": 1} if name == "lvspec" else TREE)
    drafter, verifier = methods.build(spec, options, qwen3_family.draft, mtp_target)
    held = []
    for case in (SHORT, LONG):
        out = loop.generate(mtp_target, drafter, verifier, case.prompt, case.videos, 8)
        assert out.stats.steps[0].num_draft_nodes > 0  # the verifier judged drafts
        held.append(held_tensors(verifier, "verifier"))
    short, long = held
    grown = {path: (short.get(path), shape) for path, shape in long.items() if short.get(path) != shape}
    assert not grown, f"{name}: after a request it holds what grows with the prompt (short -> long): {grown}"
