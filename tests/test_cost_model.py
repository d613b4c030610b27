"""The cost model at a tiny scale on CPU: shapes of the inputs, the formulas, and a full run."""
from __future__ import annotations

import argparse
import json
import math
import time

import pytest
import torch

from lvspec_eval.decoding.drafters.model import ModelDrafter
from lvspec_eval.decoding.loop import make_clock
from lvspec_eval.measure.cost_model import architectures, config, layouts, measure, outputs, predict, synthetic, timing
from lvspec_eval.measure.cost_model import cli as cost_cli
from lvspec_eval.measure.cost_model.architectures import ARCHITECTURES, Scale, shrink

TINY = Scale(width=0.05, max_layers=1, vocab_size=256, head_dim=16)


def tiny_config(**overrides) -> config.CostConfig:
    base = dict(visual_tokens=(16, 64), scale=TINY, depth=2, level_width=2, tree_nodes=5, repeats=1,
                prompt_tokens=8, new_tokens=16, device="cpu", dtype="float32")
    return config.CostConfig(**{**base, **overrides})


def test_real_sizes_are_kept_at_full_scale():
    arch = shrink(ARCHITECTURES["qwen2.5-vl-32b"], Scale())
    assert (arch["hidden"], arch["layers"], arch["heads"], arch["kv_heads"], arch["vocab"]) == (5120, 64, 40, 8, 152064)
    small = shrink(ARCHITECTURES["llava-ov-0.5b"], Scale())
    assert (small["hidden"], small["layers"], small["tie"]) == (896, 24, True)


def test_shrink_keeps_heads_a_multiple_of_kv_heads():
    arch = shrink(ARCHITECTURES["qwen2.5-vl-7b"], Scale(width=0.125, max_layers=2))
    assert arch["heads"] % arch["kv_heads"] == 0
    assert arch["hidden"] == arch["heads"] * 128 and (arch["layers"], arch["real_layers"]) == (2, 28)
    assert arch["vocab"] == round(152064 * arch["hidden"] / 3584)  # the output layer keeps its share
    sparrow = shrink(ARCHITECTURES["qwen2.5-vl-32b"], Scale(), layers=1)
    assert sparrow["layers"] == 1 and sparrow["hidden"] == 5120


def test_mrope_section_fills_half_the_head():
    cfg = architectures.text_config(shrink(ARCHITECTURES["qwen2.5-vl-7b"], TINY))
    assert sum(cfg["rope_parameters"]["mrope_section"]) == cfg["head_dim"] // 2


@pytest.mark.parametrize("n", [1, 7, 16, 256, 1000, 25000])
def test_grid_holds_exactly_n_tokens(n):
    side, frames = synthetic.grid_for(n)
    assert side * side * frames == n and side <= synthetic.TOKENS_PER_FRAME_SIDE


def test_verify_layout_is_root_plus_tree():
    offsets, visible = layouts.verify_layout(30)
    assert offsets.shape == (31,) and visible.shape == (31, 31)
    assert offsets[0] == 0 and int(offsets.max()) >= 5  # deeper than SpecVLM's 5 levels when grown
    assert visible[1:, 0].all()  # every node sees the root


def test_commit_keeps_the_root_and_a_scattered_path():
    assert layouts.commit_indices(25, 0) == [0]
    keep = layouts.commit_indices(25, 3)
    assert keep[0] == 0 and len(keep) == 4
    assert keep != list(range(4))  # not contiguous: Backend.keep gathers and copies
    offsets, _ = layouts.verify_layout(25)
    assert [int(offsets[i]) for i in keep] == [0, 1, 2, 3]  # one node per depth along the path


def test_predict_formula():
    cfg = tiny_config(depth=4, new_tokens=100)
    target = {"prefill_s": 1.0, "step_s": 0.02, "verify_s": 0.025, "compact_s": {3: 0.001, 2: 0.5}}
    draft = {"prefill_s": 0.5, "tree_s": 0.02}
    out = predict.predict(target, draft, tau=3.0, cfg=cfg)
    step = 0.02 + 0.025 + 0.001  # draft tree + verification + the commit of 3 accepted nodes
    assert out["decode_speedup"] == pytest.approx(4 * 0.02 / step)
    assert out["e2e_speedup"] == pytest.approx((1 + 100 * 0.02) / (1 + 0.5 + 25 * step))


def test_config_rejects_unknown_names():
    with pytest.raises(ValueError, match="drafters.*allowed: full, pruned, sparrow"):
        tiny_config(drafters=("eagle",))
    with pytest.raises(ValueError, match="scale width"):
        Scale(width=2.0)
    with pytest.raises(ValueError, match="drafter 'eagle'"):
        cost_cli.parse_taus("eagle=3")


