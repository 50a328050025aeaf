"""Seed spread and paired comparisons for the experiment tables (issue 22; the paper reports single
runs): a percentile bootstrap over seeds and items together.

A row of a table is `scores[seed] = {item: score}`, every seed scoring the same items (an
evaluation's items do not depend on the run's seed): seeds and items are crossed, not nested. Its
value is the mean over the seed x item matrix. Each of B resamples draws S seeds and, once for all
of them, N items, both with replacement, and averages the drawn rows and columns (Owen 2007, "The
pigeonhole bootstrap", Ann. Appl. Stat. 1(2): resampling both factors of a crossed design); the
2.5th and 97.5th percentiles of the B means bound the 95 % interval (the percentile method, Efron &
Tibshirani 1993, ch. 13). Drawing items per seed instead would treat a seed's items as its own and
shrink the items' share of the variance by 1/S. With one seed it is the ordinary item bootstrap;
with one item, the seed bootstrap. Only the items every seed scored count.

A paired comparison of rows A and B resamples the differences A - B on the seeds and items both
have, with the same draws for both rows, so what they share (the seed's data order, an item's
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
    """A mean with its 95 % bootstrap interval, over `seeds` seeds and the `items` items every seed
    scored."""

    mean: float
    low: float
    high: float
    seeds: int
    items: int

    def as_dict(self) -> dict:
        return {
            "mean": self.mean,
            "low": self.low,
            "high": self.high,
            "seeds": self.seeds,
            "items": self.items,
        }


def _by_item(values: Mapping | Sequence) -> Mapping:
    return values if isinstance(values, Mapping) else dict(enumerate(values))


def resample_weights(count: int, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """[resamples, count]: how often each of `count` units is drawn in a resample of them with
    replacement, divided by `count`, so that weights @ values is the resample's mean."""
    return rng.multinomial(count, np.full(count, 1 / count), size=resamples) / count


def interval(means: np.ndarray) -> tuple[float, float]:
    """The percentile interval (LEVEL) of bootstrap resample means."""
    tail = (1 - LEVEL) / 2
    low, high = np.quantile(means, [tail, 1 - tail])
    return float(low), float(high)


def bootstrap(
    scores: Mapping[int, Mapping[str, float] | Sequence[float]],
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """The mean over seeds and items, with the crossed percentile bootstrap interval (a sequence of
    scores stands for items 0, 1, ...)."""
    if not scores:
        raise ValueError("bootstrap needs at least one seed")
    rows = [_by_item(scores[s]) for s in sorted(scores)]
    items = sorted(set.intersection(*(set(r) for r in rows)), key=str)
    if not items:
        raise ValueError("bootstrap needs at least one item that every seed scored")
    matrix = np.array([[r[i] for i in items] for r in rows], dtype=np.float64)  # [S, N]
    count, n = matrix.shape
    rng = np.random.default_rng(seed)
    seed_weights = resample_weights(count, resamples, rng)  # [B, S]
    item_weights = resample_weights(n, resamples, rng)  # [B, N]
    means = np.einsum("bs,sn,bn->b", seed_weights, matrix, item_weights)  # [B]
    return Estimate(float(matrix.mean()), *interval(means), count, n)


def paired(
    a: Mapping[int, Mapping[str, float]],
    b: Mapping[int, Mapping[str, float]],
    resamples: int = 2000,
    seed: int = 0,
) -> Estimate:
    """A - B over the seeds both rows have and the items both scored. Seed -1 marks a run without
    seeds (e.g. an evaluation of a fixed model): it pairs with every seed of the other row."""
    if list(a) == [UNSEEDED] and list(b) != [UNSEEDED]:
        a = dict.fromkeys(b, a[UNSEEDED])
    if list(b) == [UNSEEDED] and list(a) != [UNSEEDED]:
        b = dict.fromkeys(a, b[UNSEEDED])
    seeds = sorted(set(a) & set(b))
    if not seeds:
        raise ValueError(f"no seed in common (seeds {sorted(a)} and {sorted(b)})")
    differences = {}
    for s in seeds:
        items = set(a[s]) & set(b[s])
        if not items:
            raise ValueError(f"seed {s}: no item scored by both rows")
        differences[s] = {i: a[s][i] - b[s][i] for i in items}
    return bootstrap(differences, resamples, seed)
