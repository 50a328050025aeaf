"""The learning rate of an extended run (--extend, run.extend; `lr_factor`'s `extensions`): the
earlier plan up to the extension, no jump at it, then the rule's values, computed by hand."""

import math

import pytest

from psyrl.core.config import OptimConfig
from psyrl.runtime.optim import lr_factor

COSINE = OptimConfig(schedule="cosine", warmup_ratio=0.0)
CONSTANT = OptimConfig(schedule="constant", warmup_ratio=0.0)


def test_no_extension_is_the_plain_schedule():
    # warm-up int(0.25 x 8) = 2: 0, 1/2, then cosine over the 6 updates left
    cfg = OptimConfig(schedule="cosine", warmup_ratio=0.25)
    assert lr_factor(1, cfg, 8) == lr_factor(1, cfg, 8, ()) == 0.5
    assert lr_factor(5, cfg, 8) == pytest.approx(0.5 * (1 + math.cos(math.pi * 3 / 6)))


def test_a_finished_cosine_run_extended_decays_on_from_its_last_rate():
    # planned for 4 updates, 0.5 (1 + cos(pi k / 4)): 1, 0.85355, 0.5, 0.14645; extended after 4
    # to 8: 0.14645 x 0.5 (1 + cos(pi (k - 3) / 5)) for k = 4..7:
    # 0.14645 x (0.90451, 0.65451, 0.34549, 0.09549) = 0.13247, 0.09585, 0.05060, 0.01398
    extended = [lr_factor(k, COSINE, 8, [(4, 4)]) for k in range(8)]
    assert extended == pytest.approx(
        [1, 0.85355, 0.5, 0.14645, 0.13247, 0.09585, 0.05060, 0.01398], abs=1e-5
    )
    assert extended[:4] == [lr_factor(k, COSINE, 4) for k in range(4)]  # the past unchanged
    # no jump: the first update after the extension is below the last one before it, by one
    # step of the new decay (0.14645 - 0.13247), where the plain re-plan over 8 would jump to 0.5
    assert 0 < extended[3] - extended[4] < 0.015
    assert lr_factor(4, COSINE, 8) == pytest.approx(0.5)
    # which is the difference from a run planned for 8 from the start: from update 4 on
    planned = [lr_factor(k, COSINE, 8) for k in range(8)]
    assert planned[4:] == pytest.approx([0.5, 0.30866, 0.14645, 0.03806], abs=1e-5)


def test_extended_mid_run_and_twice_stays_continuous():
    for start, old, new in ((3, 10, 20), (7, 10, 11), (9, 10, 40)):
        f = [lr_factor(k, COSINE, new, [(start, old)]) for k in range(new)]
        assert f[:start] == [lr_factor(k, COSINE, old) for k in range(start)]
        steps = [a - b for a, b in zip(f, f[1:])]
        assert all(d >= 0 for d in steps)  # never rises after the warm-up
        # the step across the extension is no larger than one step of a cosine from f[start - 1]
        # over the remaining updates
        assert (
            steps[start - 1]
            <= f[start - 1] * (1 - 0.5 * (1 + math.cos(math.pi / (new - start + 1)))) + 1e-12
        )
    # a second extension continues from the first one's rate
    twice = [lr_factor(k, COSINE, 12, [(4, 4), (8, 8)]) for k in range(12)]
    once = [lr_factor(k, COSINE, 8, [(4, 4)]) for k in range(8)]
    assert twice[:8] == once and twice[8] < twice[7] and twice[7] - twice[8] < once[7]


def test_constant_extended_equals_planned_and_the_warm_up_keeps_its_length():
    assert [lr_factor(k, CONSTANT, 9, [(6, 6)]) for k in range(9)] == [1.0] * 9
    # warm-up int(0.5 x 4) = 2 as first planned: 0, 0.5, then 1; planned for 8 it would be 4 long
    warm = OptimConfig(schedule="constant", warmup_ratio=0.5)
    assert [lr_factor(k, warm, 8, [(1, 4)]) for k in range(5)] == [0.0, 0.5, 1.0, 1.0, 1.0]
    assert [lr_factor(k, warm, 8) for k in range(5)] == [0.0, 0.25, 0.5, 0.75, 1.0]
    # a cosine extended inside its warm-up: that warm-up, then the decay planned over the new total
    cos = OptimConfig(schedule="cosine", warmup_ratio=0.5)
    assert lr_factor(3, cos, 8, [(1, 4)]) == pytest.approx(0.5 * (1 + math.cos(math.pi / 6)))
