"""The T-GRPO objective (paper §3.2 eq. 1-2, SPEC §3): advantages, KL and the clipped loss.

Pure tensor functions. Shapes: N responses, T response positions; `mask` [N, T] marks the response
tokens the loss counts (end-of-turn token included when generated).
"""

from __future__ import annotations

import typing

import torch

from psyrl.core.config import AdvantageConfig, LossConfig

# one list each: the config's choices
SCOPES = typing.get_args(typing.get_type_hints(AdvantageConfig)["scope"])
AGGS = typing.get_args(typing.get_type_hints(LossConfig)["agg"])


def advantages(
    rewards: torch.Tensor,
    scope: str,
    group_size: int,
    pool: torch.Tensor | None = None,
    eps: float = AdvantageConfig.eps,
    std: bool = True,
) -> torch.Tensor:
    """Eq. 2: A_i = (r_i - r-bar) / (sigma_r + eps), one scalar per response ([N] -> [N]); with
    `std` false, Dr. GRPO's A_i = r_i - r-bar (advantage.std; verl's norm_adv_by_std_in_grpo).

    `scope` picks the pool of r-bar and sigma_r: `cache` (paper: every final reward in the
    trajectory cache, the current step's included, passed as `pool`), `batch` (this step's rewards),
    `group` (standard GRPO: the G responses of each prompt; rewards are laid out prompt by prompt).
    Unbiased std everywhere (verl's GRPO); a pool of fewer than 2 samples gives A = 0 (torch.std of
    one value is NaN).
    """
    rewards = _as_float(rewards)  # [N]
    if scope == "group":
        if group_size < 2:
            raise ValueError(
                "advantage scope 'group' needs G >= 2 samples per prompt (std of one sample is "
                "undefined)"
            )
        if rewards.numel() % group_size:
            raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
        groups = rewards.reshape(-1, group_size)  # [B, G]
        centred = groups - groups.mean(dim=1, keepdim=True)  # [B, G]
        scale = groups.std(dim=1, keepdim=True) + eps if std else 1.0  # [B, 1]
        return (centred / scale).reshape(-1)  # [N]
    if scope == "batch":
        pool = rewards
    elif scope == "cache":
        if pool is None:
            raise ValueError("advantage scope 'cache' needs the cache's rewards as `pool`")
        pool = _as_float(pool)
    else:
        raise ValueError(f"unknown advantage scope {scope!r}: expected one of {', '.join(SCOPES)}")
    if pool.numel() < 2:
        return torch.zeros_like(rewards)
    return (rewards - pool.mean()) / (pool.std() + eps if std else 1.0)  # [N]


def _as_float(x) -> torch.Tensor:
    x = torch.as_tensor(x)
    return x if x.is_floating_point() else x.double()


