"""Evaluation speed on a CPU: items/s of `evaluate.py` for a tiny model, in one process and on 2
torchrun ranks, and how the items and the generation time split over the ranks. Results go in
docs/measurements.md and docs/evaluation.md.

    python bench/eval_speed.py [--model runs/tiny-tgrpo/hf] [--out /tmp/eval-speed]

Workloads: the demo's multiple-choice split (360 short prompts) and the five OOD benchmarks at 5
items per task (140 items, prompts of up to ~1,500 tiny-tokenizer tokens); at most 64 new tokens,
temperature 0.5. The model defaults to the demo's T-GRPO export (a trained model that ends its
answers on its own); run `make demo` first. Each configuration runs once, from an empty output
directory, on an otherwise idle machine.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import click

ROOT = Path(__file__).resolve().parent.parent
WORKLOADS = {
    "demo mc (360 items)": ["--benchmarks", "data/demo/mc.jsonl"],
    "five OOD benchmarks, 5 per task (140 items)": ["--limit", "5"],
}


def run_eval(model: Path, out: Path, ranks: int, batch: int, workload: list[str]) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    launcher = (
        [sys.executable]
        if ranks == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(ranks),
        ]
    )
    cmd = launcher + [
        "evaluate.py",
        "--model",
        str(model),
        "--out",
        str(out),
        "--max-new-tokens",
        "64",
        "--batch",
        str(batch),
        "--no-progress",
        *workload,
    ]
    result = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{result.stderr[-3000:]}")
    return json.loads((out / "results.json").read_text())["perf"]


@click.command()
@click.option(
    "--model",
    type=click.Path(exists=True, file_okay=False),
    default="runs/tiny-tgrpo/hf",
    show_default=True,
)
@click.option(
    "--out", type=click.Path(file_okay=False), default="/tmp/eval-speed", show_default=True
)
def main(model, out):
    print(
        "| workload | ranks | batch / rank | items/s | wall s | per rank: items, generate s, "
        "response tokens |"
    )
    print("| --- | ---: | ---: | ---: | ---: | --- |")
    for name, workload in WORKLOADS.items():
        for ranks, batch in ((1, 16), (1, 64), (2, 16)):
            perf = run_eval(Path(model), Path(out) / f"{ranks}-{batch}", ranks, batch, workload)
            split = "; ".join(
                f"rank {p['rank']}: {p['items']}, {p['generate_s']:.1f} s, {p['response_tokens']}"
                for p in perf["per_rank"]
            )
            print(
                f"| {name} | {ranks} | {batch} | {perf['items_per_s']:.2f} | {perf['wall_s']:.1f} "
                f"| {split} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
