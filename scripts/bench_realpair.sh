#!/usr/bin/env bash
# `make bench-realpair`: our decoders against transformers' greedy generate() and its assisted
# generation on a Qwen2.5-VL pair with real pretrained language models (text prompts; the pair's
# vision towers are random). The table leads with end to end (e2e_speedup: median per-sample ratio;
# e2e_speedup_total: summed wall clock, request to answer, preparation of the draft included) beside
# decode speedup, and draft_prepare_ms / draft_prepared_share: what preparing the draft cost per
# sample and on how many samples it was prepared. Builds the pair first if it is missing (scripts/realpair/build.sh:
# about 5 minutes, 5 GB of downloads, 16 GB of memory). Not part of `make test`.
#
# env: REALPAIR  the pair's folder (default $HOME/.cache/lvspec-realpair, holding target/ and draft/)
#      METHODS   our methods (default vanilla,sd_tree)      LIMIT      prompts (default 10, at least 8)
#      MAX_NEW_TOKENS (default 128)    THREADS (default: all cores)    OUT_DIR (default .cache/bench-realpair)
#      OPTIONS   decoding options as model_args (default none: each method's defaults)
#      DRAFT_DTYPE  the draft's precision (default int8 on a CPU, the README's figure; bfloat16 on a GPU);
#                   transformers' assistant gets the same precision, and a float32 row beside it
#      NEIGHBOUR=1  run a second process decoding with the target beside the benchmark (scripts/noisy_neighbour.py)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PY="$ROOT/.venv/bin/python"
PAIR="${REALPAIR:-$HOME/.cache/lvspec-realpair}"
BUILD="$ROOT/scripts/realpair/build.sh"
OUT_DIR="${OUT_DIR:-.cache/bench-realpair}"

if [ ! -f "$PAIR/target/config.json" ] || [ ! -f "$PAIR/draft/config.json" ]; then
  echo "bench-realpair: building the pair into $PAIR (once)"
  "$PY" -m pip install -q "gguf==0.19.0" accelerate
  PYTHON="$PY" OUT="$PAIR" bash "$BUILD"
fi

DRAFT_DTYPE="${DRAFT_DTYPE:-$("$PY" -c "import torch; print('bfloat16' if torch.cuda.is_available() else 'int8')")}"
mkdir -p "$OUT_DIR"
if [ "${NEIGHBOUR:-0}" = 1 ]; then  # a second process decoding with the 1.5B target on the same cores
  "$PY" "$ROOT/scripts/noisy_neighbour.py" "$PAIR/target" --threads "${THREADS:-$(nproc)}" > "$OUT_DIR/neighbour.log" 2>&1 &
  NEIGHBOUR_PID=$!
  trap 'kill $NEIGHBOUR_PID 2>/dev/null || true' EXIT
  until grep -q "neighbour: decoding" "$OUT_DIR/neighbour.log" 2>/dev/null; do
    kill -0 $NEIGHBOUR_PID 2>/dev/null || { echo "bench-realpair: the neighbour died: $OUT_DIR/neighbour.log" >&2; exit 2; }
    sleep 2
  done
  echo "bench-realpair: a neighbour is decoding beside the benchmark (log: $OUT_DIR/neighbour.log)"
fi
"$ROOT/.venv/bin/lvspec-eval" bench --target "$PAIR/target" --draft "$PAIR/draft" --dtype float32 \
  --methods "${METHODS:-vanilla,sd_tree}" --options "${OPTIONS:-}" --prompts builtin --limit "${LIMIT:-10}" \
  --max-new-tokens "${MAX_NEW_TOKENS:-128}" --threads "${THREADS:-$(nproc)}" --hf-baseline --hf-assisted \
  --draft-dtype "$DRAFT_DTYPE" --hf-assistant-dtype same,float32 --engine-vanilla \
  --out "$OUT_DIR/summary.json" --records "$OUT_DIR/records.jsonl" | tee "$OUT_DIR/table.md"
echo "bench-realpair: $OUT_DIR/summary.json, $OUT_DIR/records.jsonl, $OUT_DIR/table.md"
