"""Seed spread and paired comparisons for the experiment tables (issue 22; the paper reports single
runs): a two-level percentile bootstrap, seeds first, then items within each drawn seed.

A row of a table is `scores[seed] = [item scores]`. Its value is the mean over seeds of the mean
over items. The interval resamples both sources of spread: B times, draw S seeds with replacement,
and for each drawn seed N_s of its items with replacement; the 2.5th and 97.5th percentiles of the
B means bound the 95 % interval (Efron & Tibshirani 1993, ch. 13, the percentile method; Davison &
Hinkley 1997, §3.8, resampling both stages of a two-stage sample). With one seed it is the ordinary
item bootstrap; with one item per seed, the seed bootstrap.

A paired comparison of rows A and B uses the per-seed, per-item differences A - B on the seeds and
items both have: the same draws for both rows, so what they share (the seed's data order, an item's
difficulty) cancels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95
UNSEEDED = -1  # the seed key of a run without seeds


@dataclass(frozen=True)
class Estimate:
    """A mean with its 95 % bootstrap interval, over `seeds` seeds and `items` items per seed (the
    fewest of any seed)."""

    mean: float
    low: float
    high: float
    seeds: int
    items: int

    def as_dict(self) -> dict:
        return {"mean": self.mean, "low": self.low, "high": self.high, "seeds": self.seeds,
                "items": self.items}


def bootstrap(scores: Mapping[int, Sequence[float]], resamples: int = 2000,
              seed: int = 0) -> Estimate:
    """The mean over seeds of the item means, with a two-level percentile bootstrap interval."""
    if not scores or any(len(v) == 0 for v in scores.values()):
        raise ValueError("bootstrap needs at least one seed, each with at least one item")
    arrays = [np.asarray(scores[s], dtype=np.float64) for s in sorted(scores)]
    mean = float(np.mean([a.mean() for a in arrays]))
    rng = np.random.default_rng(seed)
    count = len(arrays)
    # item means of independent resamples, one set per (seed, slot): a seed drawn into two slots of
    # one resample gets two independent item draws
    item_means = np.stack([
        np.stack([a[rng.integers(len(a), size=(resamples, len(a)))].mean(axis=1)  # [B]
                  for _ in range(count)])  # [S slots, B]
        for a in arrays])  # [S seeds, S slots, B]
    drawn = rng.integers(count, size=(resamples, count))  # [B, S] seeds, with replacement
    slots = np.arange(count)[None, :]  # [1, S]
    rows = np.arange(resamples)[:, None]  # [B, 1]
    means = item_means[drawn, slots, rows].mean(axis=1)  # [B]
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return Estimate(mean, float(low), float(high), len(arrays), min(len(a) for a in arrays))


def paired(a: Mapping[int, Mapping[str, float]], b: Mapping[int, Mapping[str, float]],
           resamples: int = 2000, seed: int = 0) -> Estimate:
    """A - B over the seeds both rows have and, within a seed, the items both scored. Seed -1 marks
    a run without seeds (e.g. an evaluation of a fixed model): it pairs with every seed of the
    other row."""
    if list(a) == [UNSEEDED] and list(b) != [UNSEEDED]:
        a = dict.fromkeys(b, a[UNSEEDED])
    if list(b) == [UNSEEDED] and list(a) != [UNSEEDED]:
        b = dict.fromkeys(a, b[UNSEEDED])
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError(f"no seed in common (seeds {sorted(a)} and {sorted(b)})")
    differences = {}
    for s in seeds:
        items = sorted(set(a[s]) & set(b[s]))
        if not items:
            raise ValueError(f"seed {s}: no item scored by both rows")
        differences[s] = [a[s][i] - b[s][i] for i in items]
    return bootstrap(differences, resamples, seed)
