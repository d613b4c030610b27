"""Qwen3-VL specifics the shared suites cannot see (the shared ones run it through the `family`
fixture: prefill, two-part and pruned prefill against transformers' own forward, trees, lossless).

Here: timestamps and the prompt text against transformers' processor code, hidden states read
after DeepStack's addition, a draft that uses its own tower and DeepStack while Self-SD reuses the
target's, DeepStack rows handed to exactly the part of a prefill that holds them, original frame
indices travelling through VideoInput, and the MoE text model.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from transformers import Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration
from transformers.models.qwen3_vl.processing_qwen3_vl import Qwen3VLProcessor

from lvspec_eval.backends.loading import load_backend
from lvspec_eval.backends.qwen3_vl import DEEPSTACK, frame_timestamps
from lvspec_eval.decoding import loop, methods
from lvspec_eval.decoding.runner import VideoInput

from conftest import INIT_RANGE, TOKENIZER_DIR, qwen3_config, save_qwen3

ATOL = 1e-4


def _video(seed=0, t=5, h=70, w=90):
    return np.random.default_rng(seed).integers(0, 256, size=(t, h, w, 3), dtype=np.uint8)


@pytest.mark.parametrize("indices,fps", [([0, 15, 30], 30.0), ([0, 1, 2, 3], 2.0), ([3, 40, 77, 120, 163], 29.97)])
def test_timestamps_follow_transformers(indices, fps):
    proc = Qwen3VLProcessor.__new__(Qwen3VLProcessor)
    assert frame_timestamps(indices, fps, 2) == proc._calculate_timestamps(list(indices), fps, 2)


def test_prompt_text_is_the_processors(qwen3_family):
    """Our text equals transformers 5.24's replace_video_token + its pad replacement, original
    frame indices and native fps included."""
    backend = qwen3_family.target
    frames, indices, native = _video(1), np.array([2, 30, 58, 86, 114]), 29.97
    inputs = backend.prepare("describe the video", [(frames, 4.0, indices, native)])
    grid = inputs.model_kwargs["video_grid_thw"]
    fake = SimpleNamespace(video_processor=SimpleNamespace(merge_size=2, temporal_patch_size=2),
                           _calculate_timestamps=Qwen3VLProcessor.__new__(Qwen3VLProcessor)._calculate_timestamps,
                           vision_start_token="<|vision_start|>", vision_end_token="<|vision_end|>",
                           video_token="<|video_pad|>")
    meta = SimpleNamespace(fps=native, frames_indices=indices)
    block = Qwen3VLProcessor.replace_video_token(fake, {"video_grid_thw": grid, "video_metadata": [meta]}, 0)
    template = backend.tokenizer.apply_chat_template(
        [{"role": "user", "content": [{"type": "video"}, {"type": "text", "text": "describe the video"}]}],
        add_generation_prompt=True, tokenize=False)
    want = backend.tokenizer(template.replace("<|video_pad|>", block, 1), add_special_tokens=False).input_ids
    assert inputs.input_ids[0].tolist() == want


def test_video_input_carries_original_indices(qwen3_family):
    """The same frames, indices 0, 30, 60, 90, from a 30 fps and a 10 fps file: the timestamps come
    from the original indices and the native rate (VideoInput.request), not from the sampled rate."""
    frames = _video(2, t=4)
    a = VideoInput(frames, 1.0, np.array([0, 30, 60, 90]), 30.0).request()
    b = VideoInput(frames, 1.0, np.array([0, 30, 60, 90]), 10.0).request()
    ids_a = qwen3_family.target.prepare("what", [a]).input_ids
    ids_b = qwen3_family.target.prepare("what", [b]).input_ids
    assert not torch.equal(ids_a, ids_b)
    text = qwen3_family.target.tokenizer.decode(ids_b[0])
    assert "<1.5 seconds>" in text and "<7.5 seconds>" in text  # (0 + 3) / 2 and (6 + 9) / 2 seconds


def test_hidden_states_are_read_after_deepstack(qwen3_family):
    """Layer k's rows are what layer k + 1 gets: after DeepStack for k <= its layers. The visual
    rows captured at layer 1 minus transformers' own layer-1 output are DeepStack's first feature."""
    backend = qwen3_family.target
    inputs = backend.prepare("describe", [(_video(3), 2.0)])
    state, _ = backend.prefill(inputs, hidden_layers=(1, 2, 3))
    backend.model.model.rope_deltas = None
    ids = inputs.input_ids
    with torch.no_grad():
        out = backend.model(**qwen3_family.hf_kwargs(backend, inputs, ids), output_hidden_states=True,
                            return_dict=True)
        kw = inputs.model_kwargs
        ds = backend.model.model.get_video_features(kw["pixel_values_videos"], kw["video_grid_thw"],
                                                    return_dict=True).deepstack_features
    vmask = inputs.visual_mask
    hf = out.hidden_states  # [embeddings, layer 1, ...]: decoder outputs before DeepStack's addition
    for layer, feature in ((1, ds[0]), (2, ds[1])):
        torch.testing.assert_close(state.visual_hidden[layer], hf[layer][0, vmask] + torch.cat(feature),
                                   atol=ATOL, rtol=0)
        torch.testing.assert_close(state.prompt_hidden[layer][~vmask], hf[layer][0, ~vmask], atol=ATOL, rtol=0)
    # The last layer, past DeepStack: what the final norm gets (transformers records it normed).
    with torch.no_grad():
        torch.testing.assert_close(backend.text_model().norm(state.prompt_hidden[3]), hf[3][0], atol=ATOL, rtol=0)


def test_one_prefill_gives_deepstack_to_the_video_rows_and_scores_only_video_pads(qwen3_family):
    """The prefill that also keeps the pruning queries is one forward: DeepStack reaches exactly the
    video pads' rows there, and the pruning scores cover the video pads alone (not the timestamps
    and markers that sit between frames in the visual span)."""
    backend = qwen3_family.target
    inputs = backend.prepare("describe the ball", [(_video(4), 2.0)])
    calls = []
    handle = backend.text_model().register_forward_pre_hook(
        lambda _m, _a, kw: calls.append((kw["inputs_embeds"].shape[1], kw.get("visual_pos_masks"))), with_kwargs=True)
    try:
        state, _ = backend.prefill(inputs, visual_attention=True)
    finally:
        handle.remove()
    [(length, rows)] = calls
    assert length == inputs.input_ids.shape[1]
    assert torch.equal(rows[0].cpu(), inputs.visual_mask)
    lo, hi = inputs.visual_span
    assert hi - lo > inputs.num_visual_tokens  # the span holds timestamps and markers too
    assert backend.visual_attention(state).shape == (inputs.num_visual_tokens,)


def test_draft_uses_its_own_tower_and_self_sd_reuses_the_targets(qwen3_family):
    target, draft = qwen3_family.target, qwen3_family.draft
    inputs = target.prepare("describe", [(_video(5), 2.0)])
    target.prefill(inputs)
    assert len(inputs.extra[DEEPSTACK]) == 2
    adopted = draft.adopt_inputs(inputs, target)
    assert not any(k.startswith("embeds") for k in adopted.extra)
    _, logits = draft.prefill(adopted)
    assert len(adopted.extra[DEEPSTACK]) == 1  # the draft's own DeepStack (one layer)
    draft.model.model.rope_deltas = None
    with torch.no_grad():
        ref = draft.model(**qwen3_family.hf_kwargs(draft, adopted, adopted.input_ids)).logits[0, -1]
    torch.testing.assert_close(logits, ref, atol=ATOL, rtol=0)
    # Self-SD: the target's pruned prefill runs no vision tower again.
    runs = []
    handle = target.model.model.visual.register_forward_hook(lambda *_: runs.append(1))
    try:
        target.prefill(inputs, keep_visual=torch.arange(0, inputs.num_visual_tokens, 2))
    finally:
        handle.remove()
    assert runs == []


@pytest.mark.parametrize("method", ["sd_tree", "specvlm"])
def test_moe_text_model_loads_and_stays_lossless(tmp_path, method):
    """qwen3_vl_moe loads through the same backend; its exact methods equal vanilla."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    cfg = qwen3_config(tok, 64, 2).to_dict()
    text = {**cfg["text_config"], "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32,
            "decoder_sparse_step": 1}
    text.pop("model_type", None)
    config = Qwen3VLMoeConfig(text_config=text, vision_config={k: v for k, v in cfg["vision_config"].items()
                                                                if k != "model_type"},
                              image_token_id=cfg["image_token_id"], video_token_id=cfg["video_token_id"],
                              vision_start_token_id=cfg["vision_start_token_id"],
                              vision_end_token_id=cfg["vision_end_token_id"], initializer_range=INIT_RANGE)
    torch.manual_seed(7)
    save_qwen3(Qwen3VLMoeForConditionalGeneration(config).eval(), tok, tmp_path)
    backend = load_backend(str(tmp_path))
    videos = [(_video(6, t=3), 2.0)]
    outs = {}
    for name in ("vanilla", method):
        spec = methods.resolve(name)
        drafter, verifier = methods.build(spec, methods.make_options(spec, {"tree": "chain", "tree_depth": 3}),
                                          None, backend)
        outs[name] = loop.generate(backend, drafter, verifier, "describe the video", videos, 8).tokens
    assert outs[method] == outs["vanilla"] and len(outs["vanilla"]) > 0


