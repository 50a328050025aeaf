"""psyrl.experiment.stats: the two-level percentile bootstrap and its paired version, on values
computed by hand (the arithmetic in comments) and against two independent references: a plain numpy
item bootstrap (one seed) and the normal-theory interval for normal draws."""

import math

import numpy as np
import pytest

from psyrl.experiment.stats import LEVEL, Estimate, bootstrap, paired

# ---------------------------------------------------------------- bootstrap: hand-computed


def test_one_seed_two_items_interval_is_zero_to_one():
    # items [0, 1]: a resample of 2 draws has 0, 1 or 2 ones with probabilities 1/4, 1/2, 1/4, so
    # the resampled mean is 0, 0.5 or 1 with 1/4, 1/2, 1/4. The 2.5th percentile falls inside the
    # mass at 0 and the 97.5th inside the mass at 1 (each holds ~500 of 2000 resamples, far more
    # than the 50 needed), so the interval is exactly [0, 1]; the mean is (0 + 1) / 2 = 0.5.
    estimate = bootstrap({0: [0.0, 1.0]})
    assert estimate == Estimate(mean=0.5, low=0.0, high=1.0, seeds=1, items=2)


def test_all_equal_scores_give_a_zero_width_interval_at_that_value():
    # every resample of [0.25, 0.25, 0.25] has mean 0.25 (sums of 0.25 are exact in binary), on
    # each of the 3 seeds, so every bootstrap mean, both percentiles and the mean are 0.25
    estimate = bootstrap({0: [0.25] * 3, 4: [0.25] * 5, 9: [0.25] * 2})
    # (the weighted means round in the last bit: 0.24999999999999997)
    assert estimate.mean == 0.25 and (estimate.seeds, estimate.items) == (3, 2)
    assert estimate.low == pytest.approx(0.25, abs=1e-15)
    assert estimate.high == pytest.approx(0.25, abs=1e-15)


def test_mean_is_over_the_items_every_seed_scored():
    # seed 0: items 0, 1       = [1, 0]
    # seed 1: items 0, 1, 2, 3 = [1, 1, 1, 0]
    # seeds and items are crossed: only items 0 and 1 count, the matrix [[1, 0], [1, 1]] has mean
    # 3/4 (not seed 1's own 3/4 over 4 items averaged with 1/2: 5/8); `items` is 2
    estimate = bootstrap({0: [1.0, 0.0], 1: [1.0, 1.0, 1.0, 0.0]})
    assert estimate.mean == 0.75
    assert (estimate.seeds, estimate.items) == (2, 2)
    assert 0.0 <= estimate.low <= estimate.mean <= estimate.high <= 1.0


def test_one_item_per_seed_is_the_seed_bootstrap():
    # two seeds with one item each, values 0 and 1: each drawn seed's item mean is its only item,
    # so a resample is the mean of 2 seed values drawn with replacement: 0, 0.5 or 1 with 1/4, 1/2,
    # 1/4 -- the distribution of one seed with items [0, 1], hence the same interval [0, 1]
    assert bootstrap({0: [0.0], 1: [1.0]}) == Estimate(0.5, 0.0, 1.0, seeds=2, items=1)
    # three seeds with values [0, 0, 3]: the number K of 3s among 3 draws is Binomial(3, 1/3):
    # P(K=0) = 8/27 = 0.296, P(K=1) = 12/27, P(K=2) = 6/27, P(K=3) = 1/27 = 0.037, means K.
    # 2.5th percentile: inside the mass 0.296 at 0 -> 0. P(mean <= 2) = 26/27 = 0.963 < 0.975,
    # so the 97.5th percentile lies in the mass 1/27 at 3 (~74 of 2000 resamples, sd 8.4, need
    # more than 50) -> 3. The mean is (0 + 0 + 3) / 3 = 1.
    seeds = bootstrap({0: [0.0], 1: [0.0], 2: [3.0]})
    assert seeds == Estimate(1.0, 0.0, 3.0, seeds=3, items=1)
    # the one-seed item bootstrap of the same values has the same distribution, the same interval
    items = bootstrap({0: [0.0, 0.0, 3.0]})
    assert (items.mean, items.low, items.high) == (1.0, 0.0, 3.0)


