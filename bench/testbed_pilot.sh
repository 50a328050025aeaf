#!/usr/bin/env bash
# issue 43 pilots (docs/testbed.md, "How it got here"): one seed, CoT and direct SFT of the tiny model on a testbed,
# then greedy evaluation per level (test-k1/2/3.jsonl of the same directory); writes OUT/{cot,direct}/.
#   bash bench/testbed_pilot.sh [DATA] [STEPS] [OUT]      (defaults: data/testbed 800 /tmp/pilot)
#   MODES=direct bash bench/testbed_pilot.sh data/testbed-swing 1600 /tmp/p16   (one mode only)
# Run from the repository root. DATA may be a copy with its own train.jsonl, e.g. only the swing_k1 lines.
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${1:-data/testbed}; STEPS=${2:-800}; OUT=${3:-/tmp/pilot}
SECONDS=0
for mode in ${MODES:-cot direct}; do
  .venv/bin/psyrl train-sft --config configs/sft/tiny.toml --set "run.output_dir=\"$OUT\"" --set run.name=$mode \
    --set data.train_file=$DATA/train.jsonl --set data.valid_file=$DATA/test.jsonl --set data.valid_items=60 \
    --set run.steps=$STEPS --set checkpoint.every=$STEPS --set prompt.mode=$mode --set log.progress=false
  echo "pilot: sft $mode done at ${SECONDS} s"
  .venv/bin/psyrl evaluate --model $OUT/$mode/hf --benchmarks $DATA/test-k1.jsonl,$DATA/test-k2.jsonl,$DATA/test-k3.jsonl \
    --prompt $mode --max-new-tokens 80 --temperature 0 --no-progress --out $OUT/$mode/eval
  echo "pilot: eval $mode done at ${SECONDS} s"
done
