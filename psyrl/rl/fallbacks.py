"""judge.on_failure = "mask": what a step does with the responses its LLM judge did not score.
Beyond the paper (which has no judge): such a response gets advantage 0 and stays out of the pools
eq. 2 takes its mean and std over, so a judge's score is never compared with an F1 standing in for
one. The trajectory cache leaves them out of r-bar_F1 and of its reward pool itself
(`TrajectoryCache.push_answers`'s `keep`)."""

from __future__ import annotations

import torch

from psyrl.core.config import AdvantageConfig
from psyrl.rl.tgrpo import advantages


def masked_advantages(
    rewards: torch.Tensor,
    keep: torch.Tensor,
    scope: str,
    group_size: int,
    pool: torch.Tensor | None = None,
    eps: float = AdvantageConfig.eps,
    std: bool = True,
) -> torch.Tensor:
    """Eq. 2 over the kept responses only ([N], keep [N] bool -> [N], 0 where keep is False): a
    group's or the batch's kept rewards are the pool, as a batch of their own; the cache's `pool`
    already holds only kept rewards. Rewards (1, 0, 0.5, 0.2) of one group, keep (T, T, F, T):
    eq. 2 over (1, 0, 0.2), and A = 0 for the third."""
    rewards = torch.as_tensor(rewards, dtype=torch.float64)  # [N]
    keep = torch.as_tensor(keep, dtype=torch.bool)  # [N]
    adv = torch.zeros_like(rewards)  # [N]
    if scope == "group":
        advantages(rewards, scope, group_size)  # the group checks: G >= 2, N a multiple of G
        for start in range(0, rewards.numel(), group_size):
            index = torch.arange(start, start + group_size)[keep[start : start + group_size]]
            adv[index] = advantages(rewards[index], "batch", group_size, None, eps, std)
        return adv
    pool = rewards[keep] if scope == "batch" else pool
    adv[keep] = advantages(rewards[keep], scope, group_size, pool, eps, std)
    return adv
