"""psyrl.rl.tgrpo: eq. 2 advantages, the k3 KL and eq. 1's clipped loss (SPEC §3)."""

import math
import statistics

import pytest
import torch

from psyrl.core.config import LossConfig
from psyrl.rl.tgrpo import (
    AGGS,
    advantages,
    aggregate,
    low_var_kl,
    rollout_correction,
    seq_mean_token_mean,
    tgrpo_loss,
)
from psyrl.rl.trajectory_cache import TrajectoryCache

NO_KL = LossConfig(kl_coef=0.0)


# ---------------------------------------------------------------- eq. 2: advantages


def grpo_reference(rewards: list[float], group_size: int, eps: float = 1e-6) -> list[float]:
    """Standard GRPO (verl's `grpo` estimator): per prompt group, (r - mean) / (unbiased std +
    eps)."""
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean, std = statistics.fmean(group), statistics.stdev(group)
        out += [(r - mean) / (std + eps) for r in group]
    return out


def test_group_scope_with_cache_size_one_is_standard_grpo():
    generator = torch.Generator().manual_seed(0)
    rewards = torch.rand(4 * 5, generator=generator, dtype=torch.float64)  # B = 4 prompts x G = 5
    rewards[5:10] = 0.7  # a zero-variance group: all advantages 0
    cache = TrajectoryCache(size=1)
    cache.push_answers(torch.zeros(20), torch.ones(20))
    cache.push_rewards(rewards)
    got = advantages(cache.rewards(), "group", group_size=5, eps=1e-6)
    assert got.tolist() == pytest.approx(grpo_reference(rewards.tolist(), 5), abs=1e-9)
    assert got[5:10].abs().max() < 1e-9


def test_group_scope_float32_is_bit_identical_to_verls_rule():
    # verl's grpo estimator works in float32, one prompt at a time: torch.mean, torch.std
    # (unbiased),
    # (score - mean) / (std + 1e-6). Same dtype in, the same bits out.
    rewards = torch.rand(512 * 5, generator=torch.Generator().manual_seed(1))  # float32
    expected = rewards.clone()
    for start in range(0, len(rewards), 5):
        group = rewards[start : start + 5]
        expected[start : start + 5] = (group - torch.mean(group)) / (torch.std(group) + 1e-6)
    got = advantages(rewards, "group", group_size=5, eps=1e-6)
    assert got.dtype == torch.float32 and torch.equal(got, expected)


def test_batch_scope_hand_values():
    # rewards 1, 0, 0.5, 0.5: mean 0.5; unbiased var = (0.25 + 0.25 + 0 + 0) / 3 = 1/6, std =
    # 0.4082483
    # A = +-0.5 / (0.4082483 + 1e-6) = +-1.2247419
    got = advantages(torch.tensor([1.0, 0.0, 0.5, 0.5], dtype=torch.float64), "batch", group_size=2)
    a = 0.5 / (math.sqrt(1 / 6) + 1e-6)
    assert got.tolist() == pytest.approx([a, -a, 0.0, 0.0], abs=1e-12)


def test_cache_scope_across_three_steps_with_c2():
    cache = TrajectoryCache(size=2)
    steps = [[5.0, 5.0], [1.0, 0.0], [0.5, 0.25]]
    for rewards in steps:
        cache.push_answers([0.0, 0.0], [1, 1])
        cache.push_rewards(rewards)
    # the pool is steps 2 and 3 (step 1 dropped out): [1, 0, 0.5, 0.25]
    pool = [1.0, 0.0, 0.5, 0.25]
    mean, std = statistics.fmean(pool), statistics.stdev(pool)  # 0.4375, 0.4269563
    got = advantages(
        torch.tensor(steps[-1], dtype=torch.float64), "cache", group_size=2, pool=cache.rewards()
    )
    assert got.tolist() == pytest.approx(
        [(0.5 - mean) / (std + 1e-6), (0.25 - mean) / (std + 1e-6)], abs=1e-12
    )


