"""A judge that fails is loud: the run's first fallback printed with its error, the fallback rate in
the console line, the run stopped past judge.max_fallback_rate (an unreachable judge used to train
a whole T-GRPO run on F1 with exit status 0 and no message), and `on_failure = "mask"` leaving an
unscored response out of the loss and out of the means eq. 2 and eq. 7 take, instead of comparing
an F1 stand-in with judge scores. Also the config checks beside it: judge.step_timeout_s against
fsdp.timeout_minutes, and a `mix` without its signals named where it was asked for."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from test_train_tgrpo import run_in_process

from psyrl.core.config import Config, JudgeConfig, RewardConfig, load_config
from psyrl.core.runlog import read_metrics
from psyrl.core.tomlconf import ConfigError
from psyrl.rl.fallbacks import masked_advantages
from psyrl.rl.tgrpo import advantages
from psyrl.rl.trajectory_cache import TrajectoryCache
from psyrl.runtime.distributed import Dist
from psyrl.signals.build import Accuracy
from psyrl.signals.judge import JudgeError

NOWHERE = "http://127.0.0.1:9/v1"  # port 9 (discard): the connection is refused at once
EPS = 1e-6


# --------------------------------------------------------------------------------- mask: the math
@pytest.mark.numerics
def test_masked_responses_get_no_advantage_and_leave_the_group_pool():
    rewards = torch.tensor([1.0, 0.0, 0.5, 0.2, 0.3, 0.3, 0.9, 0.1], dtype=torch.float64)
    keep = torch.tensor([True, True, False, True, False, False, False, True])
    adv = masked_advantages(rewards, keep, "group", 4, eps=EPS)
    # group 1 pools 1, 0, 0.2: mean 0.4, unbiased std sqrt((0.36 + 0.16 + 0.04) / 2) = sqrt(0.28)
    std = math.sqrt(0.28)
    expected = [0.6 / (std + EPS), -0.4 / (std + EPS), 0.0, -0.2 / (std + EPS)]
    torch.testing.assert_close(
        adv[:4], torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0
    )
    assert adv[4:].tolist() == [0.0] * 4  # group 2 keeps one response: no spread, no advantage
    # the batch pools the same three, and 0.1: mean 0.325
    batch = masked_advantages(rewards, keep, "batch", 4, eps=EPS)
    kept = rewards[keep]
    torch.testing.assert_close(
        batch[keep], (kept - kept.mean()) / (kept.std() + EPS), rtol=1e-12, atol=0
    )
    assert batch[~keep].tolist() == [0.0] * 4
    # the cache scope takes the pool it is given (the cache already left the masked out)
    pool = torch.tensor([0.0, 1.0], dtype=torch.float64)
    cache = masked_advantages(rewards, keep, "cache", 4, pool, EPS)
    assert cache[~keep].tolist() == [0.0] * 4
    torch.testing.assert_close(
        cache[keep], (kept - 0.5) / (math.sqrt(0.5) + EPS), rtol=1e-12, atol=0
    )
    # every response kept: eq. 2 itself, in every scope
    # (group: a mean over 4 float64 values summed in another order than the reshaped pool's;
    # a few ulps each way, so 1e-12 relative, where a wrong pool moves it by 0.1 or more)
    everyone = torch.ones(8, dtype=torch.bool)
    for scope in ("group", "batch", "cache"):
        torch.testing.assert_close(
            masked_advantages(rewards, everyone, scope, 4, pool, EPS),
            advantages(rewards, scope, 4, pool, EPS),
            rtol=1e-12,
            atol=0,
        )


def test_the_cache_leaves_masked_responses_out_of_its_means_and_reads_them_back():
    cache = TrajectoryCache(2)
    cache.push_answers([1.0, 0.0], [10, 20])
    cache.push_rewards([0.5, 0.1])
    cache.push_answers([0.4, 0.9], [30, 40], keep=torch.tensor([True, False]))
    # L-bar counts every length (10+20+30+40)/4 = 25; r-bar_F1 the kept F1s (1+0+0.4)/3
    assert cache.answer_stats() == (25.0, (1.0 + 0.0 + 0.4) / 3)
    cache.push_rewards([0.7, 0.8])
    assert cache.rewards().tolist() == [0.5, 0.1, 0.7]  # 0.8 is not in eq. 2's pool
    again = TrajectoryCache(2)
    again.load_state_dict(cache.state_dict())
    assert (
        again.rewards().tolist() == [0.5, 0.1, 0.7] and again.answer_stats() == cache.answer_stats()
    )
    assert "keep" not in cache.state_dict()["steps"][0]  # a step without a mask is stored as before


# ----------------------------------------------------------------------- the watch: print and stop
def judged(**judge) -> Accuracy:
    cfg = Config(
        reward=RewardConfig(accuracy="judge"),
        judge=JudgeConfig(base_url=NOWHERE, model="x", **judge),
    )
    return Accuracy(cfg)


def step_of(failed: int, total: int = 8) -> list:
    return [SimpleNamespace(extra={"judge_fallback": float(i < failed)}) for i in range(total)]


def test_the_first_fallback_is_printed_once_with_its_error(capsys):
    accuracy = judged(max_fallback_rate=1.0)
    accuracy.watch(step_of(0), 1, Dist())
    assert capsys.readouterr().out == ""
    accuracy.built["judge"].first_error = f"{NOWHERE}/chat/completions: no connection (refused)"
    accuracy.watch(step_of(3), 2, Dist())
    out = capsys.readouterr().out
    assert "step 2: the judge did not score 3 of 8 responses" in out
    assert "judge.on_failure = 'mask': left out of the loss" in out
    assert f"first error: {NOWHERE}/chat/completions: no connection (refused)" in out
    accuracy.watch(step_of(8), 3, Dist())
    assert capsys.readouterr().out == ""  # once a run


def test_past_the_rate_over_the_window_the_run_stops_with_the_error():
    accuracy = judged(max_fallback_rate=0.5, fallback_window=2)
    accuracy.built["judge"].latest_error = "http://x/chat/completions: HTTP 500: overloaded"
    accuracy.watch(step_of(4), 1, Dist())  # 4 of 8: not past 0.5
    accuracy.watch(step_of(2), 2, Dist())  # 6 of 16
    with pytest.raises(JudgeError) as raised:
        accuracy.watch(step_of(7), 3, Dist())  # the window: steps 2-3, 9 of 16 > 0.5
    message = str(raised.value)
    assert "step 3: the judge did not score 9 of 16 responses over the last 2 step(s)" in message
    assert (
        "judge.max_fallback_rate = 0.5; last error: http://x/chat/completions: HTTP 500" in message
    )


def test_mask_applies_only_where_the_judge_is_in_the_reward():
    samples = step_of(2, 4)
    assert judged().kept(samples).tolist() == [False, False, True, True]
    assert judged().kept(step_of(0, 4)) is None  # nothing masked: the paper's path
    assert judged(on_failure="f1").kept(samples) is None
    logged = Config(
        reward=RewardConfig(log_accuracy=["judge"]), judge=JudgeConfig(base_url=NOWHERE, model="x")
    )
    assert Accuracy(logged).kept(samples) is None  # the judge is only logged: the reward is F1


# ----------------------------------------------------------------------------- end to end: T-GRPO
JUDGE = [
    "reward.accuracy=judge",
    f'judge.base_url="{NOWHERE}"',
    'judge.model="x"',
    "judge.retries=0",
    "judge.timeout_s=5",
]


@pytest.mark.slow
def test_an_unreachable_judge_stops_the_run_with_its_error(start, tmp_path):
    result = run_in_process(start, tmp_path, *JUDGE)
    assert result.exit_code != 0, result.output
    out = result.output
    assert "step 1: the judge did not score 32 of 32 responses" in out
    assert f"first error: {NOWHERE}/chat/completions: no connection" in out
    assert "more than judge.max_fallback_rate = 0.5" in out


@pytest.mark.slow
def test_under_mask_an_unscored_step_trains_on_nothing_and_its_rate_is_shown(start, tmp_path):
    result = run_in_process(start, tmp_path, *JUDGE, "judge.max_fallback_rate=1", "log.every=1")
    assert result.exit_code == 0, result.output
    assert result.output.count("the judge did not score") == 1
    assert "judge fallbacks 1.00" in result.output
    for row in read_metrics(tmp_path / "rl" / "metrics.jsonl"):
        assert row["reward/judge_fallbacks"] == 32 and row["reward/judge_fallback_rate"] == 1.0
        assert row["rollout/advantage_abs_mean"] == 0.0  # every response masked


# ------------------------------------------------------------------------------------------ config
def test_a_step_judging_past_the_collective_timeout_is_a_config_error(tmp_path):
    sets = ["reward.accuracy=judge", "judge.step_timeout_s=3600", "fsdp.timeout_minutes=60"]
    with pytest.raises(
        ConfigError,
        match=r"judge.step_timeout_s = 3600 s must be less than fsdp.timeout_minutes = 60 "
        r"\(3600 s\)",
    ):
        load_config(None, sets)
    assert load_config(None, [*sets[:2], "fsdp.timeout_minutes=61"]).judge.step_timeout_s == 3600
    assert load_config(None, sets[1:]).judge.step_timeout_s == 3600  # no judge: no collective on it


def test_a_mix_without_its_signals_names_the_override_not_the_file(tmp_path):
    preset = tmp_path / "preset.toml"
    preset.write_text('[run]\nname = "x"\n')
    with pytest.raises(ConfigError) as raised:
        load_config(preset, ['reward.accuracy="mix"'])
    message = str(raised.value)
    assert message.startswith('--set reward.accuracy="mix": [reward] accuracy: ')
    assert "needs reward.mix" in message and str(preset) not in message
    with pytest.raises(
        ConfigError, match=r"--set reward.accuracy=mix: \[reward\] accuracy: .*mix_weights"
    ):
        load_config(preset, ["reward.accuracy=mix", 'reward.mix=["f1"]'])