# ---- every method; train-sparrow --------------------------------------------------------------

def _run(backend, draft, method: str, videos, options=None, max_new=10):
    spec = methods.resolve(method)
    drafter, verifier = methods.build(spec, methods.make_options(spec, options or {}), draft, backend)
    return loop.generate(backend, drafter, verifier, "describe the video", videos, max_new)


QWEN3_FAMILIES = ("qwen3_family", "qwen3_5_family")  # Qwen3.5: the same loop over Gated DeltaNet layers


@pytest.mark.parametrize("fixture", QWEN3_FAMILIES)
@pytest.mark.parametrize("method,options", [
    ("fly", {"fly_entropy": float("inf"), "fly_k": 6}),  # loose rules off: a mismatch is never salvaged
    ("lvspec", {"lv_threshold": -1.0, "pst": "off", "lv_lambda": 0.0}),  # every token an anchor: strict
])
def test_loose_methods_with_their_rules_off_equal_vanilla(fixture, method, options, request):
    """Exact when their rules are off: chains (FLy) and re-fed tokens roll every layer's cache back,
    the Gated DeltaNet states of Qwen3.5 included."""
    family = request.getfixturevalue(fixture)
    videos = [(_video(8, t=4), 2.0)]
    want = _run(family.target, None, "vanilla", videos).tokens
    for draft in (family.draft, None):
        assert _run(family.target, draft, method, videos, options).tokens == want