def test_taus_from_summary(tmp_path):
    rows = [{"method": "sd_tree", "tau": 3.0}, {"method": "sd_tree", "tau": 2.0}, {"method": "sparrow", "tau": 4.0}]
    path = tmp_path / "summary.json"
    path.write_text(json.dumps({"rows": rows}))
    assert cost_cli.taus_from_summary(path) == {"full": 2.5, "pruned": config.DEFAULT_TAU["pruned"], "sparrow": 4.0}


def test_synthetic_inputs_have_the_asked_visual_tokens():
    arch = shrink(ARCHITECTURES["qwen2.5-vl-7b"], TINY)
    backend = synthetic.build_backend(arch, tiny_config())
    inputs = backend.synthetic_inputs(48, 8, seed=0)
    assert inputs.num_visual_tokens == 48
    assert inputs.positions.shape == (3, 1, inputs.input_ids.shape[1])  # M-RoPE: 3 axes
    state, logits = backend.prefill(inputs)
    assert state.cache_len == inputs.input_ids.shape[1] and logits.shape == (256,)


@pytest.fixture(scope="module")
def tiny_result():
    torch.set_num_threads(1)
    return measure.run_cost_model(tiny_config(), log=lambda _msg: None)


def test_run_gives_one_row_per_pair_drafter_and_length(tiny_result):
    rows = tiny_result["rows"]
    assert len(rows) == len(architectures.PAIRS) * len(config.DRAFTERS) * 2
    for row in rows:
        assert math.isfinite(row["decode_speedup"]) and row["decode_speedup"] > 0
        assert math.isfinite(row["e2e_speedup"]) and row["e2e_speedup"] > 0


def test_each_drafter_holds_its_share_of_the_video(tiny_result):
    kv = {(r["pair"], r["drafter"], r["visual_tokens"]): r["draft_visual_tokens"] for r in tiny_result["rows"]}
    assert kv["llava-ov-7b/0.5b", "full", 64] == 64
    assert kv["llava-ov-7b/0.5b", "pruned", 64] == 6
    assert kv["llava-ov-7b/0.5b", "sparrow", 64] == 0
    assert kv["qwen3-vl-8b/2b", "full", 64] == 64 and kv["qwen3-vl-8b/2b", "pruned", 64] == 6
    for pair in architectures.PAIRS:
        sparrow = [r["draft_tree_ms"] for r in tiny_result["rows"] if r["drafter"] == "sparrow" and r["pair"] == pair]
        assert len(sparrow) == 2 and len(set(sparrow)) == 1  # no visual KV: one cost for every video length


def test_rows_time_tree_growth_and_compaction(tiny_result):
    for row in tiny_result["rows"]:
        assert row["draft_tree_ms"] > 0 and row["compact_ms"] > 0
        assert row["draft_share"] == pytest.approx(row["draft_tree_ms"] / (row["draft_tree_ms"] + row["verify_ms"]
                                                                             + row["compact_ms"]))


def test_outputs_are_written(tiny_result, tmp_path):
    paths = outputs.write_outputs(tiny_result, tmp_path)
    assert json.loads(paths["json"].read_text())["rows"] == tiny_result["rows"]
    table = paths["md"].read_text()
    assert table.startswith("| pair | drafter |") and "sparrow" in table
    assert paths["png"].stat().st_size > 0


def test_cli_arguments_build_the_config(tmp_path):
    parser = argparse.ArgumentParser()
    cost_cli.add_arguments(parser)
    args = parser.parse_args(["--pairs", "llava-ov-7b/0.5b", "--drafters", "pruned,sparrow", "--visual-tokens",
                              "16,32", "--tau", "sparrow=3.5", "--cost-device", "cpu", "--cost-out", str(tmp_path)])
    cfg = cost_cli.config_from_args(args)
    assert cfg.pairs == ("llava-ov-7b/0.5b",) and cfg.drafters == ("pruned", "sparrow")
    assert cfg.visual_tokens == (16, 32) and cfg.taus["sparrow"] == 3.5 and cfg.tau_source == "given"
    assert cfg.scale == Scale(width=0.125, max_layers=2) and cfg.dtype == "float32"


def test_layer_time_is_scaled_to_the_real_depth():
    arch = shrink(ARCHITECTURES["llava-ov-0.5b"], TINY)
    backend = synthetic.build_backend(arch, tiny_config())
    assert backend.depth_factor == 24  # one layer built, 24 real
    state, _ = backend.prefill(backend.synthetic_inputs(16, 8, seed=0))
    clock = make_clock(torch.device("cpu"))
    with timing.layer_stack_spans(backend, clock) as spans:
        t0 = clock()
        backend.forward(state, torch.tensor([1]), *layouts.level_layout(1))
        total = clock() - t0
    assert len(spans) == 1 and 0 < spans[0][1] - spans[0][0] < total
    backend.depth_factor = 1.0
    assert timing.timed_call(lambda: None, backend, clock) < 0.01


