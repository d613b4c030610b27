"""drafter=mtp: the checkpoint's own multi-token-prediction layer (drafters/mtp.py).

Tiny random Qwen3.5 checkpoints (transformers' Qwen3_5ForConditionalGeneration, save_pretrained)
get `mtp.*` tensors written into their safetensors in the public key layout, in the one file or
as a second shard with an index, as the public checkpoints do. Checked:
- loading picks every `mtp.*` key (strict), from either layout; a checkpoint without them, or
  with a key missing, is refused with a clear error;
- the head's forward, as the drafter runs it over a prompt with a video and then a generated token
  and a draft token, equals an independent computation of the MTP formula
  norm(layer(fc([rms(embed(x_{s+1})); rms(h_s)]))) at the target's positions of row s, the layer
  run by a separate transformers text model holding the mtp.layers.0 weights;
- method=mtp (chains, trees of width > 1, the adaptive policy) is token-identical to vanilla;
- in the loop, with drafts accepted and committed tokens left pending, what the head has fed for
  good is the formula over prompt + answer with the target's true hidden states and positions.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch
from conftest import (
    INIT_RANGE,
    build_qwen3_5_checkpoint,
    build_qwen3_checkpoint,
    random_case,
)
from safetensors.torch import load_file, save_file
from test_sparrow import HalfCachedExact, OracleDrafts
from transformers import AutoConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextModel

from lvspec_eval.backends.base import FINAL
from lvspec_eval.backends.loading import load_backend
from lvspec_eval.decoding import loop, methods
from lvspec_eval.decoding.drafters.mtp import MTPDrafter, MTPHead
from lvspec_eval.decoding.tree import TreeConfig

MAX_NEW = 12


def public_mtp_shapes(text) -> dict[str, tuple]:
    """The `mtp.*` keys and shapes of a dense Qwen3.5 checkpoint (one MTP layer: gated full attention
    with q/k norms, a SwiGLU MLP; fc without bias)."""
    h, hd, inter = text.hidden_size, text.head_dim, text.intermediate_size
    q, kv = text.num_attention_heads * hd, text.num_key_value_heads * hd
    layer = {"input_layernorm.weight": (h,), "post_attention_layernorm.weight": (h,),
             "self_attn.q_proj.weight": (2 * q, h), "self_attn.k_proj.weight": (kv, h),
             "self_attn.v_proj.weight": (kv, h), "self_attn.o_proj.weight": (h, q),
             "self_attn.q_norm.weight": (hd,), "self_attn.k_norm.weight": (hd,),
             "mlp.gate_proj.weight": (inter, h), "mlp.up_proj.weight": (inter, h), "mlp.down_proj.weight": (h, inter)}
    return {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
            "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,),
            **{f"mtp.layers.0.{k}": v for k, v in layer.items()}}


def layer_shapes(folder) -> dict[str, tuple]:
    """The same keys for any target: its own full-attention layer's parameters (Qwen3-VL has no public
    MTP; the engine tests use one to run drafter=mtp on a non-hybrid target)."""
    text = AutoConfig.from_pretrained(folder).get_text_config()
    h = text.hidden_size
    backend = load_backend(str(folder))
    kinds = getattr(text, "layer_types", None) or ["full_attention"]
    layer = backend.text_model().layers[kinds.index("full_attention")]
    return {"mtp.fc.weight": (h, 2 * h), "mtp.pre_fc_norm_embedding.weight": (h,),
            "mtp.pre_fc_norm_hidden.weight": (h,), "mtp.norm.weight": (h,),
            **{f"mtp.layers.0.{k}": tuple(v.shape) for k, v in layer.state_dict().items()}}


def random_mtp(shapes: dict[str, tuple], seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: (torch.randn(s, generator=g) * (0.3 if len(s) == 1 else INIT_RANGE)).contiguous()
            for k, s in shapes.items()}


def add_mtp(folder, tensors: dict[str, torch.Tensor], sharded: bool) -> None:
    """Write `tensors` into the checkpoint at `folder`: into model.safetensors, or as a second shard
    (the first renamed, an index written)."""
    main = folder / "model.safetensors"
    if not sharded:
        save_file({**load_file(str(main)), **tensors}, str(main), metadata={"format": "pt"})
        return
    first, second = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
    weights = load_file(str(main))
    main.rename(folder / first)
    save_file(tensors, str(folder / second), metadata={"format": "pt"})
    weight_map = {**{k: first for k in weights}, **{k: second for k in tensors}}
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


@pytest.fixture(scope="module")
def mtp_targets(tmp_path_factory):
    """Qwen3.5 targets with MTP weights (in the one file; in a second shard) and one without."""
    root = tmp_path_factory.mktemp("mtp")
    plain = build_qwen3_5_checkpoint(root / "plain", 64, 4, seed=11)
    out = {"plain": plain}
    for name, sharded, seed in (("single", False, 1), ("sharded", True, 2)):
        folder = root / name
        shutil.copytree(plain, folder)
        text = AutoConfig.from_pretrained(folder).get_text_config()
        tensors = random_mtp(public_mtp_shapes(text), seed)
        add_mtp(folder, tensors, sharded)
        out[name] = folder
        out[name + "_tensors"] = tensors
    return out


@pytest.mark.parametrize("layout", ["single", "sharded"])
def test_loading_picks_every_key(mtp_targets, layout):
    backend = load_backend(str(mtp_targets[layout]))  # transformers itself leaves the mtp.* keys alone
    written = mtp_targets[layout + "_tensors"]
    head = MTPHead.load(backend)
    state = head.state_dict()
    assert {"mtp." + k for k in state} == set(written)
    for key, value in state.items():
        assert torch.equal(value, written["mtp." + key].to(value.dtype)), key
    assert head.fc.bias is None
    # the public layout is the target's own full-attention layer's
    assert set(public_mtp_shapes(backend.model.config.get_text_config())) == set(layer_shapes(mtp_targets[layout]))


def test_missing_mtp_weights_are_refused(mtp_targets, tmp_path):
    plain = load_backend(str(mtp_targets["plain"]))
    with pytest.raises(ValueError, match=r"no MTP weights \(mtp\.\* tensors\)"):
        MTPHead.load(plain)
    spec = methods.resolve("custom", "mtp", "exact")
    with pytest.raises(ValueError, match="no MTP weights"):
        methods.build(spec, methods.make_options(spec, {}), None, plain)
    # one key short: named in the error
    folder = tmp_path / "partial"
    shutil.copytree(mtp_targets["plain"], folder)
    tensors = dict(mtp_targets["single_tensors"])
    tensors.pop("mtp.layers.0.self_attn.k_norm.weight")
    add_mtp(folder, tensors, sharded=False)
    with pytest.raises(ValueError, match=r"missing \['mtp.layers.0.self_attn.k_norm.weight'\]"):
        MTPHead.load(plain, folder)
    # another checkpoint's MTP weights can be named (mtp_checkpoint=): plain target, single's MTP
    assert MTPHead.load(plain, mtp_targets["single"]) is not None
    with pytest.raises(ValueError, match="unknown MTP option"):
        methods.build(spec, methods.make_options(spec, {"mtp_chekpoint": "x"}), None, plain)


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3.5's RMSNorm: x / rms(x) * (1 + w)."""
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w.float())


