"""A first pilot of a testbed where the model can choose its length (issue 43, docs/testbed.md
"What is left"): half of swing's training items get a terse scratchpad instead of the full one.

    python bench/testbed_length_choice.py data OUT    # OUT/train.jsonl, the test files copied
    python bench/testbed_length_choice.py forms PREDICTIONS.jsonl ...

`data`: each training item of data/testbed-swing/ keeps its reasoning or, with probability 0.5
(random.Random(0)), gets "<Start> to start; at the end: <answer>."; the test files are unchanged.
`forms`: per level, the share of terse responses (they say "at the end:"), and F1 x100 and mean
response tokens per form. Run the experiment on it with a copy of experiments/testbed-tiny.toml
whose data/testbed-swing/ paths point at OUT.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import sys
from collections import defaultdict
from pathlib import Path

SOURCE = Path(__file__).resolve().parent.parent / "data" / "testbed-swing"


def terse(item: dict) -> str:
    start = item["reasoning"].split(",")[0].split(" to start")[0].split(".")[0]
    return f"{start} to start; at the end: {item['answer']}."


def make_data(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(0)
    lines, changed = [], 0
    for line in (SOURCE / "train.jsonl").read_text().splitlines():
        item = json.loads(line)
        if rng.random() < 0.5:
            item["reasoning"] = terse(item)
            changed += 1
        lines.append(json.dumps(item))
    (out / "train.jsonl").write_text("\n".join(lines) + "\n")
    for test in SOURCE.glob("test*.jsonl"):
        shutil.copy(test, out / test.name)
    print(f"{out}: {changed} of {len(lines)} training items terse")


def forms(path: Path) -> None:
    groups = defaultdict(list)
    for line in path.read_text().splitlines():
        r = json.loads(line)
        form = "terse" if "at the end:" in r["response"] else "full"
        groups[r["benchmark"].rsplit("-", 1)[-1], form].append(r)
    print(path)
    for level in ("k1", "k2", "k3"):
        count = sum(len(groups[level, f]) for f in ("terse", "full"))
        cells = [
            f"{f} {len(rows) / count:.0%} F1 {100 * statistics.mean(r['f1'] for r in rows):.1f}"
            f" tok {statistics.mean(r['tokens'] for r in rows):.1f}"
            for f in ("terse", "full")
            if (rows := groups[level, f])
        ]
        every = [r["f1"] for f in ("terse", "full") for r in groups[level, f]]
        print(f"  {level}: all F1 {100 * statistics.mean(every):.1f} | " + " | ".join(cells))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "data":
        make_data(Path(sys.argv[2]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "forms":
        for p in sys.argv[2:]:
            forms(Path(p))
    else:
        raise SystemExit(__doc__)