def test_empty_inputs_are_errors():
    with pytest.raises(ValueError, match="at least one seed"):
        bootstrap({})
    with pytest.raises(ValueError, match="at least one item"):
        bootstrap({0: [1.0], 1: []})


def test_same_inputs_same_interval():
    scores = {0: [0.1, 0.7, 0.3, 0.9], 1: [0.5, 0.2, 0.8], 2: [0.6, 0.4, 0.0, 1.0, 0.3]}
    assert bootstrap(scores) == bootstrap(scores)
    assert bootstrap(scores, seed=3) == bootstrap(scores, seed=3)
    # another generator seed moves the interval a little, never the mean
    other = bootstrap(scores, seed=1)
    assert other.mean == bootstrap(scores).mean
    assert (other.low, other.high) != (bootstrap(scores).low, bootstrap(scores).high)


# ---------------------------------------------------------------- bootstrap: references


def _quantile_mc_sd(sigma: float, resamples: int) -> float:
    """Monte-Carlo sd of the 2.5 % (or 97.5 %) sample quantile of `resamples` draws from a roughly
    normal distribution with sd `sigma`: sqrt(p (1 - p) / B) / f(q), f(q) = phi(1.96) / sigma (the
    asymptotic variance of a sample quantile)."""
    p = (1 - LEVEL) / 2
    density = math.exp(-(1.96**2) / 2) / math.sqrt(2 * math.pi) / sigma  # 0.0584 / sigma
    return math.sqrt(p * (1 - p) / resamples) / density  # = 2.67 sigma / sqrt(B)


def test_one_seed_matches_a_plain_numpy_percentile_bootstrap():
    # reference: the textbook item bootstrap (Efron & Tibshirani ch. 13), written independently:
    # B_ref resamples of n items with replacement, percentiles 2.5 and 97.5 of their means
    data = np.random.default_rng(7).uniform(0, 1, size=40)  # [40]
    b_ref, b_ours = 200_000, 20_000
    rng = np.random.default_rng(123)
    means = np.empty(b_ref)
    for start in range(0, b_ref, 50_000):  # chunks keep the index array at 16 MB
        draws = rng.integers(0, len(data), size=(50_000, len(data)))  # [50000, 40]
        means[start : start + 50_000] = data[draws].mean(axis=1)
    ref_low, ref_high = np.percentile(means, [2.5, 97.5])
    ours = bootstrap({0: data.tolist()}, resamples=b_ours, seed=5)
    assert ours.mean == pytest.approx(data.mean(), abs=1e-15)
    # both are Monte-Carlo estimates of the same percentiles; sigma = sd(data, ddof=0) / sqrt(n)
    # is the sd of the bootstrap distribution of the mean (0.047 here): the quantile MC sds are
    # 2.67 sigma / sqrt(B): 0.019 sigma (ours) and 0.006 sigma (reference), 0.020 sigma together.
    # 4 of those (a 1-in-16 000 chance of a false alarm per bound) is 0.0037 here.
    sigma = data.std() / math.sqrt(len(data))
    tolerance = 4 * math.hypot(_quantile_mc_sd(sigma, b_ours), _quantile_mc_sd(sigma, b_ref))
    assert tolerance < 0.1 * sigma  # the check is sharp: a tenth of the interval's scale
    assert ours.low == pytest.approx(ref_low, abs=tolerance)
    assert ours.high == pytest.approx(ref_high, abs=tolerance)


