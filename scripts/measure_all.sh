#!/usr/bin/env bash
# Re-measures the demo-world figures of docs/RESULTS.md with the committed checkpoints, in the order
# that page gives them (about 20 minutes on an idle 2-core CPU). Those figures ran with tree=dynamic
# (the default then); steps below that name no tree shape now run tree=adaptive. Run it after
# `make demo` (or `make install`) from the repository root; each step logs to results/measure_all.log.
# Timings on a shared CPU drift: run it on an otherwise idle machine.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
LOG=results/measure_all.log
: > "$LOG"

step() {
  echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"
  "$@" 2>&1 | tail -n 40 >> "$LOG"
}

step lvspec-eval demo --out results/demo  # the committed reference report (the default is runs/demo)
step lvspec-eval bench --methods vanilla,sd_tree,specvlm,fly,lvspec --task synthvid_caption --limit 20 --hf-baseline --out results/bench/caption_short.json
step lvspec-eval bench --methods vanilla,sd_tree,specvlm,sparrow --limit 10 --out results/bench/sparrow_short.json
step python scripts/measure_model_cost.py 300 2
step lvspec-eval bench --methods vanilla,sd_tree --limit 8 --options tree=dynamic,tree_depth=5,tree_topk=10,tree_total=60 --out results/bench/verify60.json
step lvspec-eval bench --methods vanilla,sd_tree,specvlm,sparrow --task synthvid_caption_long --frames 512 --limit 2 --out results/bench/sparrow_4096.json
for opt in "" sparrow_head=lvspec_eval/demo/checkpoints/sparrow_noivsb sparrow_head=lvspec_eval/demo/checkpoints/sparrow_nomtp sparrow_hsr=off; do
  # shellcheck disable=SC2086
  step python scripts/measure_sparrow_tau.py 40 $opt
done
step lvspec-eval bench --methods vanilla,specvlm,lvspec --limit 20 --options tree_depth=12,tree_total=24 --out results/bench/depth12.json
step lvspec-eval sweep
step lvspec-eval sweep --no-probe --vary pst_window=2 --also "tree_depth=12,tree_total=24" \
  --also "tree_depth=12,tree_total=24,lv_relevance=off" --also "tree=chain,tree_depth=15" --out results/sweep/explore_depth
# Loose verification's regime: the restyled draft (the same draft fine-tuned on another phrasing
# style), chain drafts, and where chains break (scripts/rejection_breakdown.py).
step lvspec-eval bench --methods vanilla,sd_tree,specvlm,fly,lvspec --task synthvid_caption --limit 20 \
  --draft demo-draft-restyled --out results/bench/restyled_caption.json
for d in demo-draft demo-draft-restyled; do
  step lvspec-eval bench --methods vanilla,specvlm,fly,lvspec --limit 20 --options tree=chain,tree_depth=10 \
    --draft "$d" --records "results/loose/chain_$d.jsonl" --out "results/bench/chain_$d.json"
  step python scripts/rejection_breakdown.py "results/loose/chain_$d.jsonl" 10 "results/loose/breakdown_$d.json"
  # the same chains with the full video: which mismatches are the pruned draft's slips
  step lvspec-eval bench --methods vanilla,specvlm,lvspec --limit 20 --options tree=chain,tree_depth=10,prune_ratio=0.0 \
    --draft "$d" --records "results/loose/chain_p0_$d.jsonl" --out "results/loose/chain_p0_$d.json"
  step python scripts/rejection_breakdown.py "results/loose/chain_p0_$d.jsonl" 10 "results/loose/breakdown_p0_$d.json"
done
for p in 0.9 0.0; do  # the relevance gate with the restyled draft's chains
  step lvspec-eval sweep --draft demo-draft-restyled --limit 20 --tree-options "tree=chain,tree_depth=10,prune_ratio=$p" \
    --out "results/loose/sweep_restyled_chain_p$p"
done
step lvspec-eval bench --methods vanilla,specvlm,fly,lvspec --limit 20 --options prune_ratio=0.5 \
  --draft demo-draft-restyled --out results/bench/restyled_prune05.json
step lvspec-eval sweep --draft demo-draft-restyled --out results/sweep_restyled
step lvspec-eval demo --draft demo-draft-restyled --methods vanilla,sd_tree,specvlm,fly,lvspec --length-methods "" \
  --out results/demo_restyled
step lvspec-eval bench --methods vanilla,sd_tree,specvlm,fly,lvspec --task synthvid_mcq --limit 40 --max-new-tokens 4 --out results/bench/mcq.json
rm -rf results/competence/run
step lmms-eval --model lvspec \
  --model_args pretrained=demo,method=vanilla,stats_path=results/competence/run/stats.jsonl \
  --tasks synthvid_caption,synthvid_mcq,synthvid_caption_long \
  --output_path results/competence/run --log_samples
# lmms-eval writes absolute paths into its results: keep the committed files machine-independent.
grep -rl "$PWD/" results/ | xargs -r sed -i "s|$PWD/||g"
echo "== done $(date -u +%H:%M:%S)" | tee -a "$LOG"
