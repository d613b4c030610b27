"""Sparrow: the draft head, its drafter bookkeeping, and its training (SPEC.md section 4).

Invariants checked on tiny random targets of both families (conftest.py):
- exact verification with a Sparrow head (random weights: acceptance is low) is token-identical
  to vanilla greedy decoding, for dynamic, static and chain trees, with HSR on and off;
- the head holds no visual KV: its cache holds exactly the text tokens it has seen, and what a
  draft step attends to does not change with the number of visual tokens;
- the hidden states it reuses are the target's true ones, also when verification leaves several
  committed tokens pending;
- training's masked multi-pass forward computes what drafting computes;
- a few training steps reduce the loss; checkpoints save, load and resume.
"""
from __future__ import annotations

import argparse
import contextlib
import json

import numpy as np
import pytest
import torch

from lvspec_eval.backends.base import FINAL
from lvspec_eval.backends.loading import load_backend
from lvspec_eval.decoding import loop, methods
from lvspec_eval.decoding.drafters import sparrow
from lvspec_eval.decoding.drafters.hidden_state import HiddenStateDrafter
from lvspec_eval.training import sparrow as sparrow_train
from lvspec_eval.decoding.drafters.sparrow import SparrowDrafter, SparrowHead
from lvspec_eval.decoding.tree import TreeConfig, chain_parents
from lvspec_eval.decoding.types import Draft, Verdict
from lvspec_eval.decoding.verifiers.exact import ExactVerifier

MAX_NEW = 14


def _head_dir(backend, path, seed=0):
    torch.manual_seed(seed)
    SparrowHead.for_target(backend).save(path)
    return str(path)


def _kept(drafter) -> None:
    """HiddenStateDrafter.finish that keeps the request's tensors (the cache, the known hidden states)."""
    drafter._request = None


def _run(backend, method, case, **options):
    spec = methods.resolve(method)
    drafter, verifier = methods.build(spec, methods.make_options(spec, options), None, backend)
    return loop.generate(backend, drafter, verifier, case.prompt, case.videos, MAX_NEW), drafter


@pytest.mark.parametrize("tree", ["adaptive", "dynamic", "static", "chain"])
def test_random_head_is_lossless(family, make_case, tree, tmp_path):
    head = _head_dir(family.target, tmp_path / "head")
    for seed in range(2):
        case = make_case(seed, family.max_side)
        ref, _ = _run(family.target, "vanilla", case)
        for hsr in ("on", "off"):
            out, _ = _run(family.target, "sparrow", case, tree=tree, sparrow_head=head, sparrow_hsr=hsr)
            assert out.tokens == ref.tokens, (family.name, tree, hsr, seed)
            assert out.stats.kept_visual_tokens == 0


def test_head_cache_holds_text_only(family, make_case, tmp_path, monkeypatch):
    monkeypatch.setattr(HiddenStateDrafter, "finish", _kept)  # read the head's cache as the request left it
    head = _head_dir(family.target, tmp_path / "head")
    case = make_case(3, family.max_side, max_frames=4)
    # a fixed tree drafts at every step (the adaptive policy may skip drafting, and feeding, at the end)
    out, drafter = _run(family.target, "sparrow", case, sparrow_head=head, tree="dynamic")
    inputs = family.target.prepare(case.prompt, case.videos)
    assert inputs.num_visual_tokens > 0
    assert drafter.num_text == int((~inputs.visual_mask).sum())
    # After the last step the cache holds the prompt's text and every generated token but the last
    # one (the root of the next draft, fed at the next proposal).
    assert drafter.cache_len == drafter.num_text + drafter.num_fed
    assert drafter.num_fed >= len(out.tokens) - 1
    assert all(layer.keys.shape[-2] == drafter.cache_len for layer in drafter.cache.layers)


@contextlib.contextmanager
def _keys_per_forward(head):
    """Record the number of keys each head forward attends to (mask [1, 1, m, keys])."""
    seen = []
    forward = head.forward

    def spy(x, positions, mask, cache=None):
        seen.append(int(mask.shape[-1]))
        return forward(x, positions, mask, cache)

    head.forward = spy
    try:
        yield seen
    finally:
        del head.forward


