"""Measurement: each model built once, at its scale, and timed through the project's own code: the
target's prefill, vanilla step, tree verification and commit; each drafter's prefill (with SpecVLM's
token selection for the pruned draft) and one whole proposal (ModelDrafter.propose). Models are
timed one after another (the GPU holds one at a time)."""
from __future__ import annotations

import types
from dataclasses import asdict

import torch

from ...backends.base import Backend, DecodeState
from ...decoding.drafters.model import ModelDrafter
from ...decoding.loop import make_clock
from ...decoding.pruning import PruneConfig
from .architectures import ARCHITECTURES, PAIRS, shrink
from .config import CostConfig
from .layouts import accepted_length, commit_indices, draft_tree_config, level_layout, verify_layout
from .predict import row
from .synthetic import build_backend
from .timing import best_seconds, forward_seconds, random_tokens, rewinder, timed_call, timed_prefill


def compaction_seconds(backend: Backend, state: DecodeState, num_accepted: int, cfg: CostConfig, clock) -> float:
    """Time of the target's commit (Backend.keep) after a tree verification accepting num_accepted
    nodes. keep runs outside the decoder layers, so timed_call cannot scale it; it loops over the
    cache layers, so its time is multiplied by the depth factor here."""
    offsets, visible = verify_layout(cfg.tree_nodes)
    tokens, keep = random_tokens(backend, offsets.numel(), cfg.seed), commit_indices(cfg.tree_nodes, num_accepted)
    rewind, times = rewinder(state), []
    for _ in range(cfg.repeats + 1):  # the first is a warm-up
        backend.forward(state, tokens, offsets, visible)
        t0 = clock()
        backend.keep(state, keep)
        times.append(clock() - t0)
        rewind()
    return min(times[1:]) * backend.depth_factor


def accepted_lengths(cfg: CostConfig) -> list[int]:
    return sorted({accepted_length(cfg.taus[d]) for d in cfg.drafters})


def measure_target(backend: Backend, num_visual: int, cfg: CostConfig, clock) -> dict:
    """Prefill, one vanilla step, one tree verification and its commit (per accepted length)
    with num_visual tokens in the KV."""
    inputs = backend.synthetic_inputs(num_visual, cfg.prompt_tokens, cfg.seed)
    prefill_s, state = timed_prefill(backend, inputs, clock)
    step_s = forward_seconds(backend, state, *level_layout(1), cfg, clock)
    verify_s = forward_seconds(backend, state, *verify_layout(cfg.tree_nodes), cfg, clock)
    compact_s = {k: compaction_seconds(backend, state, k, cfg, clock) for k in accepted_lengths(cfg)}
    return {"visual_tokens": inputs.num_visual_tokens, "prefill_s": prefill_s, "step_s": step_s,
            "verify_s": verify_s, "compact_s": compact_s}


def attention_scores(num_visual: int, seed: int = 0) -> torch.Tensor:
    """Random stand-ins for the attention each visual token received in the target's prefill:
    how many tokens the pruning keeps is what costs; which ones does not."""
    return torch.rand(num_visual, generator=torch.Generator().manual_seed(seed))


