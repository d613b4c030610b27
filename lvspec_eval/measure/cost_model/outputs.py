"""The cost model's outputs: the JSON result, a markdown table and a plot of speedup against visual
tokens (one panel per pair)."""
from __future__ import annotations

import json
from pathlib import Path

TABLE_COLUMNS = (("pair", "pair", "{}"), ("drafter", "drafter", "{}"), ("visual_tokens", "visual tokens", "{:d}"),
                 ("draft_visual_tokens", "in draft KV", "{:d}"), ("tau", "tau", "{:.2f}"),
                 ("target_step_ms", "target step ms", "{:.2f}"), ("verify_ms", "verify ms", "{:.2f}"),
                 ("compact_ms", "compact ms", "{:.2f}"), ("draft_tree_ms", "draft tree ms", "{:.2f}"),
                 ("decode_speedup", "decode speedup", "{:.2f}x"),
                 ("e2e_speedup", "e2e speedup", "{:.2f}x"))


def markdown_table(result: dict) -> str:
    header = "| " + " | ".join(title for _, title, _ in TABLE_COLUMNS) + " |"
    rule = "|" + "---|" * len(TABLE_COLUMNS)
    lines = [header, rule]
    for row in result["rows"]:
        lines.append("| " + " | ".join(fmt.format(row[key]) for key, _, fmt in TABLE_COLUMNS) + " |")
    s = result["settings"]
    note = (f"\n{result['device']}, {s['dtype']}, scale {s['scale']}, tau {s['tau_source']}; depth {s['depth']}, "
            f"level width {s['level_width']}, {s['tree_nodes']} verified nodes, prune ratio {s['prune_ratio']}, "
            f"e2e over {s['new_tokens']} new tokens. {result['formula']}.\n")
    return "\n".join(lines) + "\n" + note


def plot(result: dict, path: Path) -> None:
    """Decode speedup (solid) and e2e speedup (dashed) against visual tokens, one panel per pair."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pairs = list(dict.fromkeys(r["pair"] for r in result["rows"]))
    fig, axes = plt.subplots(1, len(pairs), figsize=(5.5 * len(pairs), 4), squeeze=False)
    for ax, pair in zip(axes[0], pairs):
        for drafter in dict.fromkeys(r["drafter"] for r in result["rows"]):
            rows = [r for r in result["rows"] if r["pair"] == pair and r["drafter"] == drafter]
            xs = [r["visual_tokens"] for r in rows]
            line = ax.plot(xs, [r["decode_speedup"] for r in rows], marker="o", label=f"{drafter} (decode)")[0]
            ax.plot(xs, [r["e2e_speedup"] for r in rows], ls="--", color=line.get_color(), label=f"{drafter} (e2e)")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set(xscale="log", xlabel="visual tokens", ylabel="predicted speedup", title=pair)
        ticks = sorted({r["visual_tokens"] for r in result["rows"] if r["pair"] == pair})
        ax.set_xticks(ticks, [f"{t:,}" for t in ticks], fontsize=7)
        ax.minorticks_off()
        ax.legend(fontsize=7)
    fig.suptitle(f"cost model on {result['device']} ({result['settings']['dtype']})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def output_paths(json_path: Path, plots: bool = True) -> dict[str, Path]:
    """The JSON file and, beside it with the same stem, the table (.md) and the plot (.png)."""
    kinds = ("json", "md", "png") if plots else ("json", "md")
    return {kind: json_path.with_suffix(f".{kind}") if kind != "json" else json_path for kind in kinds}


def write_outputs(result: dict, out_dir: Path, plots: bool = True) -> dict[str, Path]:
    """cost_model.json, cost_model.md and (with plots) cost_model.png under out_dir."""
    return write_files(result, output_paths(Path(out_dir) / "cost_model.json", plots))


def write_files(result: dict, paths: dict[str, Path]) -> dict[str, Path]:
    paths["json"].parent.mkdir(parents=True, exist_ok=True)
    paths["json"].write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    paths["md"].write_text(markdown_table(result), encoding="utf-8")
    if "png" in paths:
        plot(result, paths["png"])
    return paths