@pytest.mark.parametrize("family", ["qwen2_5_vl"], indirect=True)
def test_draft_step_cost_does_not_depend_on_visual_tokens(family, tmp_path):
    """Same prompt, 2 vs 16 frames: the first draft step's head forwards see the same keys."""
    head = SparrowHead.load(_head_dir(family.target, tmp_path / "head"), family.target)
    frames = np.random.default_rng(0).integers(0, 256, size=(16, 56, 56, 3), dtype=np.uint8)
    seen = {}
    for num_frames in (2, 16):
        inputs = family.target.prepare("describe the video", [(frames[:num_frames], 2.0)])
        state, logits = family.target.prefill(inputs, hidden_layers=(FINAL,))
        drafter = SparrowDrafter(head, family.target, TreeConfig("dynamic", depth=4, topk=3, total=10))
        drafter.start(family.target, inputs, state, loop.make_clock(family.target.device))
        with _keys_per_forward(head) as keys:
            drafter.propose([int(logits.argmax())])
        seen[inputs.num_visual_tokens] = keys
    (few, short), (many, long) = sorted(seen.items())
    assert many >= 4 * few and short == long and len(short) == 4  # the root, then 3 tree levels


class OracleDrafts:
    """Mixed into a hidden-state drafter (Sparrow, MTP): proposes the reference continuation (so
    drafts get accepted), the feeding and bookkeeping staying the drafter's own."""

    def __init__(self, *args, reference: list[int], **kwargs):
        super().__init__(*args, **kwargs)
        self.reference, self.tails = reference, []

    def _grow(self, *args):  # (tree shape arguments..., root_logits, root_out, tail, root_index)
        tail, root_index = args[-2:]
        self.tails.append(tail)
        nxt = self.reference[root_index + 1: root_index + 4]
        return Draft(torch.tensor(nxt, dtype=torch.long), chain_parents(len(nxt)))


class _OracleSparrow(OracleDrafts, SparrowDrafter):
    pass


