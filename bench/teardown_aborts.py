"""How often a torchrun worker dies at exit with "terminate called without an active exception".

Launches `--launches` torchrun jobs of 2 gloo ranks on the CPU, one after another, and counts the
launches whose exit status is not 0 and the aborts among them. Each worker (this file with
`--worker`) trains a tiny FSDP2 model for 3 steps, then runs 200 small async all-reduces (the
per-step metric reductions, many of them, to widen the window), and exits through psyrl's `cleanup`,
through `destroy_process_group()` alone (psyrl before the fix) or without either. The cause is in
`psyrl.runtime.distributed.cleanup`'s docstring.

    .venv/bin/python bench/teardown_aborts.py --launches 200
    .venv/bin/python bench/teardown_aborts.py --launches 60 --exit destroy
    .venv/bin/python bench/teardown_aborts.py --launches 30 --exit none

Results are in docs/measurements.md.
"""

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ABORT = "terminate called without an active exception"


def worker(exit_path: str) -> None:
    import torch
    import torch.distributed as tdist

    from psyrl.core.config import ModelConfig, OptimConfig
    from psyrl.runtime.distributed import cleanup, gloo_threads, init_distributed, load_sharded
    from psyrl.runtime.model import Policy, load_model, load_tokenizer
    from psyrl.runtime.optim import build_optimizer

    dist = init_distributed("cpu")

    def train() -> None:  # the models live in this frame only, as in the trainers
        tiny = ModelConfig(
            tokenizer="tiny",
            hidden_size=32,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            intermediate_size=64,
        )
        tokenizer = load_tokenizer(tiny)
        policy = load_sharded(
            lambda empty: Policy(load_model(tiny, tokenizer, seed=0, empty=empty)), dist
        )
        optimizer = build_optimizer(policy, OptimConfig())
        ids = torch.randint(0, len(tokenizer), (2, 16), generator=torch.Generator().manual_seed(0))
        for _ in range(3):
            policy(ids, torch.ones_like(ids)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()

    train()
    for _ in range(200):  # the last collective ends just before the exit, as in the trainers
        tdist.all_reduce(torch.randn(20000), async_op=True).wait()
    if exit_path == "destroy":
        tdist.destroy_process_group()
    elif exit_path == "cleanup":
        cleanup(dist)  # reading /proc here would delay the exit and hide the race in the others
        print(f"rank {dist.rank}: gloo threads at exit: {gloo_threads()}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launches", type=int, default=200)
    parser.add_argument(
        "--exit",
        dest="exit_path",
        choices=("cleanup", "destroy", "none"),
        default="cleanup",
        help="how the worker leaves: psyrl's cleanup (the fix), "
        "destroy_process_group() alone (psyrl before it), or nothing",
    )
    parser.add_argument(
        "--busy",
        type=int,
        default=2,
        help="CPU-bound processes run beside the launches, as the other tests and "
        "jobs of a CI machine do; the race needs a descheduled gloo thread",
    )
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.exit_path)
        return
    torchrun = Path(sys.executable).parent / "torchrun"
    command = [
        str(torchrun),
        "--standalone",
        "--nproc_per_node",
        "2",
        __file__,
        "--worker",
        "--exit",
        args.exit_path,
    ]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # so that `finally` stops the loops
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        failed, aborted, threads = launch(command, args.launches)
    finally:
        for process in busy:
            process.kill()
    print(
        f"\n{args.launches} launches (--exit {args.exit_path}, --busy {args.busy}): {failed} "
        f"failed, {aborted} aborted with {ABORT!r}; gloo threads left at exit per rank "
        f"(--exit cleanup only): {sorted(threads)}"
    )


def launch(command: list[str], count: int) -> tuple[int, int, set[str]]:
    """Run `command` `count` times: (failed, aborted, the gloo thread counts the workers saw)."""
    failed = aborted = 0
    threads = set()
    start = time.time()
    for i in range(1, count + 1):
        result = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        )
        failed += result.returncode != 0
        aborted += ABORT in result.stderr
        threads |= {
            line.rsplit(" ", 1)[1]
            for line in result.stdout.splitlines()
            if "gloo threads at exit" in line
        }
        if result.returncode and ABORT not in result.stderr:
            print(result.stderr[-2000:], file=sys.stderr)
        print(
            f"\rlaunch {i}/{count}: {failed} failed, {aborted} aborted "
            f"({time.time() - start:.0f} s)",
            end="",
            flush=True,
        )
    return failed, aborted, threads


if __name__ == "__main__":
    main()