def test_without_std_the_advantage_is_the_centred_reward_in_every_scope():
    # advantage.std = false (Dr. GRPO): A = r - r-bar. Rewards 1, 0, 0.5, 0.5 in groups of 2:
    # group means 0.5 and 0.5, so A = 0.5, -0.5, 0, 0; the batch mean is 0.5 too; a cache pool of
    # 0, 0, 0, 1 (mean 0.25) gives 0.75, -0.25, 0.25, 0.25
    r = torch.tensor([1.0, 0.0, 0.5, 0.5], dtype=torch.float64)
    assert advantages(r, "group", 2, std=False).tolist() == [0.5, -0.5, 0.0, 0.0]
    assert advantages(r, "batch", 2, std=False).tolist() == [0.5, -0.5, 0.0, 0.0]
    pool = torch.tensor([0.0, 0.0, 0.0, 1.0], dtype=torch.float64)
    assert advantages(r, "cache", 2, pool, std=False).tolist() == [0.75, -0.25, 0.25, 0.25]
    # the default is eq. 2's division, unchanged
    assert torch.equal(advantages(r, "batch", 2), advantages(r, "batch", 2, std=True))
    assert advantages(r, "batch", 2)[0] == pytest.approx(0.5 / (math.sqrt(1 / 6) + 1e-6))


def test_integer_rewards_and_list_pools_are_accepted():
    # 1, 2, 3: mean 2, unbiased std 1 -> A = -1, 0, 1 (over 1 + 1e-6)
    expected = [-1 / (1 + 1e-6), 0.0, 1 / (1 + 1e-6)]
    assert advantages(torch.tensor([1, 2, 3]), "batch", 3).tolist() == pytest.approx(
        expected, abs=1e-12
    )
    # a list of floats becomes float32 (torch's default): float32 precision
    assert advantages([1.0, 2.0, 3.0], "cache", 3, pool=[1, 2, 3]).tolist() == pytest.approx(
        expected, abs=1e-6
    )


def test_pool_of_one_gives_zero_and_bad_inputs_raise():
    one = torch.tensor([0.3], dtype=torch.float64)
    assert advantages(one, "batch", group_size=1).tolist() == [0.0]
    assert advantages(one, "cache", group_size=1, pool=one).tolist() == [0.0]
    with pytest.raises(ValueError, match="G >= 2"):
        advantages(torch.ones(4), "group", group_size=1)
    with pytest.raises(ValueError, match="groups of 3"):
        advantages(torch.ones(4), "group", group_size=3)
    with pytest.raises(ValueError, match="needs the cache's rewards"):
        advantages(torch.ones(4), "cache", group_size=2)
    with pytest.raises(ValueError, match="unknown advantage scope"):
        advantages(torch.ones(4), "prompt", group_size=2)


# ---------------------------------------------------------------- KL


def test_low_var_kl_hand_values():
    # logp = log 0.5, logp_ref = log 0.25: d = log 0.5 = -0.6931472; exp(d) - d - 1 = 0.5 +
    # 0.6931472 - 1 = 0.1931472
    logp = torch.tensor([[math.log(0.5), -1.0, 0.0, -50.0]], dtype=torch.float64)
    ref = torch.tensor([[math.log(0.25), -1.0, -30.0, 0.0]], dtype=torch.float64)
    kl = low_var_kl(logp, ref)
    assert kl.dtype == torch.float32
    # equal log-probs -> 0; d = -30 clamped to -20: exp(-20) + 20 - 1 = 19 -> clamped to 10;
    # d = +50 clamped to 20: exp(20) - 21 = 4.85e8 -> clamped to 10
    assert kl.tolist()[0] == pytest.approx([0.5 + math.log(2) - 1, 0.0, 10.0, 10.0], abs=1e-6)


# ---------------------------------------------------------------- eq. 1: the loss


def test_loss_hand_values_clip_and_dual_clip():
    cfg = LossConfig(eps_low=0.2, eps_high=0.3, dual_clip=3.0, kl_coef=0.0)
    ratios = torch.tensor([[1.5, 0.5], [1.5, 5.0], [5.0, 0.5]])
    adv = torch.tensor([1.0, -1.0, 1.0])
    logp_old = torch.zeros(3, 2)
    mask = torch.ones(3, 2)
    loss, m = tgrpo_loss(ratios.log(), logp_old, adv, mask, 3, cfg)
    # seq 0 (A=+1): min(1.5, 1.3) = 1.3, min(0.5, 0.8) = 0.5 -> losses -1.3, -0.5, mean -0.9
    # seq 1 (A=-1): min(-1.5, -1.3) = -1.5 -> 1.5; min(-5, -1.3) = -5 -> 5, dual clip caps at 3 ->
    # mean 2.25
    # seq 2 (A=+1): min(5, 1.3) -> -1.3 (no dual clip for positive A); min(0.5, 0.8) -> -0.5 -> mean
    # -0.9
    assert loss.item() == pytest.approx((-0.9 + 2.25 - 0.9) / 3, abs=1e-6)
    # clipped tokens: A>0 & r>1.3: (0,0), (2,0) -> high 2/6; A<0 & r<0.8: none; dual: (1,1) -> 1/6
    assert m["clip_frac_high"].item() == pytest.approx(2 / 6)
    assert m["clip_frac_low"].item() == 0.0
    assert m["dual_clip_frac"].item() == pytest.approx(1 / 6)
    assert m["ratio_mean"].item() == pytest.approx((1.5 + 0.5 + 1.5 + 5 + 5 + 0.5) / 6, abs=1e-6)
    assert m["tokens"].item() == 6
    literal = LossConfig(eps_low=0.2, eps_high=0.2, dual_clip=0.0, kl_coef=0.0)  # eq. 1 as printed
    loss, m = tgrpo_loss(ratios.log(), logp_old, adv, mask, 3, literal)
    # seq 0: -1.2, -0.5; seq 1: 1.5, 5 (no cap); seq 2: -1.2, -0.5
    assert loss.item() == pytest.approx((-0.85 + 3.25 - 0.85) / 3, abs=1e-6)
    assert m["dual_clip_frac"].item() == 0.0


