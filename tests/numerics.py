"""How the tests compare two training runs whose arithmetic differs only in the order of float32
sums (FSDP against one process, 2 ranks against 1, packed against padded): after AdamW, weights
cannot be compared element by element at float32's noise on every CPU (docs/install.md, "What
holds across machines")."""

import math

import torch

FLOAT32_EPS = torch.finfo(torch.float32).eps  # 2^-23: one ulp of 1.0, twice the unit roundoff u


def float32_sum_tolerance(total: float, terms: int) -> float:
    """The most two float32 evaluations of one sum of `terms` terms of one sign, near `total`, can
    differ when their summation orders differ or their inputs differ in the last bits (another
    chunking, another kernel set). Each sum is within (n - 1) u sum|x_i| of its exact value in any
    order (Higham, "Accuracy and Stability of Numerical Algorithms", 2nd ed., eq. 4.4; u = 2^-24),
    and each term's own rounding (exp, log, a product: within u each) adds up to 3u sum|x_i|; terms
    of one sign have sum|x_i| = |total|. Two evaluations: within 2 (n + 2) u |total| = (n + 2) eps
    |total|, about n ulps at the value's magnitude."""
    return (terms + 2) * FLOAT32_EPS * abs(total)


def adamw_move_bound(lrs: list[float], beta1: float, beta2: float) -> float:
    """The most two AdamW runs' weights can differ by, element by element, after the steps taken at
    `lrs`, whatever their gradients: each step moves an element by lr * |m_hat| / (sqrt(v_hat) +
    eps), and Cauchy-Schwarz over m_t = (1 - b1) sum_k b1^k g_(t-k) against v_t = (1 - b2)
    sum_k b2^k g_(t-k)^2 bounds |m_hat| / sqrt(v_hat) by
    (1 - b1) / (1 - b1^t) * sqrt((1 - b2^t) / (1 - b2)) * sqrt(sum_(k<t) (b1^2 / b2)^k)
    (1 at t = 1: the first step moves every element by lr * sign(g) unless |g| is near eps)."""
    bound = 0.0
    for t, lr in enumerate(lrs, start=1):
        geometric = sum((beta1**2 / beta2) ** k for k in range(t))
        ratio = (1 - beta1) / (1 - beta1**t) * math.sqrt((1 - beta2**t) / (1 - beta2) * geometric)
        bound += 2 * lr * ratio  # both runs moved by up to lr * ratio, in opposite directions
    return bound


def assert_adamw_weights_close(
    moved: dict[str, torch.Tensor],
    reference: dict[str, torch.Tensor],
    lrs: list[float],
    betas: tuple[float, float] = (0.9, 0.999),
) -> None:
    """Two runs' weights after AdamW steps at `lrs` from gradients equal but for float32 summation
    order: element by element within `adamw_move_bound`, and in the root mean square to a
    hundredth of the largest lr. Summation order moves few elements (those whose gradient is near
    zero, divided by sqrt(v_hat) + eps): measured RMS 5.2e-8 for SFT at lr 3e-3, 1.1e-9 for
    T-GRPO at 1e-4. A real fault (a lost update, a reset AdamW state, a shard's gradient missing)
    moves most elements by ~lr, an RMS near lr."""
    assert moved.keys() == reference.keys()
    difference = torch.cat([(moved[k].float() - reference[k].float()).flatten() for k in reference])
    assert difference.pow(2).mean().sqrt().item() < max(lrs) / 100
    assert difference.abs().max().item() <= adamw_move_bound(lrs, *betas)
