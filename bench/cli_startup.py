"""Wall time of `psyrl --help` and of each command's --help, each in a fresh interpreter (`python -m
psyrl ...`), with `import torch` beside them as the yardstick. Results: docs/measurements.md ("CLI
start-up").

    .venv/bin/python bench/cli_startup.py [--repeat 7] [--root DIR]

--root times the psyrl of another checkout (e.g. a `git worktree` of an older commit): the
interpreter starts in DIR, so `python -m psyrl` imports DIR/psyrl.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

COMMANDS = [
    [],
    ["train-sft"],
    ["train-tgrpo"],
    ["evaluate"],
    ["build"],
    ["build", "qa"],
    ["data", "convert"],
    ["report"],
    ["plan"],
    ["config", "show"],
]


def wall(args: list[str], cwd: Path) -> float | None:
    """Seconds for one run, or None when the command does not exist there (exit status != 0)."""
    t0 = time.perf_counter()
    done = subprocess.run(args, cwd=cwd, capture_output=True)
    elapsed = time.perf_counter() - t0
    return elapsed if done.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=7, help="runs per command (median, min)")
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[1],
        help="checkout whose psyrl is timed",
    )
    args = parser.parse_args()
    rows = [("import torch", [sys.executable, "-c", "import torch"])]
    rows += [
        (" ".join(["psyrl", *c, "--help"]), [sys.executable, "-m", "psyrl", *c, "--help"])
        for c in COMMANDS
    ]
    print(f"| command ({args.root}) | median s | min s |\n| --- | ---: | ---: |")
    for label, command in rows:
        times = [wall(command, args.root) for _ in range(args.repeat)]
        if None in times:
            print(f"| `{label}` | (no such command) | |")
            continue
        print(f"| `{label}` | {statistics.median(times):.2f} | {min(times):.2f} |", flush=True)


if __name__ == "__main__":
    main()