def test_normal_draws_match_the_normal_theory_interval():
    # n = 400 draws of N(10, 2^2): the normal-theory 95 % interval of the mean is
    # mean ± 1.96 s / sqrt(n). The percentile bootstrap estimates the same interval; they differ
    # by (1) Monte-Carlo error, 2.67 sigma / sqrt(B) = 0.019 sigma per bound at B = 20 000
    # (sigma = s / sqrt(n) = 0.096 here); (2) the plug-in sd (divisor n, not n - 1): a factor
    # sqrt(399/400), 0.0025 sigma on a bound 1.96 sigma from the mean; (3) the skewness of the
    # bootstrap distribution: an Edgeworth term gamma (z^2 - 1) / (6 sqrt(n)) sigma with the
    # sample skewness gamma ~ ±0.12 (its sd sqrt(6 / n)): 0.003 sigma. Sum at 4 MC sds:
    # 0.076 + 0.0025 + 0.003 < 0.1 sigma, the tolerance (0.01 in the data's units).
    n, b = 400, 20_000
    data = np.random.default_rng(11).normal(10.0, 2.0, size=n)  # [400]
    s = data.std(ddof=1)
    sigma = s / math.sqrt(n)
    normal_low, normal_high = data.mean() - 1.96 * sigma, data.mean() + 1.96 * sigma
    ours = bootstrap({0: data.tolist()}, resamples=b, seed=2)
    assert 4 * _quantile_mc_sd(sigma, b) + 0.0025 * sigma + 0.003 * sigma < 0.1 * sigma
    assert ours.mean == pytest.approx(data.mean(), rel=1e-14)
    assert ours.low == pytest.approx(normal_low, abs=0.1 * sigma)
    assert ours.high == pytest.approx(normal_high, abs=0.1 * sigma)


# ---------------------------------------------------------------- paired


def test_identical_rows_differ_by_exactly_zero():
    # every per-item difference is x - x = 0.0 exactly, so every resample mean is 0
    row = {0: {"a": 0.3, "b": 0.9, "c": 0.1}, 1: {"a": 0.7, "b": 0.2, "c": 0.4}}
    assert paired(row, row) == Estimate(0.0, 0.0, 0.0, seeds=2, items=3)


def test_pairs_by_item_id_on_the_common_items_only():
    # a has x, y, z and b has z, y, w (another order, an extra item each): the common items are
    # y and z; differences y: 0 - 0 = 0, z: 1 - 0 = 1 -> mean 0.5 over 2 items, and the
    # resamples of [0, 1] give the interval [0, 1] (first test of this file). Pairing by position
    # instead would give a - b = [1 - 0, 0 - 0, 1 - 5] with mean -4/3.
    a = {0: {"x": 1.0, "y": 0.0, "z": 1.0}}
    b = {0: {"z": 0.0, "y": 0.0, "w": 5.0}}
    assert paired(a, b) == Estimate(0.5, 0.0, 1.0, seeds=1, items=2)
    # and the reverse: b - a = [0, -1], mean -0.5, interval [-1, 0]
    assert paired(b, a) == Estimate(-0.5, -1.0, 0.0, seeds=1, items=2)


def test_one_run_row_pairs_with_every_seed():
    # a: one run (an evaluation of a fixed model, seed key -1 as tables.py writes it), items
    # i = 1, j = 1; b: seeds 0 and 1. a is paired with each of b's seeds:
    #   seed 0: [1 - 0, 1 - 0] = [1, 1] -> 1;  seed 1: [1 - 1, 1 - 0] = [0, 1] -> 0.5
    #   mean over seeds (1 + 0.5) / 2 = 0.75, on 2 seeds
    a = {-1: {"i": 1.0, "j": 1.0}}
    b = {0: {"i": 0.0, "j": 0.0}, 1: {"i": 1.0, "j": 0.0}}
    estimate = paired(a, b)
    assert (estimate.mean, estimate.seeds, estimate.items) == (0.75, 2, 2)
    # b - a, the other way round: -0.75
    assert paired(b, a).mean == -0.75
    # the interval: every resample mean lies in [0, 1] (seed 0 always gives 1, seed 1 gives 0, 0.5
    # or 1), and the mean 0.75 inside it
    assert 0.0 <= estimate.low <= 0.75 <= estimate.high <= 1.0


def test_two_single_runs_pair_whatever_their_seeds():
    # one run each (e.g. both rows under --seeds 0, or two unseeded evaluations): 1 - 0.5 = 0.5
    assert paired({-1: {"i": 1.0}}, {3: {"i": 0.5}}) == Estimate(0.5, 0.5, 0.5, 1, 1)