def test_ratio_one_gives_minus_mean_advantage_and_kl_term():
    logp = torch.randn(4, 6)
    adv = torch.tensor([0.5, -1.0, 2.0, 0.25])
    mask = torch.ones(4, 6)
    mask[0, 3:] = 0
    loss, m = tgrpo_loss(logp, logp, adv, mask, 4, NO_KL)
    assert loss.item() == pytest.approx(-adv.mean().item(), abs=1e-6)
    assert m["ppo_kl"].item() == 0.0 and m["ratio_mean"].item() == pytest.approx(1.0)
    assert m["sampled_neg_logp"].item() == pytest.approx(
        -(logp * mask).sum().item() / mask.sum().item(), abs=1e-5
    )
    # with beta: + beta * seq-mean-token-mean of low_var_kl
    ref = logp - 0.3
    loss_kl, _ = tgrpo_loss(logp, logp, adv, mask, 4, LossConfig(kl_coef=0.01), logp_ref=ref)
    kl = seq_mean_token_mean(low_var_kl(logp, ref), mask, 4)
    assert loss_kl.item() == pytest.approx(-adv.mean().item() + 0.01 * kl.item(), abs=1e-6)
    with pytest.raises(ValueError, match="logp_ref"):
        tgrpo_loss(logp, logp, adv, mask, 4, LossConfig(kl_coef=0.01))


def loss_reference(logp, logp_old, logp_ref, adv, mask, cfg):
    """The same objective token by token in plain Python floats: an independent implementation."""
    per_sequence = []
    for i in range(len(adv)):
        terms = []
        for t in range(len(mask[i])):
            if not mask[i][t]:
                continue
            ratio = math.exp(max(-20.0, min(20.0, logp[i][t] - logp_old[i][t])))
            clipped = max(1 - cfg.eps_low, min(1 + cfg.eps_high, ratio))
            pg = max(-adv[i] * ratio, -adv[i] * clipped)
            if cfg.dual_clip > 0 and adv[i] < 0:
                pg = min(pg, -cfg.dual_clip * adv[i])
            d = max(-20.0, min(20.0, logp_ref[i][t] - logp[i][t]))
            kl = max(-10.0, min(10.0, math.exp(d) - d - 1))
            terms.append(pg + cfg.kl_coef * kl)
        per_sequence.append(sum(terms) / max(1, len(terms)))
    return sum(per_sequence) / len(per_sequence)


def make_batch(n=6, t=7, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, t, 11, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 11, (n, t), generator=g)
    lengths = torch.randint(1, t + 1, (n,), generator=g)
    mask = (torch.arange(t)[None, :] < lengths[:, None]).double()  # [n, t] ragged responses
    logp_old = torch.log_softmax(
        logits + 0.3 * torch.randn(n, t, 11, generator=g, dtype=torch.float64), -1
    )
    logp_ref = torch.log_softmax(
        logits + 0.3 * torch.randn(n, t, 11, generator=g, dtype=torch.float64), -1
    )
    gather = lambda lp: lp.gather(-1, tokens[..., None]).squeeze(-1)
    adv = torch.randn(n, generator=g, dtype=torch.float64) * 2
    return logits, gather, gather(logp_old), gather(logp_ref), adv, mask