def low_var_kl(logp: torch.Tensor, logp_ref: torch.Tensor) -> torch.Tensor:
    """k3 estimator of KL(pi_theta || pi_ref) per token (eq. 1's D_KL; A.3 "low_var_kl"), float32: d
    = clamp(logp_ref - logp, +-20), kl = clamp(exp(d) - d - 1, +-10)."""
    d = (logp_ref.float() - logp.float()).clamp(-20.0, 20.0)  # [N, T]
    return (torch.exp(d) - d - 1.0).clamp(-10.0, 10.0)  # [N, T]


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over the positions where mask is set (0 when there are none)."""
    mask = mask.bool()
    # where, not x*mask: -inf pads stay out
    return torch.where(mask, x, 0.0).sum() / mask.sum().clamp(min=1)


def aggregate(
    x: torch.Tensor, mask: torch.Tensor, mode: str, normalizer: float, norm_tokens: int = 1
) -> torch.Tensor:
    """The loss of per-token values x [N, T] under `loss.agg` (verl's loss_agg_mode names):
    `seq-mean-token-mean` (eq. 1): each response's token mean, summed, over `normalizer` responses;
    `token-mean` (DAPO): every token's value summed over `normalizer`, the mini-batch's response
    tokens on all ranks; `seq-mean-token-sum-norm` (Dr. GRPO): each response's token sum over the
    constant `norm_tokens`, summed, over `normalizer` responses. `normalizer` is fixed before the
    micro-batch loop, so micro-batches and ranks sum to the whole mini-batch's loss."""
    if mode == "seq-mean-token-mean":
        return seq_mean_token_mean(x, mask, normalizer)
    summed = torch.where(mask.bool(), x, 0.0)  # [N, T]
    if mode == "token-mean":
        return summed.sum() / normalizer
    if mode == "seq-mean-token-sum-norm":
        return (summed.sum(dim=-1) / norm_tokens).sum() / normalizer
    raise ValueError(f"unknown loss aggregation {mode!r}: expected one of {', '.join(AGGS)}")


def seq_mean_token_mean(x: torch.Tensor, mask: torch.Tensor, normalizer: float) -> torch.Tensor:
    """Eq. 1's aggregation: (1/|o_i|) sum over each response's tokens, summed over responses and
    divided by `normalizer`, the response count of the whole mini-batch on all ranks (SPEC §3),
    fixed before the micro-batch loop: micro-batch gradients accumulate and
    `psyrl.runtime.distributed.shard` sums gradients over ranks, so the gradient is that of the mean
    over all responses whatever the split."""
    mask = mask.bool()
    per_sequence = torch.where(mask, x, 0.0).sum(dim=-1) / mask.sum(dim=-1).clamp(min=1)  # [N]
    return per_sequence.sum() / normalizer


def rollout_correction(
    logp_old: torch.Tensor, logp_sampler: torch.Tensor, mask: torch.Tensor, mode: str, cap: float
) -> torch.Tensor:
    """Importance weights [N, T] for the sampler-trainer mismatch (loss.rollout_correction), TRL's
    definitions (trl/trainer/grpo_trainer.py:2578-2623 at f2cd577): d_t = log pi_old - log
    pi_sampler on the response tokens; `token-truncate` (TIS): w_t = min(exp(d_t), cap);
    `sequence-mask` (MIS): rho = exp(sum_t d_t) for every token of the response, 0 where rho > cap.
    Exactly 1 where the sampler and the trainer agree. No gradient flows through them."""
    mask = mask.bool()
    d = torch.where(mask, logp_old.detach().float() - logp_sampler.float(), 0.0)  # [N, T]
    if mode == "token-truncate":
        return torch.exp(d).clamp(max=cap)
    if mode == "sequence-mask":
        rho = torch.exp(d.sum(dim=-1, keepdim=True))  # [N, 1], the product of the token ratios
        return torch.where(rho <= cap, rho, 0.0).expand_as(d)
    raise ValueError(f"unknown rollout correction {mode!r}: expected token-truncate, sequence-mask")


def tgrpo_loss(
    logp: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    normalizer: float,
    cfg: LossConfig,
    logp_ref: torch.Tensor | None = None,
    norm_tokens: int = 1,
    correction: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Eq. 1 as a loss to minimise: -min(r A, clip(r, 1-eps_low, 1+eps_high) A), with the dual clip
    for A < 0 (loss capped at -c A), plus beta * low_var_kl, aggregated by `loss.agg` (`aggregate`:
    eq. 1's sequence-mean-token-mean by default; `normalizer`, `norm_tokens` are its divisors).
    `correction` [N, T] (`rollout_correction`) multiplies the clipped policy-gradient term only, as
    TRL applies it (after the clip, before the KL term). `entropy` [N, T]: the policy's true
    next-token entropy, logged, and with loss.entropy_coef > 0 subtracted as a bonus under the same
    aggregation (verl's entropy_coeff, verl/workers/utils/losses.py:123-128).

    logp, logp_old, logp_ref: [N, T] token log-probs (current, sampling-time, reference policy);
    advantages: [N]; mask: [N, T] (bool or 0/1). Detached metrics of this call: `pg_loss` and `kl`
    are means over responses of their token means (the loss's aggregation), weight `sequences`; the
    rest are means over response tokens, weight `tokens`. clip_frac_high + clip_frac_low is verl's
    `pg_clipfrac`; dual_clip_frac is verl's `pg_clipfrac_lower`.
    """
    if logp_ref is None and cfg.kl_coef > 0:
        raise ValueError("kl_coef > 0 needs the reference log-probs `logp_ref`")
    logp = logp.float()
    mask = mask.bool()  # [N, T]
    log_ratio = (logp - logp_old.float()).clamp(-20.0, 20.0)  # [N, T]
    ratio = torch.exp(log_ratio)  # [N, T], r_t of eq. 2
    adv = advantages.float().unsqueeze(-1)  # [N, 1], broadcast over tokens
    clipped_ratio = ratio.clamp(1.0 - cfg.eps_low, 1.0 + cfg.eps_high)  # [N, T]
    pg = -torch.minimum(ratio * adv, clipped_ratio * adv)  # [N, T]
    dual = torch.zeros_like(pg, dtype=torch.bool)
    # cap -A * r at -c * A when A < 0 (a stale ratio must not explode the loss)
    if cfg.dual_clip > 0:
        cap = -cfg.dual_clip * adv  # [N, 1]
        dual = (adv < 0) & (pg > cap)  # [N, T]
        pg = torch.where(dual, cap, pg)
    if correction is not None:
        pg = pg * correction
    kl = low_var_kl(logp, logp_ref) if logp_ref is not None else torch.zeros_like(pg)  # [N, T]
    loss = aggregate(pg + cfg.kl_coef * kl, mask, cfg.agg, normalizer, norm_tokens)
    if cfg.entropy_coef > 0:
        if entropy is None:
            raise ValueError("loss.entropy_coef > 0 needs the policy's entropy `entropy`")
        loss = loss - cfg.entropy_coef * aggregate(entropy, mask, cfg.agg, normalizer, norm_tokens)

    with torch.no_grad():
        metrics = {
            "pg_loss": seq_mean_token_mean(pg, mask, len(mask)),
            "kl": seq_mean_token_mean(kl, mask, len(mask)),
            # A > 0 clipped at the upper bound, A < 0 at the lower one
            "clip_frac_high": masked_mean(((adv > 0) & (ratio > 1.0 + cfg.eps_high)).float(), mask),
            "clip_frac_low": masked_mean(((adv < 0) & (ratio < 1.0 - cfg.eps_low)).float(), mask),
            "dual_clip_frac": masked_mean(dual.float(), mask),
            "ratio_mean": masked_mean(ratio, mask),
            "ppo_kl": masked_mean(-log_ratio, mask),  # mean of logp_old - logp
            # -log pi of the sampled tokens: an estimate of the entropy, not the entropy
            "sampled_neg_logp": masked_mean(-logp, mask),
            **({"entropy": masked_mean(entropy.detach(), mask)} if entropy is not None else {}),
            "tokens": mask.sum(),
            "sequences": torch.tensor(len(mask)),
        }
    return loss, metrics