def test_seeded_rows_pair_seed_by_seed():
    # a seed 0: [1, 1], seed 1: [0, 0]; b seed 0: [0, 0], seed 1: [0, 0], seed 2 (a lacks it):
    # [9, 9]. Common seeds 0 and 1: differences [1, 1] -> 1 and [0, 0] -> 0, mean 0.5; seed 2
    # is left out (with it, the mean would be (1 + 0 - 9) / 3).
    a = {0: {"i": 1.0, "j": 1.0}, 1: {"i": 0.0, "j": 0.0}}
    b = {0: {"i": 0.0, "j": 0.0}, 1: {"i": 0.0, "j": 0.0}, 2: {"i": 9.0, "j": 9.0}}
    estimate = paired(a, b)
    assert (estimate.mean, estimate.seeds) == (0.5, 2)
    # resamples draw 2 seed slots from {diff 1, diff 0}: 0, 0.5, 1 with 1/4, 1/2, 1/4 -> [0, 1]
    assert (estimate.low, estimate.high) == (0.0, 1.0)


def test_a_row_with_one_of_several_seeds_pairs_only_with_that_seed():
    # a: only seed 0 finished, item i = 1; b: seeds 0, 1, 2 with i = 0, 1, 1.
    # Paired by seed (the module docstring: "the seeds ... both have"): seed 0 only, 1 - 0 = 1.
    # paired() instead copies a's seed 0 to seeds 1 and 2: (1 + 0 + 0) / 3 = 1/3 on 3 seeds.
    estimate = paired({0: {"i": 1.0}}, {0: {"i": 0.0}, 1: {"i": 1.0}, 2: {"i": 1.0}})
    assert (estimate.mean, estimate.seeds) == (1.0, 1)


def test_no_common_seed_is_an_error():
    a = {0: {"i": 1.0}, 1: {"i": 1.0}}
    b = {2: {"i": 1.0}, 3: {"i": 1.0}}
    with pytest.raises(ValueError, match=r"no seed in common \(seeds \[0, 1\] and \[2, 3\]\)"):
        paired(a, b)


def test_no_common_item_is_an_error():
    with pytest.raises(ValueError, match="seed 0: no item scored by both rows"):
        paired({0: {"x": 1.0}}, {0: {"y": 1.0}})


def test_paired_is_deterministic():
    a = {0: {"i": 0.2, "j": 0.9, "k": 0.4}, 1: {"i": 0.6, "j": 0.1, "k": 0.8}}
    b = {0: {"k": 0.5, "i": 0.3, "j": 0.3}, 1: {"j": 0.7, "i": 0.2, "k": 0.1}}
    assert paired(a, b) == paired(a, b)
    # and equals the bootstrap of the hand-paired differences (items sorted by id: i, j, k)
    # seed 0: [0.2 - 0.3, 0.9 - 0.3, 0.4 - 0.5]; seed 1: [0.6 - 0.2, 0.1 - 0.7, 0.8 - 0.1]
    differences = {0: [0.2 - 0.3, 0.9 - 0.3, 0.4 - 0.5], 1: [0.6 - 0.2, 0.1 - 0.7, 0.8 - 0.1]}
    assert paired(a, b) == bootstrap(differences)


def test_identical_seeds_add_no_width_items_are_crossed_with_seeds():
    # three seeds that scored every item the same: no seed spread, so the interval is the one
    # seed's item interval (a nested draw, items per seed, would shrink it by about 1/sqrt(3));
    # the two differ only by Monte-Carlo error of B = 20,000 resamples (well under 5 %)
    scores = [float(i % 3 == 0) for i in range(90)]
    one = bootstrap({0: scores}, resamples=20000)
    three = bootstrap({0: scores, 1: scores, 2: scores}, resamples=20000)
    width = lambda e: e.high - e.low
    assert three.mean == one.mean
    assert width(three) == pytest.approx(width(one), rel=0.05)