class HalfCachedExact(ExactVerifier):
    """Exact acceptance, but only half of the accepted path keeps its KV: the rest stays pending."""

    def verify(self, draft, scores, visual_hidden=None) -> Verdict:
        v = super().verify(draft, scores, visual_hidden)
        return Verdict(v.tokens, v.path, len(v.path) // 2, v.kinds)


@pytest.mark.parametrize("family", ["qwen2_5_vl"], indirect=True)
def test_reused_hidden_states_are_the_targets(family, make_case, tmp_path, monkeypatch):
    monkeypatch.setattr(HiddenStateDrafter, "finish", _kept)  # read the known states as the request left them
    backend = family.target
    case = make_case(5, family.max_side)
    ref, _ = _run(backend, "vanilla", case)
    head = SparrowHead.load(_head_dir(backend, tmp_path / "head"), backend)
    drafter = _OracleSparrow(head, backend, TreeConfig("chain", depth=3), reference=ref.tokens)
    out = loop.generate(backend, drafter, HalfCachedExact(), case.prompt, case.videos, MAX_NEW)
    assert out.tokens == ref.tokens
    assert max(drafter.tails) > 0  # some proposals had to feed a pending tail temporarily
    # The target's h for each generated token, from one forward over prompt + answer.
    inputs = backend.prepare(case.prompt, case.videos)
    state, _ = backend.prefill(inputs)
    n = len(drafter.known)
    _, hidden = backend.forward(state, torch.tensor(ref.tokens[:n]), torch.arange(n),
                                torch.ones(n, n, dtype=torch.bool).tril(), hidden_layers=(FINAL,))
    torch.testing.assert_close(torch.stack(drafter.known), hidden[FINAL], atol=1e-4, rtol=1e-4)


def _train_args(tmp_path, *extra):
    parser = argparse.ArgumentParser()
    sparrow_train.register(parser.add_subparsers())
    return parser.parse_args(["train-sparrow", "--out", str(tmp_path / "head"), "--work", str(tmp_path / "work"),
                              "--data", str(tmp_path / "data.jsonl"), "--frames", "2", "--size", "56",
                              "--num-captions", "3", "--num-mcq", "1", "--max-new-tokens", "10",
                              "--batch-size", "4", "--warmup", "2", "--lr", "3e-3", "--log-every", "1", *extra])


@pytest.mark.parametrize("family", ["qwen2_5_vl"], indirect=True)
def test_training_passes_compute_what_drafting_computes(family, tmp_path):
    """MTP pass k at position t == a depth-k draft node hanging off the committed token t - k."""
    backend = family.target
    args = _train_args(tmp_path, "--target", "unused")
    record = {"seed": 7, "prompt": "describe the video", "answer": [5, 9, 11, 13, 17, 19]}
    ex = sparrow_train.extract(backend, record, args, ivsb_layer=1)
    head = SparrowHead.for_target(backend)
    batch = sparrow_train.collate([ex], [True], backend.device)  # prefix dropped: as at inference
    with torch.no_grad():
        passes = [p[0] for p in sparrow_train.head_passes(head, backend.model.get_input_embeddings(), batch, 2)]
    drafter = SparrowDrafter(head, backend, TreeConfig("chain", depth=3))
    inputs = backend.prepare(record["prompt"], [sparrow_train.video_for(record, args)])
    state, _ = backend.prefill(inputs, hidden_layers=(FINAL,))
    drafter.start(backend, inputs, state, loop.make_clock(backend.device))
    torch.testing.assert_close(drafter.last[1], passes[0][ex.loss_from], atol=1e-5, rtol=1e-5)
    answer, t0 = record["answer"], ex.loss_from + 1  # text position of answer[0]
    drafter.known = list(ex.target_h[t0:])
    _, out, _ = drafter._catch_up(answer[:2])  # root = answer[1]
    torch.testing.assert_close(out, passes[0][t0 + 1], atol=1e-5, rtol=1e-5)
    out = out[None]
    for depth in (1, 2):
        pos = torch.tensor([drafter.num_text + 1 + depth])
        _, out = drafter._run(torch.tensor([answer[1 + depth]]), out, pos,
                              torch.ones(1, drafter.temp_len + 1, dtype=torch.bool))
        torch.testing.assert_close(out[0], passes[depth][t0 + 1 + depth], atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["qwen2_5_vl"], indirect=True)
def test_training_reduces_loss_and_resumes(family, tmp_path):
    target = str(family.target.model.name_or_path)
    args = _train_args(tmp_path, "--target", target, "--steps", "12", "--ckpt-every", "6")
    sparrow_train.train(args)
    log = [json.loads(line) for line in (tmp_path / "work" / "train_sparrow.log").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == 12 and np.mean(losses[-3:]) < np.mean(losses[:3])
    head = SparrowHead.load(tmp_path / "head", family.target)
    assert head.meta["steps_done"] == 12 and head.meta["ivsb_layer"] == 1
    sparrow_train.train(_train_args(tmp_path, "--target", target, "--steps", "14", "--resume"))
    starts = [r for r in (json.loads(line) for line in (tmp_path / "work" / "train_sparrow.log").read_text()
                          .splitlines()) if r.get("event") == "start"]
    assert [s["step"] for s in starts] == [0, 12]


def test_bf16_head_keeps_the_targets_rotary_angles(family, tmp_path):
    """Loaded for a bf16 target, the head's weights are bf16 but its buffers stay fp32, so its
    rotary angles are the target's: a bf16 inv_freq is off by radians at position 2,000."""
    bf16 = load_backend(str(family.target.model.name_or_path), dtype="bfloat16")
    head = SparrowHead.load(_head_dir(family.target, tmp_path / "head"), bf16)
    assert head.fc.weight.dtype == head.layer.self_attn.q_proj.weight.dtype == torch.bfloat16
    assert [b.dtype for b in head.buffers()] == [torch.float32] * len(list(head.buffers())) != []
    target_freq = bf16.text_model().rotary_emb.inv_freq
    if target_freq.shape != head.rotary.inv_freq.shape:  # a partial-rotary target (Qwen3.5): the head rotates whole heads
        target_freq = SparrowHead.for_target(family.target).rotary.inv_freq
    assert target_freq.dtype == torch.float32 and torch.equal(head.rotary.inv_freq, target_freq)
    positions = torch.tensor([[0, 7, 500, 2000, 4000]])
    cos, sin = head.rotary(torch.zeros(1, dtype=torch.bfloat16), positions)  # [1, 5, head_dim] bf16
    angles = positions[0, :, None].double() * target_freq.double()
    angles = torch.cat([angles, angles], dim=-1)
    # Only cos/sin's own rounding to bf16 (at most 2**-8 for values in [-1, 1]) is left.
    torch.testing.assert_close(cos[0].double(), angles.cos(), atol=2**-8, rtol=0)
    torch.testing.assert_close(sin[0].double(), angles.sin(), atol=2**-8, rtol=0)
    head.float()
    assert torch.equal(head.rotary.inv_freq, target_freq) and head.fc.weight.dtype == torch.float32


def test_checkpoint_roundtrip_and_errors(tmp_path, qwen_family):
    backend = qwen_family.target
    head = SparrowHead.load(_head_dir(backend, tmp_path / "head", seed=3), backend)
    again = SparrowHead.load(tmp_path / "head", backend)
    for k, v in head.state_dict().items():
        assert torch.equal(v, again.state_dict()[k])
    assert set(head.state_dict()) == {k for k in head.state_dict() if k.split(".")[0] in ("fc", "layer", "norm")}
    opts = methods.make_options(methods.resolve("sparrow"), {})
    with pytest.raises(ValueError, match="sparrow_head"):
        methods.build(methods.resolve("sparrow"), opts, None, backend)
    with pytest.raises(ValueError, match="no Sparrow head"):
        SparrowHead.load(tmp_path, backend)
    for bad in ({"sparrow_hsr": "maybe"}, {"sparrow_typo": 1}):
        with pytest.raises(ValueError, match="sparrow"):
            sparrow.parse_options(bad)
    assert sparrow.parse_options({"sparrow_hsr": "false"})["sparrow_hsr"] == "off"


def test_batched_answers_match_the_decoding_loop(family, tmp_path):
    """The training data's batched greedy answers equal the loop's vanilla answers (both families)."""
    args = _train_args(tmp_path, "--target", "unused", "--num-captions", "2", "--num-mcq", "1")
    tasks = sparrow_train.task_list(args)
    batched = sparrow_train.greedy_batch(family.target, tasks, args)
    assert batched == [sparrow_train.greedy_one(family.target, t, args) for t in tasks]


@pytest.mark.parametrize("family", ["qwen2_5_vl"], indirect=True)
def test_ivsb_prefix_is_seen_only_by_text_after_the_video(family, tmp_path):
    args = _train_args(tmp_path, "--target", "unused")
    ex = sparrow_train.extract(family.target, {"seed": 3, "prompt": "describe", "answer": [5, 9, 11]}, args, 1)
    first_after = int(ex.visual_pos[0])  # text index of the first token after the video
    assert ex.visual.shape[0] == int(family.target.prepare("describe", [sparrow_train.video_for({"seed": 3}, args)])
                                     .num_visual_tokens)
    head = SparrowHead.for_target(family.target)
    embed = family.target.model.get_input_embeddings()
    with torch.no_grad():
        seen, dropped = (sparrow_train.head_passes(head, embed, sparrow_train.collate([ex], [d], "cpu"), 1)
                         for d in (False, True))
    for k in range(2):
        torch.testing.assert_close(seen[k][0, :first_after], dropped[k][0, :first_after])
        assert (seen[k][0, first_after:] - dropped[k][0, first_after:]).abs().amax(-1).min() > 1e-4


def test_cached_target_answers_are_keyed_by_the_target_weights(tmp_path):
    """The answers train-sparrow caches for a target are not reused once the target's weights
    change in the same folder (a fine-tuned demo target): the cache file's name changes."""
    import os

    from lvspec_eval.training.sparrow import default_data_path

    folder = tmp_path / "target"
    folder.mkdir()
    weights = folder / "model.safetensors"
    weights.write_bytes(b"0" * 16)
    args = argparse.Namespace(target=str(folder), videos=None, frames=8, size=112, seed_offset=0, max_new_tokens=96)
    before = default_data_path(args)
    assert default_data_path(args) == before
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1_000_000))
    assert default_data_path(args) != before
    assert default_data_path(argparse.Namespace(**{**vars(args), "target": "org/hub-model"})).name.startswith(
        "data_hub-model_f8")
