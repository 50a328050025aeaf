"""Step time and peak memory of the tiny SFT (configs/sft/tiny.toml) in one process and on 2
torchrun ranks (FSDP2, with and without CPU offload), without validation or checkpoints so only
training steps are timed.

    python bench/sft_ranks.py [--steps 60]

Prints one row per variant: median step time, training tokens/s and the peak resident memory of the
largest rank (`perf/peak_mem_gib`; on a GPU it would be the peak CUDA memory). Results:
docs/measurements.md.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import click

VARIANTS = {
    "1 process": ([sys.executable], []),
    "2 ranks, FSDP2": (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
        [],
    ),
    "2 ranks, FSDP2 + CPU offload": (
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"],
        ["fsdp.offload=always"],
    ),
}


@click.command()
@click.option("--steps", default=60, show_default=True, help="Training steps per variant.")
def main(steps: int) -> None:
    with tempfile.TemporaryDirectory() as out:
        print(
            "| variant | median step (s) | tokens/s | peak memory per rank (GiB) |\n| --- | ---: | "
            "---: | ---: |"
        )
        for name, (launcher, extra) in VARIANTS.items():
            sets = [
                f"run.output_dir={json.dumps(out)}",
                f"run.name=v{len(extra)}{len(launcher)}",
                f"run.steps={steps}",
                'data.valid_file=""',
                "checkpoint.every=0",
                "log.progress=false",
                *extra,
            ]
            args = [*launcher, "train_sft.py", "--config", "configs/sft/tiny.toml"]
            subprocess.run(
                args + [a for s in sets for a in ("--set", s)], check=True, capture_output=True
            )
            rows = [
                json.loads(line)
                for line in Path(out, f"v{len(extra)}{len(launcher)}", "metrics.jsonl").open()
            ]
            rows = rows[1:]  # the first step includes one-off warm-up
            step_s = statistics.median(r["perf/step_s"] for r in rows)
            tokens = sum(r["train/tokens"] for r in rows) / sum(r["perf/step_s"] for r in rows)
            peak = max(r["perf/peak_mem_gib"] for r in rows)
            print(f"| {name} | {step_s:.3f} | {tokens:,.0f} | {peak:.2f} |", flush=True)


if __name__ == "__main__":
    main()
