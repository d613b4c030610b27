"""Qwen3.5 outside the engine: lmms-eval's qwen3_5 class's video rule and defaults, the thinking switch,
vanilla decoding equal to transformers' generate (dense and MoE), and the MoE text model through the exact
methods. Side by side with lmms-eval's own classes: tests/test_parity.py; the hybrid cache contract:
tests/test_linear_state.py and tests/test_lossless.py.
"""
from __future__ import annotations

import ast
import importlib.util

import numpy as np
import pytest
import torch
from conftest import INIT_RANGE, TOKENIZER_DIR, qwen3_5_config, save_qwen3
from transformers import (
    AutoTokenizer,
    Qwen3_5MoeConfig,
    Qwen3_5MoeForConditionalGeneration,
)

from lvspec_eval.backends.loading import load_backend
from lvspec_eval.backends.qwen_vision import LMMS_EVAL_QWEN3_5, frame_size, smart_resize
from lvspec_eval.decoding import loop, methods
from lvspec_eval.models.args import ModelArgs, read_gen_kwargs
from lvspec_eval.models.parity import class_rules, final_answer, thinking_mode


def _video(seed=0, t=5, h=70, w=90):
    return np.random.default_rng(seed).integers(0, 255, (t, h, w, 3), dtype=np.uint8)


