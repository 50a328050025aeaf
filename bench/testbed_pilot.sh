#!/usr/bin/env bash
# issue 43 pilot (docs/testbed.md): one seed, CoT and direct SFT for 800 steps on the testbed, then greedy
# evaluation per level; writes /tmp/pilot/{cot,direct}/ (run from the repository root: bash bench/testbed_pilot.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
SECONDS=0
for mode in cot direct; do
  .venv/bin/psyrl train-sft --config configs/sft/tiny.toml --set 'run.output_dir="/tmp/pilot"' --set run.name=$mode \
    --set data.train_file=data/testbed/train.jsonl --set data.valid_file=data/testbed/test.jsonl --set data.valid_items=60 \
    --set run.steps=800 --set checkpoint.every=400 --set prompt.mode=$mode --set log.progress=false
  echo "pilot: sft $mode done at ${SECONDS} s"
  .venv/bin/psyrl evaluate --model /tmp/pilot/$mode/hf --benchmarks data/testbed/test-k1.jsonl,data/testbed/test-k2.jsonl,data/testbed/test-k3.jsonl \
    --prompt $mode --max-new-tokens 64 --temperature 0 --no-progress --out /tmp/pilot/$mode/eval
  echo "pilot: eval $mode done at ${SECONDS} s"
done
