"""The learning-rate schedule against transformers' schedulers, and AdamW's parameter groups."""

import pytest
import torch
from transformers import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from psyrl.core.config import OptimConfig
from psyrl.runtime.optim import build_optimizer, clipped_step, lr_factor, warmup_steps


def reference_factors(scheduler_fn, total, **kwargs):
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = scheduler_fn(opt, **kwargs)
    factors = []
    for _ in range(total):
        factors.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return factors


def test_paper_sft_warmup_is_31_of_315_steps():
    assert warmup_steps(OptimConfig(warmup_ratio=0.1), 315) == 31


@pytest.mark.parametrize("total, ratio", [(315, 0.1), (20, 0.0), (7, 0.3)])
def test_cosine_matches_transformers(total, ratio):
    cfg = OptimConfig(warmup_ratio=ratio, schedule="cosine")
    want = reference_factors(
        get_cosine_schedule_with_warmup,
        total,
        num_warmup_steps=warmup_steps(cfg, total),
        num_training_steps=total,
    )
    assert [lr_factor(s, cfg, total) for s in range(total)] == pytest.approx(want, abs=1e-12)


def test_constant_matches_transformers():
    cfg = OptimConfig(warmup_ratio=0.25, schedule="constant")
    want = reference_factors(get_constant_schedule_with_warmup, 12, num_warmup_steps=3)
    assert [lr_factor(s, cfg, 12) for s in range(12)] == pytest.approx(want, abs=1e-12)


def test_weight_decay_on_matrices_only():
    model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.LayerNorm(4))
    opt = build_optimizer(model, OptimConfig(weight_decay=0.01, lr=1e-3))
    decayed, plain = opt.param_groups
    assert decayed["weight_decay"] == 0.01 and [p.shape for p in decayed["params"]] == [(4, 3)]
    assert plain["weight_decay"] == 0.0 and len(plain["params"]) == 3


def test_non_finite_gradient_skips_the_update():
    model = torch.nn.Linear(2, 1)
    opt = build_optimizer(model, OptimConfig(lr=0.1))
    before = [p.detach().clone() for p in model.parameters()]
    model(torch.tensor([[float("nan"), 1.0]])).sum().backward()
    norm, applied = clipped_step(model, opt, max_norm=1.0)
    assert not applied and norm != norm  # NaN
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
    assert all(p.grad is None for p in model.parameters())
    model(torch.tensor([[3.0, 4.0]])).sum().backward()  # grads (3, 4, 1): norm sqrt(26)
    norm, applied = clipped_step(model, opt, max_norm=1.0)
    assert applied and norm == pytest.approx(26**0.5)
    assert not all(torch.equal(p, q) for p, q in zip(model.parameters(), before))
