"""What the `semantic` accuracy signal costs per T-GRPO step on this CPU (issue 41 item 2).

    .venv/bin/python bench/semantic_cost.py [--steps 10]

Scores one step's B x G answers against their B gold answers with `SemanticSignal` (the default
all-MiniLM-L6-v2, batch_size 64, the [semantic] default) at the shapes of:

- the demo (configs/tgrpo/tiny.toml: B 16 x G 5 = 80 answers; `make demo` runs it under torchrun
  with 2 ranks of 1 thread each, so a rank scores 40 answers against 8 golds): `demo, a rank`;
  the same 80 answers in one process of 2 threads: `demo, 1 process`;
- bench/step_vs_trl.py (B 8 x G 5 = 40 answers, one process, 2 threads): `step_vs_trl`.

Answers and golds are the demo set's own short answers (data/demo/train.jsonl, 1-4 words), seeded;
each step draws B new records. `cold`: every gold of the step is new (encoded one by one, as a run's
first epoch); `warm`: all golds cached (the demo's 720 records have 72 distinct answers). 1 warm-up
step, then the best and the median of --steps steps (on a machine shared with other work the best
is the closer to the signal's own cost). Results are written in docs/reward-signals.md.
"""

from __future__ import annotations

import json
import platform
import random
import statistics
import time
from pathlib import Path

import click
import torch

from psyrl.rl.accuracy import Pair
from psyrl.signals.semantic import SemanticSignal

ROOT = Path(__file__).resolve().parents[1]
SHAPES = [  # name, prompts B (this process's share), samples G, torch threads
    ("demo, a rank", 8, 5, 1),
    ("demo, 1 process", 16, 5, 2),
    ("demo, 1 process", 16, 5, 1),
    ("step_vs_trl", 8, 5, 2),
    ("step_vs_trl", 8, 5, 1),
]  # the 1-thread rows bound the 2-thread ones on a machine whose other core is busy


def step_pairs(answers: list[str], prompts: int, samples: int, rng: random.Random) -> list[Pair]:
    """One step: `prompts` gold answers, each with `samples` answers drawn from the demo set."""
    golds = rng.sample(answers, prompts)
    return [Pair(gold, rng.choice(answers)) for gold in golds for _ in range(samples)]


def time_step(signal: SemanticSignal, pairs: list[Pair], warm: bool) -> float:
    if warm:
        signal([Pair(p.gold, p.gold) for p in pairs])  # the golds cached
    else:
        signal.gold_cache.clear()
    start = time.perf_counter()
    signal(pairs)
    return time.perf_counter() - start


@click.command()
@click.option("--steps", default=10, show_default=True, help="Timed steps per shape (median).")
def main(steps):
    records = [json.loads(line) for line in (ROOT / "data/demo/train.jsonl").open()]
    answers = [r["answer"] for r in records]
    start = time.perf_counter()
    signal = SemanticSignal()
    load_s = time.perf_counter() - start
    print(
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} threads, "
        f"torch {torch.__version__}, cpu capability {torch.backends.cpu.get_cpu_capability()}"
    )
    print(f"encoder {signal.directory} loaded in {load_s:.2f} s (once per run)")
    widths = (-16, 7, 5, 7, 15, 15)  # negative: left-aligned
    header = ("shape", "answers", "golds", "threads", "cold best / med", "warm best / med")
    print(" ".join(f"{h:{'<' if w < 0 else '>'}{abs(w)}}" for h, w in zip(header, widths)))
    for name, prompts, samples, threads in SHAPES:
        torch.set_num_threads(threads)
        rng = random.Random(0)
        cells = []
        for warm in (False, True):
            runs = [
                time_step(signal, step_pairs(answers, prompts, samples, rng), warm)
                for _ in range(steps + 1)
            ][1:]  # the first step warms the kernels up
            cells.append(f"{min(runs) * 1e3:.0f} / {statistics.median(runs) * 1e3:.0f} ms")
        print(
            f"{name:<16} {prompts * samples:>7} {prompts:>5} {threads:>7} "
            f"{cells[0]:>15} {cells[1]:>15}"
        )


if __name__ == "__main__":
    main()