def measure_drafter(backend: Backend, drafter: str, num_visual: int, cfg: CostConfig, clock) -> dict:
    """Draft prefill (with SpecVLM's token selection for the pruned draft) and one whole proposal,
    through the project's ModelDrafter, with the drafter's share of the visual KV."""
    n = 0 if drafter == "sparrow" else num_visual  # Sparrow's head sees the prompt's text only
    inputs = backend.synthetic_inputs(n, cfg.prompt_tokens, cfg.seed)
    prune = PruneConfig(ratio=cfg.prune_ratio) if drafter == "pruned" and n else None
    model_drafter = ModelDrafter(draft_tree_config(cfg), prune=prune)  # drafts with `backend`, passed as target
    # what start() reads of the target's prefill: the attention each visual token received, and the
    # committed tokens the target has not fed yet (none here: `propose` is handed the committed ones)
    target_view = types.SimpleNamespace(extra={"visual_attention": attention_scores(n, cfg.seed)},
                                        pending=[], pending_on_device=lambda: None)
    info = {}

    def start():
        info.update(model_drafter.start(backend, inputs, target_view, clock))

    prefill_s = timed_call(start, backend, clock)
    per_step = accepted_length(cfg.taus[drafter]) + 1  # tokens committed since the last proposal
    pool = random_tokens(backend, per_step * (cfg.repeats + 1), cfg.seed).tolist()
    committed: list[int] = []

    def propose():
        committed.extend(pool[len(committed):len(committed) + per_step])
        model_drafter.propose(committed)

    tree_s = best_seconds(propose, backend, cfg.repeats, clock)
    return {"prefill_s": prefill_s, "tree_s": tree_s, "kept_visual_tokens": info["kept_visual_tokens"]}


def _release(backend: Backend | None) -> None:
    """Free a model before the next one is built (the GPU holds one model at a time)."""
    if backend is not None:
        del backend.model
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _warm_up(backend: Backend, cfg: CostConfig) -> None:
    """One short prefill, so kernel selection and allocation are not timed."""
    backend.prefill(backend.synthetic_inputs(min(cfg.visual_tokens), cfg.prompt_tokens, cfg.seed))


def measure_model(arch: dict, jobs: list[tuple[str, int]], cfg: CostConfig, clock, log) -> dict:
    """Build one model and run `jobs` (role, visual tokens) on it; role "target" or a drafter."""
    backend = build_backend(arch, cfg)
    try:
        _warm_up(backend, cfg)
        out = {}
        for role, n in jobs:
            log(f"  {role:8s} {n:>6d} visual tokens")
            out[role, n] = (measure_target(backend, n, cfg, clock) if role == "target"
                            else measure_drafter(backend, role, n, cfg, clock))
        return out
    finally:
        _release(backend)


def measure_pair(pair: str, cfg: CostConfig, clock, log) -> list[dict]:
    """Rows (one per drafter and visual-token count) for one target/draft pair."""
    target_name, draft_name = PAIRS[pair]
    log(f"{pair}: target {target_name}, draft {draft_name}, scale {cfg.scale}")
    ns = list(cfg.visual_tokens)
    costs = measure_model(shrink(ARCHITECTURES[target_name], cfg.scale), [("target", n) for n in ns], cfg, clock, log)
    model_drafters = [d for d in cfg.drafters if d != "sparrow"]
    if model_drafters:
        jobs = [(d, n) for n in ns for d in model_drafters]
        costs.update(measure_model(shrink(ARCHITECTURES[draft_name], cfg.scale), jobs, cfg, clock, log))
    if "sparrow" in cfg.drafters:  # its KV holds no visual token: one measurement serves every n
        head = shrink(ARCHITECTURES[target_name], cfg.scale, layers=1)
        sparrow = measure_model(head, [("sparrow", ns[0])], cfg, clock, log)[("sparrow", ns[0])]
        costs.update({("sparrow", n): sparrow for n in ns})
    return [row(pair, d, n, costs, cfg) for d in cfg.drafters for n in ns]


def run_cost_model(cfg: CostConfig, log=print) -> dict:
    """All pairs' rows plus what produced them (JSON-ready)."""
    clock = make_clock(torch.device(cfg.device))
    rows = [row for pair in cfg.pairs for row in measure_pair(pair, cfg, clock, log)]
    settings = asdict(cfg)
    return {"version": 1, "device": describe_device(cfg.device), "settings": settings, "rows": rows,
            "formula": "decode_speedup = (tau + 1) * target_step / (draft_tree + verify + compact)"}


def describe_device(device: str) -> str:
    if torch.device(device).type == "cuda":
        return torch.cuda.get_device_name(torch.device(device))
    return f"cpu ({torch.get_num_threads()} threads)"
