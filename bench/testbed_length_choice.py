"""The length-choice testbed (issue 43, docs/testbed.md): the forms a model answers in, per level.

    python bench/testbed_length_choice.py forms PREDICTIONS.jsonl ...
    python bench/testbed_length_choice.py table RUNS    # RUNS: <output-dir>/testbed-choice-tiny
    python bench/testbed_length_choice.py tokens      # reasoning tokens per level and form
    python bench/testbed_length_choice.py data OUT    # the first pilot's data (below)

`forms`: per level, the share of responses in each reasoning form of `psyrl demo-data --task choice`
(terse: "; at the end:", padded: "Nothing else happens", else short at k = 1 and full at k > 1),
and F1 x100 and mean response tokens per form. `table`: for testbed-choice-tiny's rows, a markdown
table: per level the share of responses in the long form (padded at k = 1, full at k > 1), the
mean over seeds and each seed's, and F1 x100 per form, the seeds pooled. `tokens`: the reasoning
texts of `psyrl demo-data --task choice --seed 0` (both splits) in the tiny tokenizer's tokens,
min / mean / max per level and form. `data`: the first pilot's
data, before the generator had the task: each training item of data/testbed-swing/ keeps its
reasoning or, with probability 0.5 (random.Random(0)), gets "<Start> to start; at the end:
<answer>."; the test files are unchanged.
"""

from __future__ import annotations

import json
import random
import shutil
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from psyrl.eval.benchmarks import read_predictions

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


def form_of(response: str, level: str) -> str:
    if "; at the end:" in response:
        return "terse"
    if "Nothing else happens" in response:
        return "padded"
    return "short" if level == "k1" else "full"


FORMS = ("short", "padded", "terse", "full")


def by_form(path: Path) -> dict[tuple[str, str], list[dict]]:
    """A predictions.jsonl's rows grouped by (level, form), the level read from the benchmark
    name (test-k1 -> k1)."""
    groups = defaultdict(list)
    for r in read_predictions(path)[0]:
        level = r["benchmark"].rsplit("-", 1)[-1]
        groups[level, form_of(r["response"], level)].append(r)
    return groups


def forms(path: Path) -> None:
    groups = by_form(path)
    print(path)
    for level in ("k1", "k2", "k3"):
        count = sum(len(groups[level, f]) for f in FORMS)
        cells = [
            f"{f} {len(rows) / count:.0%} F1 {100 * statistics.mean(r['f1'] for r in rows):.1f}"
            f" tok {statistics.mean(r['tokens'] for r in rows):.1f}"
            for f in FORMS
            if (rows := groups[level, f])
        ]
        every = [r["f1"] for f in FORMS for r in groups[level, f]]
        print(f"  {level}: all F1 {100 * statistics.mean(every):.1f} | " + " | ".join(cells))


ROWS = {
    "cot": "CoT (the stand-in)",
    "base": "Basic R1",
    "bilateral": "BR",
    "base-cache": "Basic R1, cache scope",
    "bilateral-cache": "BR, cache scope",
    "base-cache-token": "Basic R1, cache scope, token-mean",
    "bilateral-cache-token": "BR, cache scope, token-mean",
}
LONG = {"k1": "padded", "k2": "full", "k3": "full"}
SHORT = {"k1": "short", "k2": "terse", "k3": "terse"}


def table(root: Path) -> None:
    print(
        "| run | " + " | ".join(f"{k}: long form % (per seed); F1 short, long" for k in LONG) + " |"
    )
    print("| --- |" + " --- |" * len(LONG))
    for run, label in ROWS.items():
        seeds = sorted(root.glob(f"{run}-seed*/**/predictions.jsonl"))
        if not seeds:
            continue
        per_seed = [by_form(path) for path in seeds]
        cells = []
        for level in LONG:
            shares = [
                len(s[level, LONG[level]]) / sum(len(s[level, f]) for f in FORMS) for s in per_seed
            ]
            f1 = {
                form: [r["f1"] for s in per_seed for r in s[level, form]]
                for form in (SHORT[level], LONG[level])
            }
            scores = ", ".join(f"{100 * statistics.mean(v):.1f}" if v else "-" for v in f1.values())
            each = "/".join(f"{100 * x:.0f}" for x in shares)
            cells.append(f"{100 * statistics.mean(shares):.0f} ({each}); {scores}")
        print(f"| {label} ({len(seeds)} seeds) | " + " | ".join(cells) + " |")


def tokens() -> None:
    from psyrl.core.config import ModelConfig
    from psyrl.dataset.testbed import FORMS as LEVEL_FORMS
    from psyrl.dataset.testbed import generate
    from psyrl.runtime.model import load_tokenizer

    tokenizer = load_tokenizer(ModelConfig(tokenizer="tiny"))
    items = generate("choice", 0).items
    for k, level_forms in LEVEL_FORMS.items():
        for form in level_forms:
            texts = [i.record.reasoning for i in items if (i.k, i.form) == (k, form)]
            counts = [len(tokenizer(t, add_special_tokens=False)["input_ids"]) for t in texts]
            print(f"k{k} {form}: {min(counts)} / {statistics.mean(counts):.1f} / {max(counts)}")


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "data":
        make_data(Path(sys.argv[2]))
    elif len(sys.argv) == 2 and sys.argv[1] == "tokens":
        tokens()
    elif len(sys.argv) == 3 and sys.argv[1] == "table":
        table(Path(sys.argv[2]))
    elif len(sys.argv) >= 3 and sys.argv[1] == "forms":
        for p in sys.argv[2:]:
            forms(Path(p))
    else:
        raise SystemExit(__doc__)
