"""The policy update of a T-GRPO step (eq. 1, SPEC §3): the experience pass (gradient-free
log-probs of the reference and of the sampling-time policy), and one optimiser step per mini-batch
over micro-batches with the global divisor.

Micro-batches are `optim.micro_batch` sequences (the update) or `optim.logprob_micro_batch`
(log-probs) in order, or, with `optim.micro_batch_tokens`, grouped by a token budget: a rank's
sequences sorted by length and grouped while the micro-batch's tokens stay within the budget. With
`model.packing` (the default) a micro-batch is one padding-free row and its tokens are the
sequences' own; padded, they are rows x longest row. Under FSDP every rank must run as many forwards
as the others (each one all-gathers the shards): a rank with fewer micro-batches runs filler
forwards whose loss is multiplied by 0.
"""

from __future__ import annotations

from collections import defaultdict

import torch

from psyrl.core.config import Config
from psyrl.rl.rollout import RolloutBatch
from psyrl.rl.tgrpo import rollout_correction, tgrpo_loss
from psyrl.runtime.distributed import Dist, all_reduce
from psyrl.runtime.model import collate, pack
from psyrl.runtime.optim import clipped_step

TOKEN_METRICS = (
    "clip_frac_high",
    "clip_frac_low",
    "dual_clip_frac",
    "ratio_mean",
    "ppo_kl",
    "sampled_neg_logp",
    "entropy",
)
SEQUENCE_METRICS = ("pg_loss", "kl")


def micro_batches(
    lengths: list[int], size: int, budget: int, packed: bool = False
) -> list[list[int]]:
    """Indices of each micro-batch. budget 0: `size` sequences at a time, in order. budget > 0: the
    sequences by decreasing length, each micro-batch growing while its tokens stay <= budget: the
    sum of its lengths when `packed`, else (rows + 1) x its first (longest) row, the padded
    width; a sequence longer than the budget goes alone."""
    if budget <= 0:
        return [
            list(range(start, min(start + size, len(lengths))))
            for start in range(0, len(lengths), size)
        ]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if (
            batches
            and batch_tokens([lengths[j] for j in batches[-1]] + [lengths[i]], packed) <= budget
        ):
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def batch_tokens(lengths: list[int], packed: bool) -> int:
    """The tokens a micro-batch of these sequences runs: their sum packed, rows x longest padded."""
    return sum(lengths) if packed else len(lengths) * max(lengths)


def agreed_count(count: int, dist: Dist) -> int:
    """The largest micro-batch count of any rank: every rank runs that many forwards (fillers after
    its own)."""
    return (
        int(all_reduce(torch.tensor(float(count)), dist, "max").item()) if dist.sharded else count
    )


def model_inputs(batch: RolloutBatch, pad_id: int, device: torch.device, packed: bool):
    """The policy's keyword inputs for the batch's sequences, on `device`, and the response mask
    [b, T-1] its log-probs are laid out on: one padding-free `Packed` row, or right-padded
    input_ids and attention_mask [b, T] with the response mask as the positions to score."""
    if packed:
        row = pack(batch.token_ids, batch.prompt_lengths).to(device)
        return {"input_ids": row}, row.layout
    input_ids, attention_mask, mask = (
        t.to(device) for t in collate(batch.token_ids, batch.prompt_lengths, pad_id)
    )
    return {"input_ids": input_ids, "attention_mask": attention_mask, "positions": mask}, mask


def shortest(batch: RolloutBatch) -> list[int]:
    """The index of the batch's (first) shortest sequence: the cheapest filler forward."""
    return [min(range(len(batch)), key=lambda i: len(batch.token_ids[i]))]