def test_loss_matches_a_token_by_token_reference():
    logits, gather, logp_old, logp_ref, adv, mask = make_batch()
    logp = gather(torch.log_softmax(logits, -1))
    for cfg in (LossConfig(), LossConfig(eps_low=0.1, eps_high=0.1, dual_clip=0.0, kl_coef=0.05)):
        loss, _ = tgrpo_loss(logp, logp_old, adv, mask, len(adv), cfg, logp_ref=logp_ref)
        expected = loss_reference(
            logp.tolist(), logp_old.tolist(), logp_ref.tolist(), adv.tolist(), mask.tolist(), cfg
        )
        assert loss.item() == pytest.approx(expected, abs=1e-6)


def grads(logits, gather, logp_old, logp_ref, adv, mask, chunks, agg=AGGS[0]):
    """Gradient w.r.t. the logits of the loss summed over `chunks` (micro-batches or ranks), each
    divided by the whole batch's normaliser for `agg` (responses, or response tokens)."""
    cfg = LossConfig(agg=agg)
    normalizer = mask.sum().item() if agg == "token-mean" else len(mask)
    params = logits.clone().requires_grad_(True)
    for rows in chunks:
        logp = gather(torch.log_softmax(params, -1))[rows]
        loss, _ = tgrpo_loss(
            logp, logp_old[rows], adv[rows], mask[rows], normalizer, cfg, logp_ref[rows], 4
        )
        loss.backward()  # gradient accumulation sums micro-batch gradients
    return params.grad


@pytest.mark.numerics
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("micro", [1, 2, 3])
def test_gradient_does_not_depend_on_micro_batch_size(micro, agg):
    batch = make_batch()
    n = len(batch[4])
    whole = grads(*batch, chunks=[slice(0, n)], agg=agg)
    split = grads(*batch, chunks=[slice(i, i + micro) for i in range(0, n, micro)], agg=agg)
    assert torch.allclose(whole, split, atol=1e-6, rtol=0)
    assert whole.abs().sum() > 0


@pytest.mark.numerics
@pytest.mark.parametrize("agg", AGGS)
def test_gradient_does_not_depend_on_world_size(agg):
    # Two "ranks" each hold 3 of 6 responses and divide by the global normaliser;
    # psyrl.runtime.distributed.shard sums their gradients, which equals the one-process gradient.
    batch = make_batch()
    whole = grads(*batch, chunks=[slice(0, 6)], agg=agg)
    rank0 = grads(*batch, chunks=[slice(0, 1), slice(1, 3)], agg=agg)
    rank1 = grads(*batch, chunks=[slice(3, 6)], agg=agg)
    assert torch.allclose(whole, rank0 + rank1, atol=1e-6, rtol=0)


def test_loss_aggregations_hand_values():
    # two responses: tokens 1, 2 (length 2) and 3, 4, 5, 6 (length 4), normaliser 2 responses or
    # 6 tokens, norm_tokens 8: seq-mean-token-mean (1.5 + 4.5) / 2 = 3; token-mean 21 / 6 = 3.5;
    # seq-mean-token-sum-norm (3 / 8 + 18 / 8) / 2 = 1.3125
    x = torch.tensor([[1.0, 2.0, 9.0, 9.0], [3.0, 4.0, 5.0, 6.0]])
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]])
    assert aggregate(x, mask, "seq-mean-token-mean", 2).item() == 3.0
    assert aggregate(x, mask, "token-mean", 6).item() == 3.5
    assert aggregate(x, mask, "seq-mean-token-sum-norm", 2, 8).item() == 1.3125
    # the default is eq. 1's function, the same bits
    assert torch.equal(aggregate(x, mask, AGGS[0], 2), seq_mean_token_mean(x, mask, 2))
    with pytest.raises(ValueError, match="unknown loss aggregation"):
        aggregate(x, mask, "seq-sum", 2)


def test_padding_with_minus_inf_log_probs_stays_out_of_the_loss():
    logp = torch.tensor([[-1.0, -0.5, float("-inf")]], requires_grad=True)
    mask = torch.tensor([[True, True, False]])
    ref = torch.tensor([[-1.2, -0.4, float("-inf")]])
    loss, m = tgrpo_loss(
        logp, logp.detach(), torch.tensor([1.0]), mask, 1, LossConfig(), logp_ref=ref
    )
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(logp.grad).all() and logp.grad[0, 2] == 0
    assert all(torch.isfinite(v) for v in m.values())