@pytest.mark.parametrize("fixture", QWEN3_FAMILIES)
@pytest.mark.parametrize("method", ["fly", "lvspec"])
def test_loose_methods_run_with_their_rules_on(fixture, method, request):
    family = request.getfixturevalue(fixture)
    out = _run(family.target, family.draft, method, [(_video(9, t=4), 2.0)])
    assert len(out.tokens) > 0 and len(out.kinds) == len(out.tokens)


@pytest.mark.slow
def test_train_sparrow_on_a_qwen3_target_drives_sparrow_like_vanilla(qwen3_family, tmp_path):
    from test_sparrow_any_target import VIDEOS, _train, write_mp4
    from lvspec_eval.models.video import load_video
    from lvspec_eval.decoding.runner import Runner

    videos = tmp_path / "videos"
    for seed, (name, frames, fps, height, width) in enumerate(VIDEOS):
        write_mp4(videos / name, frames, fps, height, width, seed)
    target = str(qwen3_family.target.model.name_or_path)
    assert _train(target, videos, tmp_path / "head") == 0
    backend = load_backend(target, video_rule="lmms_eval")
    vanilla = Runner(target, method="vanilla", video_rule="lmms_eval", target_backend=backend)
    sparrow = Runner(target, method="sparrow", options={"sparrow_head": str(tmp_path / "head")},
                     video_rule="lmms_eval", target_backend=backend)
    for name, *_ in VIDEOS:
        video = load_video(videos / name, plan=backend.frame_plan(None, 4))
        assert video.indices is not None and video.native_fps is not None
        ref = vanilla.generate("describe the video", [video], 16)
        out = sparrow.generate("describe the video", [video], 16)
        assert out.tokens == ref.tokens and out.stats["method"] == "sparrow", name


# ---- video rules --------------------------------------------------------------------------------