def sequence_logprobs(
    model, batch: RolloutBatch, pad_id: int, cfg: Config, dist: Dist, amp
) -> list[torch.Tensor]:
    """Per sequence, the log-probs of its response tokens under `model` at rollout.temperature (no
    gradient), in the batch's order; optim.logprob_micro_batch sequences a forward, or micro-batches
    of optim.logprob_micro_batch_tokens (module doc)."""
    out: list = [None] * len(batch)
    batches = micro_batches(
        [len(ids) for ids in batch.token_ids],
        cfg.optim.logprob_micro_batch,
        cfg.optim.logprob_micro_batch_tokens,
        cfg.model.packing,
    )
    with torch.no_grad():
        for k in range(agreed_count(len(batches), dist)):
            chunk = batches[k] if k < len(batches) else []
            inputs, mask = model_inputs(
                batch.select(chunk or shortest(batch)), pad_id, dist.device, cfg.model.packing
            )
            with amp:
                logp = model(**inputs, temperature=cfg.rollout.temperature)  # [b, T-1]
            for i, row, m in zip(chunk, logp, mask):
                out[i] = row[m].cpu()
    return out


def as_padded(values: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence response values laid out on a collated batch's response mask [b, T-1]."""
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_scatter(
        mask, torch.cat(values).to(mask.device)
    )


def experience(
    policy,
    reference,
    rollout: RolloutBatch,
    updates: int,
    pad_id: int,
    cfg: Config,
    dist: Dist,
    amp,
) -> list[RolloutBatch]:
    """The experience pass (no gradient): the `updates` mini-batches of `rollout` (this rank's share
    of each, `RolloutBatch.split`), with pi_ref's log-probs of every sequence (eq. 1's KL term; no
    `reference` when loss.kl_coef = 0) and pi_old's on every mini-batch after the first: those are
    off-policy once the first update has moved the policy, so the sampling policy's log-probs are
    computed now. The first updates the policy that sampled: its logp_old is the update's own
    detached logp_theta (SPEC §3 skips the pass only for a single mini-batch; the first of several
    is as on-policy as that one)."""
    if reference is not None:
        rollout.logp_ref = sequence_logprobs(reference, rollout, pad_id, cfg, dist, amp)
    minibatches = rollout.split(updates)
    later = rollout.select(range(len(minibatches[0]), len(rollout)))
    old = sequence_logprobs(policy, later, pad_id, cfg, dist, amp)
    for u, minibatch in enumerate(minibatches[1:]):
        minibatch.logp_old = old[u * len(minibatch) : (u + 1) * len(minibatch)]
    return minibatches


def update(
    policy, optimizer, batch: RolloutBatch, pad_id: int, cfg: Config, dist: Dist, amp
) -> tuple[float, bool, dict]:
    """One optimiser step on this rank's share of a mini-batch (eq. 1), gradients accumulated over
    micro-batches and divided by the mini-batch's sequence count over all ranks (optim.global_batch
    x rollout.samples), or with loss.agg = "token-mean" its response tokens over all ranks
    (`seq-mean-token-sum-norm` also divides each response's token sum by loss.agg_norm_tokens).
    `fsdp.defer_grad_sync`: the gradient reduce-scatter runs at the last micro-batch only. Returns
    (grad norm, applied, sums): sums holds the loss metrics' token- and sequence-weighted sums
    (float64 tensors, read once per step by `reduce_sums`: .item() per micro-batch would sync a GPU
    each time)."""
    temperature = cfg.rollout.temperature
    normalizer = cfg.optim.global_batch * cfg.rollout.samples  # the mini-batch's sequences
    if cfg.loss.agg == "token-mean":  # the mini-batch's response tokens in the loss, all ranks
        kept = [not (cfg.loss.mask_truncated and t) for t in batch.truncated]
        tokens = sum(
            len(ids) - p for ids, p, k in zip(batch.token_ids, batch.prompt_lengths, kept) if k
        )
        # at least 1: a mini-batch whose responses were all cut trains on nothing, not on NaN
        normalizer = max(float(all_reduce(torch.tensor(float(tokens)), dist).item()), 1.0)
    norm_tokens = cfg.loss.agg_norm_tokens or cfg.rollout.max_new_tokens
    cap = cfg.loss.rollout_correction_cap
    sums = defaultdict(float)
    batches = micro_batches(
        [len(ids) for ids in batch.token_ids],
        cfg.optim.micro_batch,
        cfg.optim.micro_batch_tokens,
        cfg.model.packing,
    )
    count = agreed_count(len(batches), dist)
    for k in range(count):
        # a filler runs the rank's shortest sequence, weight 0
        weight = 1.0 if k < len(batches) else 0.0
        chunk = batch.select(batches[k] if weight else shortest(batch))
        if dist.sharded and cfg.fsdp.defer_grad_sync:
            policy.set_requires_gradient_sync(k == count - 1)
        inputs, mask = model_inputs(chunk, pad_id, dist.device, cfg.model.packing)
        with amp:  # the true entropy from the same chunked pass (logp's bits unchanged)
            logp, entropy = policy(**inputs, temperature=temperature, entropy=True)  # [b, T-1]
        logp_old = as_padded(chunk.logp_old, mask) if chunk.logp_old is not None else logp.detach()
        logp_ref = as_padded(chunk.logp_ref, mask) if cfg.loss.kl_coef > 0 else None
        adv = torch.tensor(chunk.advantages, dtype=torch.float32, device=dist.device)  # [b]
        sampler_logp = as_padded([torch.tensor(lp) for lp in chunk.sampler_logprobs], mask)
        loss_mask = mask
        if cfg.loss.mask_truncated:  # a truncated response's tokens leave the loss
            cut = torch.tensor(chunk.truncated, device=mask.device).unsqueeze(-1)  # [b, 1]
            loss_mask = mask & ~cut
        correction = None
        if cfg.loss.rollout_correction != "none":
            correction = rollout_correction(
                logp_old, sampler_logp, mask, cfg.loss.rollout_correction, cap
            )
        loss, metrics = tgrpo_loss(
            logp,
            logp_old,
            adv,
            loss_mask,
            normalizer,
            cfg.loss,
            logp_ref,
            norm_tokens,
            correction,
            entropy,
        )
        (loss * weight).backward()
        if not weight:
            continue
        tokens, sequences = metrics["tokens"].double(), metrics["sequences"].double()
        for key in TOKEN_METRICS:
            sums[key] += metrics[key].double() * tokens
        for key in SEQUENCE_METRICS:
            sums[key] += metrics[key].double() * sequences
        sums["tokens"] += tokens
        sums["all_tokens"] += mask.sum().double()  # mask_truncated's dropped tokens too
        sums["sequences"] += sequences
        lengths = [len(ids) for ids in chunk.token_ids]
        sums["input_tokens"] += sum(lengths)
        sums["padded_tokens"] += batch_tokens(lengths, packed=False)
        # the sampler/trainer gap
        sums["gap"] += ((sampler_logp - logp_old.float()).abs() * mask).sum().double()
        if correction is not None:  # the weights' mean and the share capped or dropped
            sums["correction"] += (correction * mask).sum().double()
            limited = (correction == cap) | (correction == 0)
            sums["correction_capped"] += (limited & mask).sum().double()
    if dist.sharded and cfg.fsdp.defer_grad_sync:
        policy.set_requires_gradient_sync(True)
    grad_norm, applied = clipped_step(policy, optimizer, cfg.optim.grad_clip)
    return grad_norm, applied, sums


def reduce_sums(sums: list[dict], dist: Dist) -> dict:
    """Loss metrics of a step's updates (each one's `sums`) over all ranks: token- and
    sequence-weighted means."""
    keys = sorted(sums[0])
    total = all_reduce(
        torch.stack(
            [sum(torch.as_tensor(s[k], dtype=torch.float64).cpu() for s in sums) for k in keys]
        ),
        dist,
    )
    s = dict(zip(keys, total.tolist()))
    out = {f"actor/{k}": s[k] / max(s["tokens"], 1) for k in TOKEN_METRICS}
    out.update({f"actor/{k}": s[k] / max(s["sequences"], 1) for k in SEQUENCE_METRICS})
    out["actor/clip_frac"] = out["actor/clip_frac_high"] + out["actor/clip_frac_low"]
    out["rollout/logprob_gap"] = s["gap"] / max(s["all_tokens"], 1)
    if "correction" in s:  # loss.rollout_correction: over every response token sampled
        out["rollout/correction_mean"] = s["correction"] / max(s["all_tokens"], 1)
        out["rollout/correction_capped"] = s["correction_capped"] / max(s["all_tokens"], 1)
    # of the update micro-batches right-padded: the share that is padding (packing skips it)
    out["actor/padding_fraction"] = 1 - s["input_tokens"] / max(s["padded_tokens"], 1)
    return out
