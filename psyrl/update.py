"""The policy update of a T-GRPO step (eq. 1, SPEC §3): gradient-free log-probs of the reference and the
sampling-time policy, and one optimiser step per mini-batch over micro-batches with the global divisor."""

from __future__ import annotations

import torch

from psyrl.distributed import Dist, all_reduce
from psyrl.optim import clipped_step
from psyrl.sft import SFTExample, collate
from psyrl.tgrpo import tgrpo_loss

TOKEN_METRICS = ("clip_frac_high", "clip_frac_low", "dual_clip_frac", "ratio_mean", "ppo_kl", "entropy")
SEQUENCE_METRICS = ("pg_loss", "kl")


def sequence_logprobs(model, sequences: list[SFTExample], size: int, pad_id: int, temperature: float, ctx: Dist,
                      amp) -> list[torch.Tensor]:
    """Per sequence, the log-probs of its response tokens under `model` (no gradient), `size` sequences a forward."""
    out = []
    with torch.no_grad():
        for start in range(0, len(sequences), size):
            chunk = sequences[start:start + size]
            input_ids, attention_mask, mask = (t.to(ctx.device) for t in collate(chunk, pad_id))
            with amp:
                logp = model(input_ids, attention_mask, temperature, mask)  # [b, T-1]
            out += [row[m].cpu() for row, m in zip(logp, mask)]
    return out


def as_padded(values: list[torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """Per-sequence response values laid out on a collated batch's response mask [b, T-1]."""
    return torch.zeros(mask.shape, dtype=torch.float32, device=mask.device).masked_scatter(
        mask, torch.cat(values).to(mask.device))


def update(policy, optimizer, batch: list[dict], normalizer: int, old: bool, pad_id: int, cfg, ctx: Dist, amp,
           sums: dict):
    """One optimiser step on this rank's share of a mini-batch (eq. 1), gradients accumulated over micro-batches;
    adds the loss metrics to `sums` (a defaultdict(float); its values become tensors). Without `old` (one update
    per rollout), logp_old is the update's own detached logp_theta (ratio 1, SPEC §3). Returns (grad norm, applied)."""
    size, T = cfg.optim.micro_batch, cfg.rollout.temperature
    for start in range(0, len(batch), size):
        chunk = batch[start:start + size]
        input_ids, attention_mask, mask = (t.to(ctx.device) for t in collate([s["sequence"] for s in chunk], pad_id))
        with amp:
            logp = policy(input_ids, attention_mask, T, mask)  # [b, T-1]
        logp_old = as_padded([s["logp_old"] for s in chunk], mask) if old else logp.detach()
        logp_ref = as_padded([s["logp_ref"] for s in chunk], mask) if cfg.loss.kl_coef > 0 else None
        adv = torch.tensor([s["advantage"] for s in chunk], dtype=torch.float32, device=ctx.device)
        loss, metrics = tgrpo_loss(logp, logp_old, adv, mask, normalizer, cfg.loss, logp_ref)
        loss.backward()
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
    return clipped_step(policy, optimizer, cfg.optim.grad_clip)


def reduce_sums(sums: dict, ctx: Dist) -> dict:
    """Loss metrics over all ranks: token-weighted and sequence-weighted means."""
    keys = sorted(sums)
    total = all_reduce(torch.stack([torch.as_tensor(sums[k], dtype=torch.float64).cpu() for k in keys]), ctx)
    s = dict(zip(keys, total.tolist()))
    out = {f"actor/{k}": s[k] / max(s["tokens"], 1) for k in TOKEN_METRICS}
    out.update({f"actor/{k}": s[k] / max(s["sequences"], 1) for k in SEQUENCE_METRICS})
    out["actor/clip_frac"] = out["actor/clip_frac_high"] + out["actor/clip_frac_low"]
    out["rollout/logprob_gap"] = s["gap"] / max(s["tokens"], 1)
    return out
