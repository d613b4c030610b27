#!/usr/bin/env bash
# LVSpec against SpecVLM (same drafter settings) over the demo's two drafts, tree or chain drafts,
# and the share of video tokens the draft keeps: how the loose verifier's gain depends on where the
# draft disagrees with the target. Writes results/loose/grid/<draft>_<shape>_p<prune>.json (20
# captions each; about 6 minutes on 2 cores).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$PWD/.venv/bin:$PATH"
for d in demo-draft demo-draft-restyled; do
  for shape in tree chain; do
    for p in 0.9 0.5 0.0; do
      opts="prune_ratio=$p"
      [ "$shape" = chain ] && opts="$opts,tree=chain,tree_depth=10"
      lvspec-eval bench --methods vanilla,specvlm,lvspec --task synthvid_caption --limit 20 --draft "$d" \
        --options "$opts" --out "results/loose/grid/${d}_${shape}_p$p.json" | grep -E "^\| (specvlm|lvspec)"
    done
  done
done
