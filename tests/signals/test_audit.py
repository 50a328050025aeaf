"""The audit's figures, computed by hand, and the rows `psyrl reward score|audit` read."""

import json

import pytest
import torch

from psyrl.rl.accuracy import Pair
from psyrl.signals.audit import (
    RowsError,
    Triple,
    audit,
    bootstrap_means,
    load_pairs,
    load_triples,
    percentile_interval,
)


def t(*values):
    return torch.tensor(values, dtype=torch.float64)


def test_above_counts_ties_as_not_above_and_margin_is_the_mean_difference():
    # right - wrong = 0.8, 0.0 (a tie), -0.2: above = 1, 0, 0 -> 1/3; margin (0.8 + 0 - 0.2) / 3
    result = audit(t(0.9, 0.5, 0.2), t(0.1, 0.5, 0.4))
    assert result.n == 3 and result.ties == 1
    assert result.above == pytest.approx(1 / 3)
    assert result.margin == pytest.approx(0.2)
    low, high = result.above_interval
    assert 0 <= low <= 1 / 3 <= high <= 1


def test_a_constant_difference_has_a_zero_width_interval():
    # every resample of [1, 1, 1, 1] has mean 1; of margins [0.3] * 4, mean 0.3
    result = audit(t(0.5, 0.6, 0.7, 0.8), t(0.2, 0.3, 0.4, 0.5))
    assert result.above == 1 and result.above_interval == (1.0, 1.0)
    assert result.margin == pytest.approx(0.3)
    assert result.margin_interval == pytest.approx((0.3, 0.3))


def test_two_triples_one_above_span_zero_to_one():
    # n = 2, above = [1, 0]: a resample's mean is 0, 0.5 or 1 with probability 1/4, 1/2, 1/4, so of
    # 10,000 resamples about 2,500 are 0 and 2,500 are 1, far more than the 250 each tail cuts off:
    # the 2.5th percentile is 0 and the 97.5th is 1. Margins [0.4, -0.2]: means -0.2, 0.1, 0.4.
    result = audit(t(0.6, 0.1), t(0.2, 0.3))
    assert result.above == 0.5 and result.above_interval == (0.0, 1.0)
    assert result.margin == pytest.approx(0.1)
    assert result.margin_interval == pytest.approx((-0.2, 0.4))


def test_bootstrap_is_seeded_and_resamples_with_replacement():
    values = t(0.0, 1.0, 2.0, 3.0, 4.0)
    a, b = bootstrap_means(values, 1000, seed=7), bootstrap_means(values, 1000, seed=7)
    assert torch.equal(a, b) and a.shape == (1000,)
    assert not torch.equal(a, bootstrap_means(values, 1000, seed=8))
    # each mean is a mean of 5 draws from {0..4}: a multiple of 1/5 between 0 and 4
    assert torch.allclose(a * 5, (a * 5).round()) and a.min() >= 0 and a.max() <= 4
    assert a.mean().item() == pytest.approx(2.0, abs=0.05)  # the sample mean, 2


def test_percentile_interval_interpolates_linearly():
    # 101 values 0.00 .. 1.00: the 2.5th percentile sits at position 0.025 * 100 = 2.5, between
    # 0.02 and 0.03 -> 0.025; the 97.5th at 97.5 -> 0.975 (numpy's default, linear)
    means = torch.arange(101, dtype=torch.float64) / 100
    low, high = percentile_interval(means)
    assert low.item() == pytest.approx(0.025) and high.item() == pytest.approx(0.975)


def test_audit_refuses_mismatched_or_empty_scores():
    with pytest.raises(ValueError, match="one length"):
        audit(t(0.1, 0.2), t(0.1))
    with pytest.raises(ValueError, match="one length"):
        audit(t(), t())


# ---------------------------------------------------------------- rows
def write(tmp_path, *lines):
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


def test_rows_load_with_optional_and_extra_keys(tmp_path):
    path = write(
        tmp_path,
        json.dumps({"gold": "Proud", "prediction": "", "id": 3}),
        "",
        json.dumps({"gold": "Sad", "prediction": "Blue", "stimulus": "s", "question": None}),
    )
    assert load_pairs(path) == [Pair("Proud", ""), Pair("Sad", "Blue", stimulus="s")]
    path = write(tmp_path, json.dumps({"gold": "g", "right": "r", "wrong": "w", "question": "q"}))
    (triple,) = load_triples(path)
    assert triple == Triple("g", "r", "w", question="q")
    assert triple.pairs() == (Pair("g", "r", question="q"), Pair("g", "w", question="q"))


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"gold": "a", "prediction": "b"}', "{not json"], ":2: invalid JSON"),
        (['["a", "b"]'], ':1: expected a JSON object with string keys "gold", "prediction", got'),
        (['{"prediction": "b"}'], ":1: missing key 'gold' (a string)"),
        (['{"gold": "a", "prediction": 3}'], ":1: key 'prediction': expected a string, got 3"),
        (['{"gold": " ", "prediction": "b"}'], ":1: key 'gold': must not be empty"),
        (['{"gold": "a", "prediction": "b", "stimulus": 1}'], ":1: key 'stimulus': expected a"),
        ([], ': the file holds no rows (expected one JSON object per line: "gold" and'),
    ],
)
def test_bad_pair_rows_name_file_line_and_expectation(tmp_path, lines, message):
    path = write(tmp_path, *lines)
    with pytest.raises(RowsError, match=None) as error:
        load_pairs(path)
    assert f"{path}{message}" in str(error.value)
    assert error.value.exit_code == 1


def test_every_bad_triple_row_is_listed(tmp_path):
    path = write(
        tmp_path,
        '{"gold": "g", "right": "r"}',
        '{"gold": "g", "right": "r", "wrong": "w"}',
        '{"gold": "g", "right": "", "wrong": "w"}',
    )
    with pytest.raises(RowsError) as error:
        load_triples(path)
    text = str(error.value)
    assert f"{path}: 2 bad line(s), nothing loaded" in text
    assert f"{path}:1: missing key 'wrong' (a string)" in text
    assert f"{path}:3: key 'right': must not be empty" in text