def reference_mtp(backend, tensors, embeds, hidden, positions) -> torch.Tensor:
    """norm(layer(fc([rms_e(embeds); rms_h(hidden)]))) over rows [m] at `positions` [3, 1, m], causal;
    the layer and the output norm in a separate one-layer transformers text model (eager attention)."""
    text = backend.model.config.get_text_config()
    cfg = text.__class__.from_dict(text.to_dict())
    cfg.num_hidden_layers, cfg.layer_types = 1, ["full_attention"]
    cfg._attn_implementation = "eager"
    model = Qwen3_5TextModel(cfg).eval()
    state = {k[len("mtp."):]: v for k, v in tensors.items() if k.startswith("mtp.layers.")}
    state["norm.weight"] = tensors["mtp.norm.weight"]
    state["embed_tokens.weight"] = backend.model.get_input_embeddings().weight.detach()
    model.load_state_dict(state, strict=True)
    eps = text.rms_norm_eps
    x = torch.cat([_rms(embeds, tensors["mtp.pre_fc_norm_embedding.weight"], eps),
                   _rms(hidden, tensors["mtp.pre_fc_norm_hidden.weight"], eps)], dim=-1)
    x = x @ tensors["mtp.fc.weight"].float().T
    with torch.no_grad():
        return model(inputs_embeds=x[None], position_ids=positions).last_hidden_state[0]


