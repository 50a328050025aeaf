"""psyrl.rl.trajectory_cache: the last C steps' records, statistics in two phases (§3.2, eq. 7; SPEC
§3)."""

import json

import pytest
import torch

from psyrl.rl.trajectory_cache import TrajectoryCache


def test_two_phases_include_the_current_step():
    cache = TrajectoryCache(size=4)
    cache.push_answers([1.0, 0.0], [10, 30])
    # phase 1: L-bar = (10 + 30) / 2 = 20, r-bar_F1 = (1 + 0) / 2 = 0.5
    assert cache.answer_stats() == (20.0, 0.5)
    cache.push_rewards([0.9, 0.1])
    assert cache.rewards().tolist() == [0.9, 0.1]
    cache.push_answers([0.5, 0.5], [20, 20])
    # phase 1 of step 2: L-bar = (10 + 30 + 20 + 20) / 4 = 20, r-bar_F1 = (1 + 0 + 0.5 + 0.5) / 4 =
    # 0.5
    assert cache.answer_stats() == (20.0, 0.5)
    cache.push_rewards([0.4, 0.6])
    # older steps keep their rewards; the pool is oldest first
    assert cache.rewards().tolist() == [0.9, 0.1, 0.4, 0.6]


def test_oldest_step_drops_out_with_c2_over_three_steps():
    cache = TrajectoryCache(size=2)
    steps = [
        ([1.0, 1.0], [10, 10], [1.0, 1.0]),
        ([0.0, 0.5], [20, 40], [0.0, 0.5]),
        ([0.25, 0.25], [30, 30], [0.2, 0.3]),
    ]
    for f1, lengths, rewards in steps:
        cache.push_answers(f1, lengths)
        cache.push_rewards(rewards)
    assert len(cache) == 2
    # step 1 is gone: L-bar = (20 + 40 + 30 + 30) / 4 = 30, r-bar_F1 = (0 + 0.5 + 0.25 + 0.25) / 4 =
    # 0.25
    assert cache.answer_stats() == (30.0, 0.25)
    assert cache.rewards().tolist() == [0.0, 0.5, 0.2, 0.3]


def test_steps_may_have_different_sizes():
    cache = TrajectoryCache(size=3)
    cache.push_answers([1.0], [4])
    cache.push_rewards([1.0])
    cache.push_answers([0.0, 0.0, 0.0], [8, 8, 8])
    # per-sample means, not per-step: L-bar = (4 + 24) / 4 = 7, r-bar_F1 = 1 / 4
    assert cache.answer_stats() == (7.0, 0.25)


def test_phase_order_is_enforced():
    cache = TrajectoryCache(size=2)
    with pytest.raises(RuntimeError, match="empty"):
        cache.answer_stats()
    with pytest.raises(RuntimeError, match="must follow push_answers"):
        cache.push_rewards([1.0])
    cache.push_answers([1.0], [3])
    with pytest.raises(RuntimeError, match="needs push_rewards"):
        cache.rewards()
    with pytest.raises(RuntimeError, match="push_rewards was not called"):
        cache.push_answers([1.0], [3])
    with pytest.raises(ValueError, match="2 final rewards for a step of 1"):
        cache.push_rewards([1.0, 2.0])
    cache.push_rewards([1.0])
    with pytest.raises(RuntimeError, match="once per step"):
        cache.push_rewards([1.0])
    with pytest.raises(ValueError, match="as many F1 values as lengths"):
        cache.push_answers([1.0, 0.0], [3])
    with pytest.raises(ValueError, match=">= 1"):
        TrajectoryCache(size=0)


def test_state_dict_round_trips_exactly_through_json():
    cache = TrajectoryCache(size=3)
    generator = torch.Generator().manual_seed(0)
    for _ in range(4):
        cache.push_answers(
            torch.rand(5, generator=generator, dtype=torch.float64),
            torch.randint(1, 99, (5,), generator=generator),
        )
        cache.push_rewards(torch.randn(5, generator=generator, dtype=torch.float64))
    cache.push_answers([0.1 + 0.2], [7])  # a step caught between its two phases
    state = json.loads(json.dumps(cache.state_dict()))
    resumed = TrajectoryCache(size=3)
    resumed.load_state_dict(state)
    assert resumed.answer_stats() == cache.answer_stats()
    for c in (cache, resumed):
        c.push_rewards([0.5])
    assert torch.equal(resumed.rewards(), cache.rewards())  # bitwise
    with pytest.raises(ValueError, match="cache size 3 differs from the configured 4"):
        TrajectoryCache(size=4).load_state_dict(state)