def test_pg_loss_metric_uses_the_loss_aggregation():
    logits, gather, logp_old, logp_ref, adv, mask = make_batch()
    loss, m = tgrpo_loss(
        gather(torch.log_softmax(logits, -1)), logp_old, adv, mask, len(adv), NO_KL
    )
    assert m["pg_loss"].item() == pytest.approx(loss.item(), abs=1e-6)
    assert m["sequences"].item() == len(adv) and m["tokens"].item() == mask.sum().item()


def test_dual_clip_engages_only_for_negative_advantages():
    ratio = torch.full((2, 1), 10.0)
    _, m = tgrpo_loss(
        ratio.log(), torch.zeros(2, 1), torch.tensor([1.0, 1.0]), torch.ones(2, 1), 2, NO_KL
    )
    assert m["dual_clip_frac"].item() == 0.0
    loss, m = tgrpo_loss(
        ratio.log(), torch.zeros(2, 1), torch.tensor([-1.0, -2.0]), torch.ones(2, 1), 2, NO_KL
    )
    assert m["dual_clip_frac"].item() == 1.0
    assert loss.item() == pytest.approx((3.0 * 1.0 + 3.0 * 2.0) / 2)  # capped at -c A = 3, 6


def test_rollout_correction_hand_values():
    # log pi_old - log pi_sampler per token: response 1: ln 2, ln 2 (product 4); response 2: ln 0.5,
    # 0 (product 0.5), its third token padding. cap 3: token-truncate min(e^d, 3): 2, 2 / 0.5, 1;
    # sequence-mask: 4 > 3 -> 0 for the whole first response; 0.5 for the second
    old = torch.tensor([[math.log(2), math.log(2), 0.0], [math.log(0.5), 0.0, 0.0]])
    sampler = torch.zeros(2, 3)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]]).bool()
    old[0, 2] = math.log(1.0)
    w = rollout_correction(old, sampler, mask, "token-truncate", 3.0)
    torch.testing.assert_close(w[:, :2], torch.tensor([[2.0, 2.0], [0.5, 1.0]]))
    w = rollout_correction(old, sampler, mask, "sequence-mask", 3.0)
    torch.testing.assert_close(w[:, :2], torch.tensor([[0.0, 0.0], [0.5, 0.5]]))
    # agreeing policies: exactly 1 in both modes
    for mode in ("token-truncate", "sequence-mask"):
        assert torch.equal(rollout_correction(old, old, mask, mode, 3.0), torch.ones(2, 3))


def test_rollout_correction_weights_the_policy_term_only():
    logp = torch.tensor([[-1.0, -2.0]])
    ref = torch.tensor([[-1.5, -1.0]])
    mask = torch.ones(1, 2, dtype=torch.bool)
    cfg = LossConfig(kl_coef=0.1)
    plain, m = tgrpo_loss(logp, logp, torch.tensor([1.0]), mask, 1, cfg, ref)
    half, _ = tgrpo_loss(
        logp, logp, torch.tensor([1.0]), mask, 1, cfg, ref, 1, torch.full((1, 2), 0.5)
    )
    # ratio 1: pg = -A per token, mean -1; KL term unchanged: 0.5 * pg + kl
    assert half.item() == pytest.approx(0.5 * m["pg_loss"].item() + 0.1 * m["kl"].item(), abs=1e-6)
    assert plain.item() == pytest.approx(m["pg_loss"].item() + 0.1 * m["kl"].item(), abs=1e-6)


def test_entropy_is_logged_and_its_bonus_subtracted_under_the_aggregation():
    # responses of 2 and 1 tokens with entropies (1, 3) and (2): seq-mean-token-mean of H is
    # (2 + 2) / 2 = 2; the loss with entropy_coef 0.1 is the plain loss - 0.2; the logged entropy
    # is the token mean (1 + 3 + 2) / 3 = 2
    logp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
    mask = torch.tensor([[1, 1], [1, 0]]).bool()
    entropy = torch.tensor([[1.0, 3.0], [2.0, 9.0]])
    adv = torch.tensor([1.0, -1.0])
    plain, m = tgrpo_loss(logp, logp, adv, mask, 2, NO_KL, entropy=entropy)
    bonus, _ = tgrpo_loss(
        logp, logp, adv, mask, 2, LossConfig(kl_coef=0.0, entropy_coef=0.1), entropy=entropy
    )
    assert bonus.item() == pytest.approx(plain.item() - 0.2, abs=1e-6)
    assert m["entropy"].item() == pytest.approx(2.0) and "entropy" in m
    with pytest.raises(ValueError, match="entropy_coef > 0 needs"):
        tgrpo_loss(logp, logp, adv, mask, 2, LossConfig(kl_coef=0.0, entropy_coef=0.1))