def class_defaults(module: str, cls: str | None = None) -> tuple[dict, dict]:
    """(__init__ keyword defaults, DEFAULT_GEN_KWARGS) of an lmms-eval class, read from its source (the
    module imports decord, which is not installed here)."""
    with open(importlib.util.find_spec(module).origin) as f:
        tree = ast.parse(f.read())
    body = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and (cls is None or n.name == cls)).body
    init = next(n for n in body if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    names = [a.arg for a in init.args.args][-len(init.args.defaults):]
    values = {}
    for name, node in zip(names, init.args.defaults):
        try:
            values[name] = ast.literal_eval(node)
        except ValueError:  # 64 * 32 * 32 and the like
            values[name] = eval(compile(ast.Expression(node), "<default>", "eval"))
    gen = next(n for n in body if isinstance(n, ast.Assign) and n.targets[0].id == "DEFAULT_GEN_KWARGS")
    return values, ast.literal_eval(gen.value)


# ---- rule lmms_eval: lmms-eval's qwen3_5 class ------------------------------------------------------

def test_lmms_eval_rule_is_lmms_evals_qwen3_5_class(qwen3_5_family):
    """lmms-eval 0.7.3 qwen3_5: min_pixels 64*32*32 and total_pixels 224*1024*32*32 per video, 768 frames at
    most; with total_pixels set, qwen3_vl's _build_video_kwargs asks qwen-vl-utils for max_frames, not
    nframes, so it samples 2 frames per second, caps each frame at 768 tokens and shares the budget."""
    init, _ = class_defaults("lmms_eval.models.simple.qwen3_5")
    assert (LMMS_EVAL_QWEN3_5.min_pixels, LMMS_EVAL_QWEN3_5.total_pixels, LMMS_EVAL_QWEN3_5.max_frames) == \
        (init["min_pixels"], init["total_pixels"], init["max_num_frames"])
    backend = load_backend(str(qwen3_5_family.target.model.name_or_path), video_rule="lmms_eval")
    cfg = backend.preprocess
    assert (cfg.factor, cfg.min_pixels, cfg.max_pixels, cfg.total_pixels, cfg.processor_pixels) == \
        (32, 64 * 32 * 32, 768 * 32 * 32, 224 * 1024 * 32 * 32, None)
    for interface in ("chat", "simple"):
        plan = backend.frame_plan(None, None, interface)
        assert len(plan.indices(300, 30.0)) == 20  # 10 s at 2 per second (Qwen3-VL's class: 32)
        assert plan.indices(9, 4.0).tolist() == [0, 3, 5, 8]  # 2.25 s: 4 frames, at least 4
        assert len(plan.indices(2 * 3600 * 30, 30.0)) == 768  # two hours: the class's max_num_frames
        assert len(plan.indices(3, 30.0)) == 2  # fewer than 4: what the clip has, even
    assert len(backend.frame_plan(1.0, 10).indices(300, 30.0)) == 10  # the user's fps and max_frames win
    for h, w, t in ((720, 1280, 768), (720, 1280, 20), (100, 140, 4), (1080, 1920, 400)):
        cap = max(min(768 * 32 ** 2, 224 * 1024 * 32 ** 2 / t * 2), int(64 * 32 * 32 * 1.05))
        assert frame_size(h, w, t, cfg) == smart_resize(h, w, 32, 64 * 32 * 32, cap)
    assert frame_size(720, 1280, 768, cfg)[0] * frame_size(720, 1280, 768, cfg)[1] < 768 * 32 ** 2  # the budget
    assert frame_size(100, 140, 4, cfg) == (224, 320)  # small frames grow to 64 tokens at least


def test_parity_rows_are_the_qwen3_5_classes_defaults():
    init, gen = class_defaults("lmms_eval.models.simple.qwen3_5")
    base, _ = class_defaults("lmms_eval.models.simple.qwen3_vl", "Qwen3_VL")
    for interface in ("chat", "simple"):
        rules = class_rules("qwen3_5", interface, "class")
        assert rules.max_new_tokens == gen["max_new_tokens"] == 1024 and rules.temperature == gen["temperature"]
        assert rules.thinking is init["enable_thinking"] is True and rules.thinking_switch
        assert rules.until == ("ignore" if interface == "chat" else "no_blank_line")
    assert class_rules("qwen3_5", "chat", "class").chat_system_prompt == base["system_prompt"]
    assert class_rules("qwen3_5", "chat", "class").reference == "lmms_eval.models.chat.qwen3_5.Qwen3_5"
    # a task without a temperature: the class samples (0.7), lvspec decodes greedily and says so
    assert read_gen_kwargs({}, 1024, 0.7).sampling_ignored
    assert not read_gen_kwargs({"temperature": 0}, 1024, 0.7).sampling_ignored
    assert not read_gen_kwargs({}, 128).sampling_ignored


# ---- thinking -------------------------------------------------------------------------------------

def test_thinking_switch():
    assert thinking_mode("qwen3_5", "chat", None) is True  # the class's enable_thinking=True
    assert thinking_mode("qwen3_5", "simple", "off") is False
    assert thinking_mode("qwen3_vl", "chat", None) is None  # the qwen3_vl class passes none
    assert thinking_mode("qwen3_vl", "simple", "on") is True
    with pytest.raises(ValueError, match="no thinking switch"):
        thinking_mode("qwen2_5_vl", "chat", "on")
    assert ModelArgs.parse({"pretrained": "demo", "thinking": True}).thinking == "on"  # lmms-eval's `true`
    assert ModelArgs.parse({"pretrained": "demo", "thinking": "OFF"}).thinking == "off"
    with pytest.raises(ValueError, match="thinking='maybe'"):
        ModelArgs.parse({"pretrained": "demo", "thinking": "maybe"})
    # lmms-eval's _strip_thinking: what follows the first </think>, stripped; nothing when it never closed
    assert final_answer("<think>\nhm</think>\n\n B. red </think>", True) == "B. red </think>"
    assert final_answer("still thinking about it", True) == ""
    assert final_answer("<think>\n\n</think>\n\nA", False) == "<think>\n\n</think>\n\nA"
    assert final_answer(" A ", None) == " A "


def test_thinking_renders_the_templates_switch(tmp_path):
    """The models layer hands enable_thinking to the checkpoint's template (a Qwen3.5-style one here)."""
    from parity_checkpoints import QWEN3_5_TEMPLATE

    from lvspec_eval.backends.chat_template import render_text

    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    tok.chat_template = QWEN3_5_TEMPLATE
    msgs = [{"role": "system", "content": "Be brief."},
            {"role": "user", "content": [{"type": "video"}, {"type": "text", "text": " what colour "}]}]
    on, off, default = (render_text(tok, msgs, 1, **kw) for kw in ({"enable_thinking": True},
                                                                     {"enable_thinking": False}, {}))
    head = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n<|vision_start|><|video_pad|><|vision_end|>"
    assert on == default == head + " what colour<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert off == head + " what colour<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


# ---- vanilla = transformers' generate; MoE --------------------------------------------------------

def build_moe(path, seed: int = 7):
    """A tiny Qwen3.5-MoE: the dense fixture's shapes with a sparse MLP (4 experts, 2 a token, a shared one)."""
    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    cfg = qwen3_5_config(tok, 64, 4).to_dict()
    text = {k: v for k, v in cfg["text_config"].items() if k not in ("model_type", "intermediate_size")}
    text.update(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=32)
    vision = {k: v for k, v in cfg["vision_config"].items() if k != "model_type"}
    config = Qwen3_5MoeConfig(text_config=text, vision_config=vision, image_token_id=cfg["image_token_id"],
                              video_token_id=cfg["video_token_id"], vision_start_token_id=cfg["vision_start_token_id"],
                              vision_end_token_id=cfg["vision_end_token_id"], tie_word_embeddings=False,
                              initializer_range=INIT_RANGE)
    torch.manual_seed(seed)
    save_qwen3(Qwen3_5MoeForConditionalGeneration(config).eval(), tok, path)
    return path


@pytest.fixture(scope="module")
def moe_backend(tmp_path_factory):
    backend = load_backend(str(build_moe(tmp_path_factory.mktemp("qwen3_5_moe"))))
    assert type(backend.model).__name__ == "Qwen3_5MoeForConditionalGeneration" and backend.family == "qwen3_5"
    return backend


def _generate(backend, method: str, videos, max_new: int, options=None, draft=None):
    spec = methods.resolve(method)
    drafter, verifier = methods.build(spec, methods.make_options(spec, options or {}), draft, backend)
    return loop.generate(backend, drafter, verifier, "describe the video", videos, max_new)


def transformers_greedy(backend, videos, max_new: int) -> list[int]:
    """transformers' generate on the processor's inputs (video pads marked 2 in mm_token_type_ids)."""
    inputs = backend.prepare("describe the video", videos)
    ids = inputs.input_ids
    out = backend.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **inputs.model_kwargs,
                                 mm_token_type_ids=(ids == backend.video_token_id).int() * 2,
                                 max_new_tokens=max_new, do_sample=False, pad_token_id=0)
    return out[0, ids.shape[1]:].tolist()