# ---- issue 17 point 9: inputs outside the clock, growth and compaction inside it, --out, exit 0 ----

def test_visual_features_are_made_with_the_inputs_not_in_the_prefill(monkeypatch):
    arch = shrink(ARCHITECTURES["qwen2.5-vl-7b"], TINY)
    backend = synthetic.build_backend(arch, tiny_config())
    inputs = backend.synthetic_inputs(48, 8, seed=0)
    feats = inputs.extra[synthetic.FEATURES]
    assert feats.shape == (48, arch["hidden"]) and feats.device == backend.device and feats.dtype == backend.model.dtype

    def no_random(*_args, **_kwargs):
        raise AssertionError("random numbers drawn inside the timed prefill")

    monkeypatch.setattr(torch, "randn", no_random)
    state, _ = backend.prefill(inputs)
    assert state.cache_len == inputs.input_ids.shape[1]


SLOW = 0.05  # seconds added to the operation under test: it must show up in the timing


def test_target_timing_includes_the_kv_compaction(monkeypatch):
    arch = shrink(ARCHITECTURES["llava-ov-0.5b"], TINY)
    backend = synthetic.build_backend(arch, tiny_config())
    keep = backend.keep

    def slow_keep(state, temp):
        if isinstance(temp, list) and temp != list(range(len(temp))):  # a gather: an accepted path's commit
            time.sleep(SLOW)
        keep(state, temp)

    monkeypatch.setattr(backend, "keep", slow_keep)
    cfg = tiny_config(taus={"full": 2.0, "pruned": 2.0, "sparrow": 2.0})
    target = measure.measure_target(backend, 16, cfg, make_clock(torch.device("cpu")))
    assert target["compact_s"][2] >= SLOW * backend.depth_factor  # scaled to the real depth (24 layers)


@pytest.mark.parametrize("drafter", ["full", "pruned", "sparrow"])
def test_draft_timing_includes_tree_growth(monkeypatch, drafter):
    """The timed draft step is the project's ModelDrafter.propose: refeed, a grown tree, the drop."""
    arch = shrink(ARCHITECTURES["llava-ov-0.5b"], TINY)
    backend = synthetic.build_backend(arch, tiny_config())
    propose, drafts = ModelDrafter.propose, []

    def slow_propose(self, generated):
        time.sleep(SLOW)
        drafts.append(propose(self, generated))
        return drafts[-1]

    monkeypatch.setattr(ModelDrafter, "propose", slow_propose)
    cfg = tiny_config(repeats=2)
    draft = measure.measure_drafter(backend, drafter, 16, cfg, make_clock(torch.device("cpu")))
    assert len(drafts) == cfg.repeats + 1 and draft["tree_s"] >= SLOW  # one warm-up, then the timed repeats
    assert all(d.num_nodes == cfg.tree_nodes for d in drafts)  # a whole tree: depth 2, 2 wide, 5 kept of 6
    assert draft["kept_visual_tokens"] == {"full": 16, "pruned": 1, "sparrow": 0}[drafter]


TINY_CLI = ["--pairs", "llava-ov-7b/0.5b", "--drafters", "pruned,sparrow", "--visual-tokens", "16", "--scale", "0.05",
            "--max-layers", "1", "--vocab-size", "256", "--head-dim", "16", "--tree-depth", "2", "--level-width", "2",
            "--tree-nodes", "5", "--prompt-tokens", "8", "--new-tokens", "16", "--timing-repeats", "1",
            "--cost-device", "cpu"]


