"""From timings to predicted speedups (the formulas of the package docstring), one row per pair,
drafter and visual-token count."""
from __future__ import annotations

from .config import CostConfig
from .layouts import accepted_length


def predict(target: dict, draft: dict, tau: float, cfg: CostConfig) -> dict:
    """Speedups from the timings (formulas in cost_model/__init__.py's docstring)."""
    step = draft["tree_s"] + target["verify_s"] + target["compact_s"][accepted_length(tau)]
    vanilla_e2e = target["prefill_s"] + cfg.new_tokens * target["step_s"]
    method_e2e = target["prefill_s"] + draft["prefill_s"] + cfg.new_tokens / (tau + 1) * step
    return {"decode_speedup": (tau + 1) * target["step_s"] / step, "e2e_speedup": vanilla_e2e / method_e2e,
            "draft_share": draft["tree_s"] / step}


def row(pair: str, drafter: str, n: int, costs: dict, cfg: CostConfig) -> dict:
    """One output row: the timings of the target and `drafter` at n visual tokens, and the speedups."""
    target, draft, tau = costs["target", n], costs[drafter, n], cfg.taus[drafter]
    return {"pair": pair, "drafter": drafter, "visual_tokens": target["visual_tokens"],
            "equivalent_visual_tokens": round(target["visual_tokens"] / cfg.scale.width),
            "draft_visual_tokens": draft["kept_visual_tokens"], "tau": tau,
            "target_prefill_s": target["prefill_s"], "draft_prefill_s": draft["prefill_s"],
            "target_step_ms": 1e3 * target["step_s"], "verify_ms": 1e3 * target["verify_s"],
            "compact_ms": 1e3 * target["compact_s"][accepted_length(tau)], "draft_tree_ms": 1e3 * draft["tree_s"],
            **predict(target, draft, tau, cfg)}