@pytest.mark.parametrize("which", ["dense", "moe"])
def test_vanilla_is_transformers_greedy(qwen3_5_family, moe_backend, which):
    """float32: the engine's vanilla decoding (prefill, then one-token steps through the hybrid cache
    contract) gives transformers' own greedy tokens (its chunked prefill and recurrent steps)."""
    backend = qwen3_5_family.target if which == "dense" else moe_backend
    videos = [(_video(3, t=4), 2.0)]
    mine = _generate(backend, "vanilla", videos, 16).tokens
    theirs = transformers_greedy(backend, videos, 16)
    assert len(mine) > 4 and mine == theirs[: len(mine)]


@pytest.mark.parametrize("method", ["sd_tree", "specvlm"])
def test_moe_text_model_stays_lossless(moe_backend, method):
    """qwen3_5_moe through the exact methods (its own layers as the draft, a chain): vanilla's tokens."""
    videos = [(_video(6, t=3), 2.0)]
    want = _generate(moe_backend, "vanilla", videos, 10).tokens
    got = _generate(moe_backend, method, videos, 10, {"tree": "chain", "tree_depth": 3}).tokens
    assert got == want and len(want) > 0


@pytest.mark.parametrize("tree", ["chain", "dynamic"])
def test_a_dense_draft_on_the_moe_target_is_lossless(qwen3_5_family, moe_backend, tree):
    """sd_tree with the dense fixture's small Qwen3.5 as the draft of the MoE target: vanilla's tokens."""
    videos = [(_video(4, t=4), 2.0)]
    want = _generate(moe_backend, "vanilla", videos, 12).tokens
    out = _generate(moe_backend, "sd_tree", videos, 12, {"tree": tree, "tree_depth": 3}, draft=qwen3_5_family.draft)
    assert out.tokens == want and len(want) > 0
    assert sum(s.num_draft_nodes for s in out.stats.steps) > 0  # the draft did propose


# ---- dry-run: tokens and the hybrid cache ----------------------------------------------------------

def test_dry_run_counts_a_qwen3_5_prompt_and_its_fixed_state(qwen3_5_family, capsys, tmp_path):
    """dry-run loads a Qwen3.5 folder (no refusal), counts the tokens a loaded backend gets under the
    qwen3_5 class's rule, and prints the KV of the attention layers beside the linear layers' fixed state."""
    from test_failures import dry_run
    from test_sparrow_any_target import write_mp4

    from lvspec_eval.measure.cache_memory import cache_memory
    from lvspec_eval.models.video import load_video

    folder = str(qwen3_5_family.target.model.name_or_path)
    video = tmp_path / "v.mp4"
    write_mp4(video, 40, 12.5, 64, 96, seed=1)  # 3.2 s: 6 frames at 2 per second
    code, out = dry_run(capsys, f"pretrained={folder},method=sd_tree,draft=self", str(video))
    line = next(l for l in out.splitlines() if "chat template pretrained=" in l)
    assert code == 0 and line.startswith("OK") and "renders a video" in line, out
    backend = load_backend(folder, video_rule="lmms_eval")
    loaded = load_video(video, plan=backend.frame_plan(None, None))
    assert len(loaded.frames) == 6
    inputs = backend.prepare("Describe the video.", [loaded.request()])
    n = inputs.input_ids.shape[1]
    assert f"{inputs.num_visual_tokens} visual tokens, {n} prompt tokens" in line
    memory = cache_memory(backend.model.config.get_text_config(), 4)  # float32 on the CPU
    assert (memory.full_layers, memory.linear_layers) == (2, 2)  # the fixture: linear, full, linear, full
    assert "2 attention layers" in line and "fixed state (2 Gated DeltaNet layers)" in line
    # the fixed state: 4 value heads x 8 x 8 in float32, and a 4-input window of 2*2*8 + 4*8 channels
    assert memory.state == 2 * (4 * 8 * 8 * 4 + (2 * 2 * 8 + 4 * 8) * 4 * 4)
    assert memory.kv_per_token == 2 * 2 * 2 * 16 * 4  # K and V, 2 layers, 2 KV heads of 16, float32


def test_dry_run_pairs_a_dense_draft_with_an_moe_target(qwen3_5_family, moe_backend, capsys):
    """A Qwen3.5 draft serves a Qwen3.5-MoE target (one family and layout; runner.check_pairing agrees)."""
    from test_failures import dry_run

    from lvspec_eval.decoding.runner import check_pairing

    moe, dense = moe_backend.model.name_or_path, qwen3_5_family.draft.model.name_or_path
    _, out = dry_run(capsys, f"pretrained={moe},draft={dense},method=sd_tree")
    line = next(l for l in out.splitlines() if " pairing:" in l)
    assert line.startswith("OK") and "shares tokenizer and layout" in line, out
    check_pairing(moe_backend, qwen3_5_family.draft, moe, dense)  # raises on a mismatch