def test_bench_cost_model_writes_where_out_says_and_exits_0(tmp_path, monkeypatch):
    from lvspec_eval import cli

    work = tmp_path / "cwd"
    work.mkdir()
    monkeypatch.chdir(work)
    out = tmp_path / "elsewhere" / "cm.json"
    assert cli.main(["bench", "--cost-model", "--out", str(out), *TINY_CLI]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert len(rows) == 2 and {r["drafter"] for r in rows} == {"pruned", "sparrow"}
    assert out.with_suffix(".md").read_text().startswith("| pair |") and out.with_suffix(".png").stat().st_size > 0
    assert not any(work.iterdir())  # nothing in the working directory (was results/cost_model/)


def test_bench_cost_model_refuses_a_folder_out_before_timing(tmp_path, monkeypatch):
    from lvspec_eval import cli

    monkeypatch.setattr(measure, "run_cost_model", lambda *_a, **_k: pytest.fail("timed before checking --out"))
    assert cli.main(["bench", "--cost-model", "--out", str(tmp_path), *TINY_CLI]) == 2
    assert cli.main(["bench", "--cost-model", "--out", str(tmp_path / "a.json"), "--cost-out", str(tmp_path),
                     *TINY_CLI]) == 2


def test_cost_out_folder_still_works(tmp_path):
    assert cost_cli.main([*TINY_CLI, "--no-cost-plot", "--cost-out", str(tmp_path)]) == 0
    assert json.loads((tmp_path / "cost_model.json").read_text())["rows"]
    assert (tmp_path / "cost_model.md").is_file() and not (tmp_path / "cost_model.png").exists()


# ---- Qwen3.5: hybrid layers, MoE --------------------------------------------------------------------

def test_qwen3_5_sizes_and_their_cache():
    """The public Qwen3.5 shapes at full scale: 3 of 4 layers Gated DeltaNet, whose state does not grow."""
    from lvspec_eval.measure.cache_memory import cache_memory

    big = shrink(ARCHITECTURES["qwen3.5-27b"], Scale())
    assert (big["hidden"], big["layers"], big["heads"], big["kv_heads"], big["linear_v_heads"], big["vocab"]) == \
        (5120, 64, 24, 4, 48, 248320)
    text = architectures.model_config(big).get_text_config()
    assert text.layer_types.count("linear_attention") == 48 and text.layer_types[3] == "full_attention"
    assert text.rope_parameters["mrope_section"] == [11, 11, 10]  # 32 of 256 per half: a quarter rotated
    memory = cache_memory(text)
    assert memory.kv_per_token == 2 * 16 * 4 * 256 * 2  # 64 KiB a token: only the 16 attention layers
    assert memory.state == 48 * (48 * 128 * 128 * 4 + (2 * 16 * 128 + 48 * 128) * 4 * 2)  # ~148 MiB, any length
    dense = cache_memory(architectures.model_config(shrink(ARCHITECTURES["qwen3-vl-32b"], Scale())).get_text_config())
    assert (dense.linear_layers, dense.state, dense.kv_per_token) == (0, 0, 2 * 64 * 8 * 128 * 2)
    moe = ARCHITECTURES["qwen3.5-35b-a3b"]
    assert architectures.model_class(moe) == "Qwen3_5MoeForConditionalGeneration"
    moe_text = architectures.model_config(shrink(moe, Scale())).get_text_config()
    assert (moe_text.num_experts, moe_text.num_experts_per_tok, moe_text.moe_intermediate_size) == (256, 8, 512)


def test_shrunk_qwen3_5_keeps_an_attention_layer_and_its_head_ratio():
    arch = shrink(ARCHITECTURES["qwen3.5-27b"], Scale(width=0.125, max_layers=2))
    assert arch["linear_v_heads"] == 3 * arch["linear_k_heads"] and (arch["layers"], arch["real_layers"]) == (2, 64)
    kinds = architectures.text_config(arch)["layer_types"]
    assert kinds == ["linear_attention", "full_attention"]
    assert architectures.text_config(shrink(ARCHITECTURES["qwen3.5-27b"], Scale(max_layers=8)))["layer_types"] == \
        ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 + ["full_attention"]


def test_tiny_qwen3_5_pairs_are_timed_through_the_hybrid_cache():
    """Both Qwen3.5 pairs (a dense target, an MoE target; a dense draft) run every drafter; the targets'
    linear layers go through the engine's linear-attention path (installed as load_backend does)."""
    from lvspec_eval.backends import linear_state

    torch.set_num_threads(1)
    arch = shrink(ARCHITECTURES["qwen3.5-35b-a3b"], TINY)
    backend = synthetic.build_backend(arch, tiny_config())
    assert type(backend.model).__name__ == "Qwen3_5MoeForConditionalGeneration"
    assert isinstance(backend, synthetic.SyntheticQwen3_5) and linear_state.install(backend.model) == 0  # already there
    result = measure.run_cost_model(tiny_config(pairs=("qwen3.5-27b/2b", "qwen3.5-35b-a3b/2b")), log=lambda _msg: None)
    rows = result["rows"]
    assert {r["pair"] for r in rows} == {"qwen3.5-27b/2b", "qwen3.5-35b-a3b/2b"}
    assert {r["drafter"] for r in rows} == set(config.DRAFTERS)
    assert all(r["verify_ms"] > 0 and r["draft_tree_ms"] > 0 and r["target_step_ms"] > 0 for r in rows)


def test_the_package_face_is_its_parts():
    """`from lvspec_eval.measure import cost_model` gives the settings, a run and the command line."""
    from lvspec_eval.measure import cost_model as cm

    assert (cm.CostConfig, cm.Scale, cm.ARCHITECTURES, cm.PAIRS) == (config.CostConfig, Scale, ARCHITECTURES,
                                                                     architectures.PAIRS)
    assert (cm.run_cost_model, cm.run, cm.main, cm.add_arguments) == (measure.run_cost_model, cost_cli.run,
                                                                       cost_cli.main, cost_cli.add_arguments)