def test_forward_is_the_mtp_formula(mtp_targets):
    """Prompt (video rows included, the target's embeddings and positions), the first generated
    token, then one draft token fed the MTP's own output one position further on."""
    backend = load_backend(str(mtp_targets["single"]))
    tensors = mtp_targets["single_tensors"]
    case = random_case(3, 96)
    inputs = backend.prepare(case.prompt, case.videos)
    assert inputs.num_visual_tokens > 0
    state, logits = backend.prefill(inputs, hidden_layers=(FINAL,))
    embeds, hidden = inputs.extra["embeds"][0].clone(), state.prompt_hidden[FINAL]
    positions = backend.prefill_positions(inputs)  # [3, 1, L]
    g0 = int(logits.argmax())
    drafter = MTPDrafter(MTPHead.load(backend), backend, TreeConfig("chain", depth=2))
    drafter.start(backend, inputs, state, loop.make_clock(backend.device))
    L = inputs.input_ids.shape[1]
    assert drafter.cache_len == L - 1 and drafter.head.config.num_hidden_layers == 1
    # the prompt: rows 0 .. L-2 feed tokens 1 .. L-1
    ref = reference_mtp(backend, tensors, embeds[1:], hidden[:-1], positions[..., :-1])
    torch.testing.assert_close(drafter.last[1], ref[-1], atol=1e-4, rtol=1e-4)
    # + the first generated token, fed with h of the last prompt row at that row's position
    _, out, tail = drafter._catch_up([g0])
    assert tail == 0
    g0_embed = backend.model.get_input_embeddings()(torch.tensor([g0]))
    rows_e = torch.cat([embeds[1:], g0_embed])
    rows_p = positions
    ref = reference_mtp(backend, tensors, rows_e, hidden, rows_p)
    torch.testing.assert_close(out, ref[-1], atol=1e-4, rtol=1e-4)
    # + a draft token: fed the MTP's own output as h, one position further on (all three axes)
    d1 = int(backend.lm_head(out).argmax())
    _, out2 = drafter._run(torch.tensor([d1]), out[None], torch.tensor([drafter.prompt_slots + 1]),
                           torch.ones(1, drafter.temp_len + 1, dtype=torch.bool))
    d1_embed = backend.model.get_input_embeddings()(torch.tensor([d1]))
    ref2 = reference_mtp(backend, tensors, torch.cat([rows_e, d1_embed]), torch.cat([hidden, ref[-1:]]),
                         torch.cat([rows_p, rows_p[..., -1:] + 1], dim=-1))
    torch.testing.assert_close(out2[0], ref2[-1], atol=1e-4, rtol=1e-4)


# ---- through the decoding loop ---------------------------------------------------------------------

def _run(backend, method, case, spec=(None, None), **options):
    spec = methods.resolve(method, *spec)
    drafter, verifier = methods.build(spec, methods.make_options(spec, options), None, backend)
    return loop.generate(backend, drafter, verifier, case.prompt, case.videos, MAX_NEW), drafter


@pytest.fixture(scope="module")
def qwen3_vl_mtp(tmp_path_factory):
    """A Qwen3-VL target with an MTP layer of its own kind (no public one: the engine path on a
    non-hybrid target)."""
    folder = build_qwen3_checkpoint(tmp_path_factory.mktemp("mtp_qwen3") / "target", 64, 3, seed=5)
    add_mtp(folder, random_mtp(layer_shapes(folder), seed=3), sharded=True)
    return load_backend(str(folder))


def _check_lossless(target, tree: str, max_side: int, extra: dict, custom_chain: bool = False) -> None:
    """drafter=mtp gives vanilla's tokens on two random cases; a fixed tree drafts every step, a
    dynamic one 3 wide. custom_chain: run the chain as method=custom,drafter=mtp,verifier=exact."""
    options = {"tree": tree, **extra}
    if tree == "dynamic":  # width > 1
        options.update(tree_depth=3, tree_topk=3, tree_total=8)
    for seed in range(2):
        case = random_case(seed, max_side)
        ref, _ = _run(target, "vanilla", case)
        if tree == "chain" and custom_chain:
            out, drafter = _run(target, "custom", case, spec=("mtp", "exact"), **options)
        else:
            out, drafter = _run(target, "mtp", case, **options)
        assert out.tokens == ref.tokens, (tree, seed)
        assert isinstance(drafter, MTPDrafter)
        nodes = [step.num_draft_nodes for step in out.stats.steps]
        if tree != "adaptive":
            assert min(nodes) > 0 and (max(nodes) > 3 if tree == "dynamic" else max(nodes) <= 8)
        if drafter.preparation is not None:
            assert out.stats.kept_visual_tokens == drafter.preparation.kept_visual_tokens


