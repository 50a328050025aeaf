"""Does the scratchpad's lead grow with the number of events? (issue 43 item 2, docs/testbed.md)

Reads a finished testbed check (experiments/testbed-check-tiny.toml): per seed s, the evaluations
cot-seed<s>/ and direct-seed<s>/, each with predictions of the three level files. Prints, per
level k, the paired gap CoT - direct (F1 x100) and, for k > 1, how much larger it is than at k = 1,
(gap_k - gap_1), each with a 95 % percentile bootstrap interval that resamples the seeds (once for
both levels) and each level's items (its own items: the levels hold different items).

    python bench/testbed_gap.py runs/experiments/testbed-check-tiny
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from psyrl.eval.benchmarks import read_predictions
from psyrl.experiment.stats import interval, resample_weights


def gaps(root: Path) -> dict[str, np.ndarray]:
    """level -> [seeds, items] of CoT - direct F1 x100, items in id order."""
    seeds = sorted(int(p.name.rsplit("seed", 1)[1]) for p in root.glob("cot-seed*"))
    out: dict[str, list] = {}
    for s in seeds:
        by = {}
        for row_name in ("cot", "direct"):
            rows, _ = read_predictions(root / f"{row_name}-seed{s}" / "predictions.jsonl")
            by[row_name] = {(r["benchmark"], r["id"]): 100 * r["f1"] for r in rows}
        if by["cot"].keys() != by["direct"].keys():
            raise SystemExit(f"seed {s}: CoT and direct scored different items")
        for level in sorted({b for b, _ in by["cot"]}):
            items = sorted(i for b, i in by["cot"] if b == level)
            diff = [by["cot"][level, i] - by["direct"][level, i] for i in items]
            out.setdefault(level, []).append(diff)
    return {level: np.array(rows) for level, rows in out.items()}


def main(root: Path, resamples: int = 4000, seed: int = 0) -> None:
    by_level = gaps(root)
    levels = sorted(by_level)
    count = by_level[levels[0]].shape[0]
    rng = np.random.default_rng(seed)
    seed_w = resample_weights(count, resamples, rng)  # [B, S], the same seeds for every level
    means = {}
    for level in levels:
        matrix = by_level[level]  # [S, N]
        item_w = resample_weights(matrix.shape[1], resamples, rng)  # [B, N], the level's own items
        means[level] = np.einsum("bs,sn,bn->b", seed_w, matrix, item_w)
    print(f"{root}: {count} seeds; F1 x100, mean [95 % bootstrap interval]")
    print("| level | CoT - direct | minus the gap at the first level |")
    print("| --- | ---: | ---: |")
    first = levels[0]
    for level in levels:
        gap = by_level[level].mean()
        low, high = interval(means[level])
        cells = [f"{gap:+.1f} [{low:+.1f}, {high:+.1f}]"]
        if level == first:
            cells.append("-")
        else:
            growth = means[level] - means[first]
            g_low, g_high = interval(growth)
            cells.append(f"{gap - by_level[first].mean():+.1f} [{g_low:+.1f}, {g_high:+.1f}]")
        print(f"| {level} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
