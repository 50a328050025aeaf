"""The policy update of a T-GRPO step (eq. 1, SPEC §3): gradient-free log-probs of the reference and the
sampling-time policy, and one optimiser step per mini-batch over micro-batches with the global divisor.

Micro-batches are `optim.micro_batch` sequences (the update) or `optim.logprob_micro_batch` (log-probs) in
order, or, with `optim.micro_batch_tokens`, packed by a token budget: a rank's sequences sorted by length and
grouped while rows x longest row stays within the budget, so a batch of short responses is not padded to the
longest one. Under FSDP every rank must run as many forwards as the others (each one all-gathers the shards):
a rank with fewer micro-batches runs filler forwards whose loss is multiplied by 0.
"""

from __future__ import annotations

import torch

from psyrl.rl.tgrpo import tgrpo_loss
from psyrl.runtime.distributed import Dist, all_reduce
from psyrl.runtime.optim import clipped_step
from psyrl.train.sft import SFTExample, collate

TOKEN_METRICS = ("clip_frac_high", "clip_frac_low", "dual_clip_frac", "ratio_mean", "ppo_kl", "entropy")
SEQUENCE_METRICS = ("pg_loss", "kl")


def micro_batches(lengths: list[int], size: int, budget: int) -> list[list[int]]:
    """Indices of each micro-batch. budget 0: `size` sequences at a time, in order. budget > 0: the sequences by
    decreasing length, each micro-batch growing while (rows + 1) x its first (longest) row <= budget; a sequence
    longer than the budget goes alone."""
    if budget <= 0:
        return [list(range(start, min(start + size, len(lengths)))) for start in range(0, len(lengths), size)]
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= budget:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


def agreed_count(count: int, dist: Dist) -> int:
    """The largest micro-batch count of any rank: every rank runs that many forwards (fillers after its own)."""
    return int(all_reduce(torch.tensor(float(count)), dist, "max").item()) if dist.sharded else count


def sequence_logprobs(model, sequences: list[SFTExample], size: int, pad_id: int, temperature: float, dist: Dist,
                      amp, budget: int = 0) -> list[torch.Tensor]:
    """Per sequence, the log-probs of its response tokens under `model` (no gradient), in the order given; `size`
    sequences a forward, or micro-batches of a token budget (module doc)."""
    out: list = [None] * len(sequences)
    batches = micro_batches([len(s.input_ids) for s in sequences], size, budget)
    with torch.no_grad():
        for k in range(agreed_count(len(batches), dist)):
            chunk = batches[k] if k < len(batches) else []
            rows = [sequences[i] for i in chunk] or [min(sequences, key=lambda s: len(s.input_ids))]  # a filler
            input_ids, attention_mask, mask = (t.to(dist.device) for t in collate(rows, pad_id))
            with amp:
                logp = model(input_ids, attention_mask, temperature, mask)  # [b, T-1]
            for i, row, m in zip(chunk, logp, mask):
                out[i] = row[m].cpu()
    return out


def as_padded(values: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence response values laid out on a collated batch's response mask [b, T-1]."""
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_scatter(
        mask, torch.cat(values).to(mask.device))


def update(policy, optimizer, batch: list[dict], normalizer: int, pad_id: int, cfg, dist: Dist, amp, sums: dict):
    """One optimiser step on this rank's share of a mini-batch (eq. 1), gradients accumulated over micro-batches;
    adds the loss metrics to `sums` (a defaultdict(float); its values become tensors). A sequence without
    "logp_old" (the first mini-batch of a rollout: the policy has not moved since sampling) takes the update's own
    detached logp_theta (ratio 1, SPEC §3). `fsdp.defer_grad_sync`: the gradient reduce-scatter runs at the last
    micro-batch only. Returns (grad norm, applied)."""
    T = cfg.rollout.temperature
    batches = micro_batches([len(s["sequence"].input_ids) for s in batch], cfg.optim.micro_batch,
                            cfg.optim.micro_batch_tokens)
    count = agreed_count(len(batches), dist)
    for k in range(count):
        weight = 1.0 if k < len(batches) else 0.0  # a filler runs the rank's shortest sequence, weight 0
        chunk = [batch[i] for i in batches[k]] if weight else [min(batch, key=lambda s: len(s["sequence"].input_ids))]
        if dist.sharded and cfg.fsdp.defer_grad_sync:
            policy.set_requires_gradient_sync(k == count - 1)
        input_ids, attention_mask, mask = (t.to(dist.device) for t in collate([s["sequence"] for s in chunk], pad_id))
        with amp:
            logp = policy(input_ids, attention_mask, T, mask)  # [b, T-1]
        logp_old = as_padded([s["logp_old"] for s in chunk], mask) if "logp_old" in chunk[0] else logp.detach()
        logp_ref = as_padded([s["logp_ref"] for s in chunk], mask) if cfg.loss.kl_coef > 0 else None
        adv = torch.tensor([s["advantage"] for s in chunk], dtype=torch.float32, device=dist.device)
        loss, metrics = tgrpo_loss(logp, logp_old, adv, mask, normalizer, cfg.loss, logp_ref)
        (loss * weight).backward()
        if not weight:
            continue
        # tensors, read once per step in reduce_sums: .item() per micro-batch would sync a GPU each time
        tokens, sequences = metrics["tokens"].double(), metrics["sequences"].double()
        for key in TOKEN_METRICS:
            sums[key] += metrics[key].double() * tokens
        for key in SEQUENCE_METRICS:
            sums[key] += metrics[key].double() * sequences
        sums["tokens"] += tokens
        sums["sequences"] += sequences
        sampler_logp = as_padded([torch.tensor(s["sampler_logprobs"]) for s in chunk], mask)
        sums["gap"] += ((sampler_logp - logp_old.float()).abs() * mask).sum().double()  # the sampler/trainer gap
    if dist.sharded and cfg.fsdp.defer_grad_sync:
        policy.set_requires_gradient_sync(True)
    return clipped_step(policy, optimizer, cfg.optim.grad_clip)


def reduce_sums(sums: dict, dist: Dist) -> dict:
    """Loss metrics over all ranks: token-weighted and sequence-weighted means."""
    keys = sorted(sums)
    total = all_reduce(torch.stack([torch.as_tensor(sums[k], dtype=torch.float64).cpu() for k in keys]), dist)
    s = dict(zip(keys, total.tolist()))
    out = {f"actor/{k}": s[k] / max(s["tokens"], 1) for k in TOKEN_METRICS}
    out.update({f"actor/{k}": s[k] / max(s["sequences"], 1) for k in SEQUENCE_METRICS})
    out["actor/clip_frac"] = out["actor/clip_frac_high"] + out["actor/clip_frac_low"]
    out["rollout/logprob_gap"] = s["gap"] / max(s["tokens"], 1)
    return out
