"""AdamW and the learning-rate schedule (appendix A.3/A.4), shared by SFT and T-GRPO."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor

from psyrl.core.config import OptimConfig


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (biases and norm gains are not decayed, as in HF
    Trainer)."""
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [
        {"params": [p for p in params if p.ndim >= 2], "weight_decay": cfg.weight_decay},
        {"params": [p for p in params if p.ndim < 2], "weight_decay": 0.0},
    ]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.adam_eps)


def warmup_steps(cfg: OptimConfig, total_steps: int) -> int:
    return int(cfg.warmup_ratio * total_steps)  # A.4: 10 % of 315 = 31 warm-up steps


def lr_factor(
    step: int,
    cfg: OptimConfig,
    total_steps: int,
    extensions: Sequence[tuple[int, int]] = (),
) -> float:
    """Multiplier of cfg.lr for the update at 0-based `step`: linear warm-up from 0, then cosine to
    0 or constant (the formulas of transformers' get_cosine_schedule_with_warmup /
    get_constant_schedule_with_warmup).

    `extensions` (--extend, run.extend): (start, planned) pairs, in order: the run was planned for
    `planned` updates and re-planned for more after `start` updates (the last one: for
    `total_steps`). The rule, chosen so that the learning rate never jumps: up to `start` the
    earlier plan, unchanged; the warm-up keeps the length the first plan gave it; after it, a
    constant schedule stays 1, and cosine restarts its decay from the factor of the last update
    before the extension (step start - 1) and falls to 0 over the new remaining updates:
    f(k) = f_before(start - 1) * 0.5 * (1 + cos(pi * (k - start + 1) / (total_steps - start + 1))).
    Extended during the warm-up, the decay is the one planned for `total_steps` after that warm-up.
    An extended cosine run is therefore not the run planned for `total_steps` from the start (which
    would sit higher at `start`); a constant one past its warm-up is."""
    if extensions:
        (start, planned), earlier = extensions[-1], extensions[:-1]
        warmup = warmup_steps(cfg, extensions[0][1])
        if step < start:
            return lr_factor(step, cfg, planned, earlier)
        if step < warmup:
            return step / warmup
        if cfg.schedule == "constant":
            return 1.0
        if start <= warmup:  # the decay had not begun: it runs over the new total
            return _cosine((step - warmup) / max(1, total_steps - warmup))
        last = lr_factor(start - 1, cfg, planned, earlier)
        return last * _cosine((step - start + 1) / (total_steps - start + 1))
    warmup = warmup_steps(cfg, total_steps)
    if step < warmup:
        return step / warmup
    if cfg.schedule == "constant":
        return 1.0
    return _cosine((step - warmup) / max(1, total_steps - warmup))


def _cosine(progress: float) -> float:
    """Half a cosine from 1 (progress 0) to 0 (progress 1)."""
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def clipped_step(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, max_norm: float
) -> tuple[float, bool]:
    """Clip the global gradient norm to max_norm (0 = no clipping), step only when the norm is
    finite, clear the gradients. Returns (norm before clipping, whether the update was applied): a
    NaN/inf never reaches the weights."""
    norm = torch.nn.utils.clip_grad_norm_(
        model.parameters(), max_norm if max_norm > 0 else math.inf
    )
    # FSDP2: the norm over all shards
    norm = (norm.full_tensor() if isinstance(norm, DTensor) else norm).item()
    applied = math.isfinite(norm)
    if applied:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, applied
