"""What importing each trainer loads, each in a fresh interpreter: the psyrl modules in sys.modules,
their lines (the sum of their files' line counts), and the count of all modules (psyrl's and every
library's). Issue 40's target: T-GRPO at most 7,000 lines of psyrl code.

    .venv/bin/python bench/trainer_imports.py [--root DIR] [--list]

--root measures the psyrl of another checkout (e.g. a `git worktree` of an older commit): the
interpreter starts in DIR, so `import psyrl` imports DIR/psyrl. --list prints each psyrl module with
its lines, largest first.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

TRAINERS = ["psyrl.recipes.tgrpo", "psyrl.recipes.sft"]

# run in the fresh interpreter: psyrl's modules with their files, and how many modules in all
PROBE = """
import json, sys
import {module}
files = {{name: getattr(m, "__file__", None) for name, m in list(sys.modules.items())}}
mine = {{n: f for n, f in files.items() if (n == "psyrl" or n.startswith("psyrl.")) and f}}
print(json.dumps({{"psyrl": mine, "all": len(sys.modules)}}))
"""


def measure(module: str, root: Path) -> tuple[dict[str, int], int]:
    """({psyrl module: its lines}, the number of modules in sys.modules) after `import module`."""
    done = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        cwd=root,
        capture_output=True,
        text=True,
        check=True,
    )
    found = json.loads(done.stdout)
    lines = {
        name: len(Path(path).read_text(encoding="utf-8").splitlines())
        for name, path in found["psyrl"].items()
    }
    return lines, found["all"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[1],
        help="checkout whose psyrl is measured",
    )
    parser.add_argument("--list", action="store_true", help="each psyrl module with its lines")
    args = parser.parse_args()
    print(f"| import ({args.root}) | psyrl modules | psyrl lines | all modules |")
    print("| --- | ---: | ---: | ---: |")
    measured = {module: measure(module, args.root) for module in TRAINERS}
    for module, (lines, total) in measured.items():
        print(f"| {module} | {len(lines)} | {sum(lines.values()):,} | {total:,} |")
    if args.list:
        for module, (lines, _) in measured.items():
            print(f"\n{module}:")
            for name, count in sorted(lines.items(), key=lambda item: -item[1]):
                print(f"  {count:6,}  {name}")


if __name__ == "__main__":
    main()
