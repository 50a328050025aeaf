"""How many self-labels are right: for an evaluate.py run on the selftrain half, the items `psyrl
self-label` keeps at each tau, for both confidences, and how many of their new labels equal the gold
answer. An analysis that reads the gold answers AFTER labelling (the labelling itself never does);
results in docs/evaluation.md (continual self-training).

    python bench/self_label_precision.py runs/self-train/label-half
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from psyrl.eval.benchmarks import read_predictions, resolve_sources
from psyrl.eval.self_label import self_label

TAUS = {"f1": (0.4, 0.6, 0.8, 0.99), "logprob": (0.4, 0.5, 0.6, 0.7, 0.8)}


@click.command()
@click.argument("eval_dir", type=click.Path(exists=True, file_okay=False))
def main(eval_dir):
    settings = json.loads((Path(eval_dir) / "eval.json").read_text())
    records = {
        r.id: r
        for s in resolve_sources([s["path"] for s in settings["sources"]], ".")
        for r in s.records
    }
    rows, _ = read_predictions(Path(eval_dir) / "predictions.jsonl")
    right = sum(bool(r["correct"]) for r in rows)
    print(f"{len(rows)} predictions, {right} right ({right / len(rows):.3f})\n")
    print("| confidence | tau | kept | labels equal to gold | precision |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for confidence, taus in TAUS.items():
        for tau in taus:
            kept, _ = self_label(
                rows, records, tau, confidence, mode=settings["prompt"], options=settings["options"]
            )
            good = sum(records[k.id.removeprefix("self/")].answer == k.answer for k in kept)
            print(
                f"| {confidence} | {tau} | {len(kept)} | {good} | {good / max(1, len(kept)):.3f} |"
            )


if __name__ == "__main__":
    main()