@pytest.mark.parametrize("tree", ["chain", "dynamic", "adaptive"])
def test_mtp_is_lossless_on_qwen3_vl(qwen3_vl_mtp, tree):
    _check_lossless(qwen3_vl_mtp, tree, 96, {})


@pytest.mark.parametrize("tree", ["chain", "dynamic", "adaptive"])
def test_mtp_is_lossless_on_qwen3_5(qwen3_5_family, mtp_targets, tree):
    """The hybrid target (Gated DeltaNet + full attention) of the family fixtures, its MTP layer
    read from a checkpoint of the same shape (mtp_checkpoint=)."""
    _check_lossless(qwen3_5_family.target, tree, qwen3_5_family.max_side,
                    {"mtp_checkpoint": str(mtp_targets["sharded"])}, custom_chain=True)


class _OracleMTP(OracleDrafts, MTPDrafter):
    pass


def test_fed_rows_are_the_formula_over_prompt_and_answer(qwen3_5_family, mtp_targets):
    target, folder = qwen3_5_family.target, mtp_targets["single"]
    case = random_case(4, qwen3_5_family.max_side)
    ref, _ = _run(target, "vanilla", case)
    drafter = _OracleMTP(MTPHead.load(target, folder), target, TreeConfig("chain", depth=3), reference=ref.tokens)
    out = loop.generate(target, drafter, HalfCachedExact(), case.prompt, case.videos, MAX_NEW)
    assert out.tokens == ref.tokens
    assert sum(step.num_accepted for step in out.stats.steps) > 0 and max(drafter.tails) > 0
    # the target's hidden states of prompt + answer, from one prefill and one forward over the answer
    inputs = target.prepare(case.prompt, case.videos)
    state, _ = target.prefill(inputs, hidden_layers=(FINAL,))
    embeds, positions = inputs.extra["embeds"][0], target.prefill_positions(inputs)
    n = drafter.num_fed  # generated tokens the head holds for good
    answer = torch.tensor(ref.tokens[:n])
    _, hidden = target.forward(state, answer, torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril(),
                               hidden_layers=(FINAL,))
    rows_e = torch.cat([embeds[1:], target.model.get_input_embeddings()(answer)])
    rows_h = torch.cat([state.prompt_hidden[FINAL], hidden[FINAL][: n - 1]])
    rows_p = torch.cat([positions, positions[..., -1:] + torch.arange(1, n)], dim=-1)
    expected = reference_mtp(target, mtp_targets["single_tensors"], rows_e, rows_h, rows_p)
    assert drafter.cache_len == len(expected)
    torch.testing.assert_close(drafter.last[1], expected[-1], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("tree", [{"tree": "chain", "tree_depth": 6},
                                  {"tree": "dynamic", "tree_depth": 4, "tree_topk": 4, "tree_total": 16}])
def test_syncs_per_step_are_few(qwen3_5_family, mtp_targets, tree, monkeypatch):
    """The host-sync budget of tests/test_host_sync.py holds for drafter=mtp (its M-RoPE positions
    are built on the device)."""
    from test_host_sync import MAX_PER_STEP, decode_counted

    from lvspec_eval.decoding.runner import Runner, VideoInput

    target = qwen3_5_family.target
    runner = Runner(str(mtp_targets["plain"]), "mtp", target_backend=target,
                    options={**tree, "mtp_checkpoint": str(mtp_targets["single"])})
    case = random_case(5, qwen3_5_family.max_side)
    record, where = decode_counted(runner, {"prompt": case.prompt, "video": VideoInput(*case.videos[0])}, monkeypatch)
    assert record["timed_steps"], "no decode step ran"
    assert record["host_syncs_max_step"] <= MAX_PER_STEP, f"{record['host_syncs_max_step']} syncs in one step: {where}"


def test_moe_mtp_layer_loads_per_expert_keys_and_stays_lossless(tmp_path):
    """A tiny Qwen3.5-MoE: its MTP layer is an MoE layer (router, experts, shared expert), stored one
    expert at a time as a serving engine also accepts; loaded into transformers' fused experts."""
    from conftest import TOKENIZER_DIR, qwen3_5_config, save_qwen3
    from transformers import (
        AutoTokenizer,
        Qwen3_5MoeConfig,
        Qwen3_5MoeForConditionalGeneration,
    )

    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    cfg = qwen3_5_config(tok, 64, 4).to_dict()
    experts, inter = 4, 32
    text = {**cfg["text_config"], "num_experts": experts, "num_experts_per_tok": 2, "moe_intermediate_size": inter,
            "shared_expert_intermediate_size": inter}
    text.pop("model_type", None)
    config = Qwen3_5MoeConfig(text_config=text, vision_config={k: v for k, v in cfg["vision_config"].items()
                                                                if k != "model_type"},
                              **{k: cfg[k] for k in ("image_token_id", "video_token_id", "vision_start_token_id",
                                                     "vision_end_token_id", "tie_word_embeddings")})
    torch.manual_seed(13)
    folder = tmp_path / "moe"
    save_qwen3(Qwen3_5MoeForConditionalGeneration(config).eval(), tok, folder)
    h = 64
    shapes = {k: v for k, v in public_mtp_shapes(config.text_config).items() if ".mlp." not in k}
    shapes.update({"mtp.layers.0.mlp.gate.weight": (experts, h),
                   "mtp.layers.0.mlp.shared_expert.gate_proj.weight": (inter, h),
                   "mtp.layers.0.mlp.shared_expert.up_proj.weight": (inter, h),
                   "mtp.layers.0.mlp.shared_expert.down_proj.weight": (h, inter),
                   "mtp.layers.0.mlp.shared_expert_gate.weight": (1, h)})
    for e in range(experts):
        shapes.update({f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight": (inter, h),
                       f"mtp.layers.0.mlp.experts.{e}.up_proj.weight": (inter, h),
                       f"mtp.layers.0.mlp.experts.{e}.down_proj.weight": (h, inter)})
    tensors = random_mtp(shapes, seed=4)
    add_mtp(folder, tensors, sharded=True)
    backend = load_backend(str(folder))
    head = MTPHead.load(backend)
    experts_module = head.layers[0].mlp.experts
    for e in range(experts):  # expert e's gate rows, then its up rows; its down projection
        key = f"mtp.layers.0.mlp.experts.{e}."
        assert torch.equal(experts_module.gate_up_proj[e], torch.cat([tensors[key + "gate_proj.weight"],
                                                                      tensors[key + "up_proj.weight"]]))
        assert torch.equal(experts_module.down_proj[e], tensors[key + "down_proj.weight"])
    case = random_case(6, 96)
    ref, _ = _run(backend, "vanilla", case)
    out, _ = _run(backend, "mtp", case, tree="dynamic", tree_depth=3, tree_topk=2, tree_total=6)
    assert out.tokens == ref.tokens


@pytest.mark.slow
def test_cli_method_mtp_equals_vanilla(mtp_targets, tmp_path):
    """`lmms-eval --model lvspec --model_args pretrained=<tiny Qwen3.5 with mtp.* weights>,method=mtp`
    (a tree of width 2) answers token-identically to method=vanilla; model_args route mtp_* options."""
    from test_plugin import TASK, read_jsonl, results_files, run_cli

    from lvspec_eval.demo import tasks_data

    data = tmp_path / "synthvid"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(tasks_data.ENV_DOCS, "3")
        tasks_data.ensure(TASK, data)
    tokens = {}
    wide = f",tree=dynamic,tree_depth=3,tree_topk=2,tree_total=6,mtp_checkpoint={mtp_targets['sharded']}"
    for method, extra in (("vanilla", ""), ("mtp", wide)):
        out = tmp_path / method
        out.mkdir()
        stats = out / "stats.jsonl"
        # until/video_rule/max_new_tokens given: no lmms-eval reference class is needed for the family
        args = f"pretrained={mtp_targets['single']},method={method},stats_path={stats},until=task,video_rule=fps"
        proc = run_cli(out, args + ",max_new_tokens=16" + extra, TASK, data_root=data)
        assert proc.returncode == 0 and results_files(out), method + proc.stdout[-3000:] + proc.stderr[-3000:]
        records = read_jsonl(stats)
        assert len(records) == 2 and all(r["error"] is None for r in records), method
        tokens[method] = [r["tokens"] for r in records]
        if method == "mtp":  # prepared before the first step; its cache holds every video token
            assert all(r["draft_prepared_at"] == 0 and r["kept_visual_tokens"] == r["visual_tokens"] > 0
                       for r in records), records
    assert tokens["mtp"] == tokens["vanilla"]