def test_lmms_eval_rule_is_lmms_evals_qwen3_vl_class(qwen3_family):
    """lmms-eval 0.7.3 qwen3_vl: its system turn, nframes=32 (even spread), qwen-vl-utils'
    smart_resize with image_patch_size=16 (factor 32), min_pixels 256*28*28, max_pixels 1,605,632,
    capped at 768 tokens and an even share of 90% of 128,000 tokens per frame pair; no second resize."""
    import math

    from lvspec_eval.backends.qwen_vision import frame_size, smart_resize

    backend = load_backend(str(qwen3_family.target.model.name_or_path), video_rule="lmms_eval")
    cfg = backend.preprocess
    assert (cfg.factor, cfg.min_pixels, cfg.max_pixels, cfg.processor_pixels) == (32, 256 * 28 * 28, 1605632, None)
    assert cfg.image_mean == cfg.image_std == (0.5, 0.5, 0.5) and not cfg.clip_budget
    assert len(backend.frame_plan(None, None).indices(300, 30.0)) == 32
    for h, w, t in ((720, 1280, 32), (480, 640, 8), (1080, 1920, 32)):
        factor = 32
        cap = max(min(768 * factor ** 2, 128000 * factor ** 2 * 0.9 / t * 2), int(256 * 28 * 28 * 1.05))
        assert frame_size(h, w, t, cfg) == smart_resize(h, w, factor, 256 * 28 * 28, min(1605632, cap))
        hb, wb = frame_size(h, w, t, cfg)
        assert hb % 32 == 0 and wb % 32 == 0 and math.isfinite(hb * wb)
    assert backend.frame_plan(None, None, "simple").indices(300, 30.0).tolist() == \
        backend.frame_plan(None, None, "chat").indices(300, 30.0).tolist()
    # its system turn, which the models layer puts before the task's turns (models/parity.py)
    import ast
    import importlib.util

    from lvspec_eval.models.parity import class_rules

    # read from its source: the module imports decord, which is not installed here
    source = importlib.util.find_spec("lmms_eval.models.simple.qwen3_vl").origin
    init = next(n for n in ast.walk(ast.parse(open(source).read())) if isinstance(n, ast.FunctionDef)
                and n.name == "__init__")
    names = [a.arg for a in init.args.args][-len(init.args.defaults):]
    default = ast.literal_eval(init.args.defaults[names.index("system_prompt")])
    assert class_rules(backend.family, "chat", "class").chat_system_prompt == default


def test_fps_rule_budgets_the_whole_clip(qwen3_family):
    """Rule fps: the checkpoint's video processor limits bound frames x pixels (transformers 5.24
    Qwen3VLVideoProcessor.resize without cap_pixels_per_frame), so more frames get smaller ones."""
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import smart_resize as hf_smart_resize

    from lvspec_eval.backends.qwen_vision import frame_size

    cfg = qwen3_family.target.preprocess
    assert cfg.clip_budget and (cfg.min_pixels, cfg.max_pixels) == (32 * 32, 4 * 96 * 96)
    for t, h, w in ((2, 90, 120), (4, 90, 120), (8, 90, 120), (6, 20, 300)):
        assert frame_size(h, w, t, cfg) == hf_smart_resize(t, h, w, 2, 32, cfg.min_pixels, cfg.max_pixels)
    assert frame_size(90, 120, 8, cfg)[0] * frame_size(90, 120, 8, cfg)[1] < \
        frame_size(90, 120, 2, cfg)[0] * frame_size(90, 120, 2, cfg)[1]


# ---- dry-run ----------------------------------------------------------------------------------

def test_dry_run_counts_a_qwen3_vl_prompt(qwen3_family, capsys, tmp_path):
    from test_failures import dry_run
    from test_sparrow_any_target import write_mp4

    from lvspec_eval.models.video import load_video

    folder = str(qwen3_family.target.model.name_or_path)
    video = tmp_path / "v.mp4"
    write_mp4(video, 40, 12.5, 64, 96, seed=1)  # 40 frames at 12.5 fps: indices and native rate both matter
    code, out = dry_run(capsys, f"pretrained={folder},method=vanilla,video_rule=lmms_eval", str(video))
    line = next(l for l in out.splitlines() if "chat template pretrained=" in l)
    assert line.startswith("OK") and "renders a video" in line, out
    # the same video as a loaded backend gets it (timestamps from its original indices)
    backend = load_backend(folder, video_rule="lmms_eval")
    inputs = backend.prepare("Describe the video.", [load_video(video, plan=backend.frame_plan(None, None)).request()])
    assert f"{inputs.num_visual_tokens} visual tokens, {inputs.input_ids.shape[1]} prompt tokens" in line


def test_qwen_vl_utils_rule_resizes_once_with_32_px_tokens(qwen3_family):
    from lvspec_eval.backends.qwen_vision import frame_size, smart_resize

    cfg = load_backend(str(qwen3_family.target.model.name_or_path), video_rule="qwen_vl_utils").preprocess
    assert (cfg.factor, cfg.min_pixels, cfg.max_pixels, cfg.processor_pixels) == (32, 128 * 32 * 32, 768 * 32 * 32,
                                                                                   None)
    cap = max(min(768 * 32 * 32, 128000 * 32 * 32 * 0.9 / 64 * 2), int(128 * 32 * 32 * 1.05))
    assert frame_size(720, 1280, 64, cfg) == smart_resize(720, 1280, 32, 128 * 32 * 32, min(768 * 32 * 32, cap))
