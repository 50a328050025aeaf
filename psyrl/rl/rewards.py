"""The bilateral reward and its variants (paper §3.2 eq. 3-9, appendix A.2 eq. 11-15, SPEC §2).

Scoring runs in two parts because the length terms need the trajectory cache's statistics, which
include the current step (SPEC §3):
  1. `answer_components(responses, golds, mode, cfg)`: r_F1, r_fmt, p_rep per sample (no cache;
     r_F1's role may be taken by another accuracy signal, `reward.accuracy`: psyrl.rl.accuracy);
  2. `final_rewards(components, lengths, mean_length, mean_f1, cfg)`: r_BR, r_len, r_short and the
     configured variant's final reward, with L-bar and r-bar_F1 read from the cache.
Tensors are float64, shape [N].
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from psyrl.core.config import RewardConfig
from psyrl.core.text import (  # format_reward (eq. 6) is text-only: eval scores with it too
    extract_answer,
    format_reward,
    normalize,
    think_text,
)
from psyrl.rl.accuracy import Pair, token_f1

Components = dict[str, torch.Tensor]  # name -> [N] per-sample values


def repetition_penalty(think: str | None, cap: float, eps: float = RewardConfig.eps) -> float:
    """Eq. 9 as a non-negative penalty: min(tau_rep, repeated 4-grams / (total 4-grams + eps)) over
    the normalised words of the think text. Eq. 9 writes r_rep = -min(...) and eq. 3 subtracts it;
    that double negative would reward repetition, so the penalty is positive and subtracted once."""
    words = normalize(think) if think else []
    total = len(words) - 3
    if total < 1:
        return 0.0
    unique = len(set(zip(words, words[1:], words[2:], words[3:])))
    return min(cap, (total - unique) / (total + eps))


def answer_components(
    responses: Sequence[str],
    golds: Sequence[str],
    mode: str,
    cfg: RewardConfig,
    accuracy=None,
    records: Sequence | None = None,
) -> Components:
    """Per-sample r_F1 (eq. 4-5), r_fmt (eq. 6) and p_rep (eq. 9): everything that needs no cache.
    With `accuracy` (reward.accuracy's signals, `psyrl.signals.build.Accuracy`), "f1" holds the
    signal in r_F1's role, "accuracy/<name>" each signal computed (the paper's F1 among them),
    "custom/<name>" each extra component of a reward plug-in, "judge_fallback" 1 where the
    judge's score fell back."""
    if len(responses) != len(golds):
        raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers")
    fmt = [format_reward(response, mode) for response in responses]
    rep = [repetition_penalty(think_text(r), cfg.tau_rep, cfg.eps) for r in responses]
    as_tensor = lambda values: torch.tensor(values, dtype=torch.float64)
    parts = {"fmt": as_tensor(fmt), "rep": as_tensor(rep)}
    if accuracy is None or accuracy.paper:
        pairs = [Pair(gold, extract_answer(response)) for response, gold in zip(responses, golds)]
        return {"f1": token_f1(pairs), **parts}
    scores = accuracy(responses, golds, records)
    parts.update({f"accuracy/{name}": v for name, v in scores.signals.items()}, **scores.extras)
    if scores.judge_fallbacks is not None:
        parts["judge_fallback"] = scores.judge_fallbacks
    return {"f1": scores.accuracy, **parts}


def length_ratio(lengths: torch.Tensor, mean_length: float) -> torch.Tensor:
    """L / L-bar (eq. 8, 13, 14); 1 when L-bar is 0, i.e. no length signal at all."""
    lengths = torch.as_tensor(lengths, dtype=torch.float64)
    return lengths / mean_length if mean_length > 0 else torch.ones_like(lengths)


def bilateral_bonus(f1: torch.Tensor, ratio: torch.Tensor, mean_f1: float, cfg: RewardConfig):
    """Eq. 8: delta for a response shorter than tau_- or longer than tau_+ times L-bar whose F1
    beats r-bar_F1. Returns (r_BR, short side mask, long side mask)."""
    better = f1 > mean_f1
    short, long = better & (ratio < cfg.tau_low), better & (ratio > cfg.tau_high)
    return cfg.delta * (short | long).double(), short, long


def _f1_gain(f1: torch.Tensor, mean_f1: float, cfg: RewardConfig) -> torch.Tensor:
    return torch.log1p(f1 / (mean_f1 + cfg.eps))  # log(1 + r_F1 / r-bar_F1), eq. 13-14


def length_reward(
    f1: torch.Tensor, ratio: torch.Tensor, mean_f1: float, cfg: RewardConfig
) -> torch.Tensor:
    """Eq. 13: log(1 + r_F1/r-bar_F1) * L/L-bar where L/L-bar <= L_+, else 0."""
    return torch.where(ratio <= cfg.l_plus, _f1_gain(f1, mean_f1, cfg) * ratio, 0.0)


def short_reward(
    f1: torch.Tensor, ratio: torch.Tensor, mean_f1: float, cfg: RewardConfig
) -> torch.Tensor:
    """Eq. 14 where L/L-bar >= S_-, else 0. Eq. 14 repeats eq. 13's L/L-bar, which favours long
    answers; SPEC §2 uses L-bar/L (`short_reward_literal = true` gives the printed form)."""
    keep = ratio >= cfg.s_minus  # s_minus > 0 (config), so ratio > 0 wherever it is used
    scale = ratio if cfg.short_reward_literal else 1.0 / torch.where(keep, ratio, 1.0)
    return torch.where(keep, _f1_gain(f1, mean_f1, cfg) * scale, 0.0)


def overlong_penalty(lengths: torch.Tensor, max_new_tokens: int, cfg: RewardConfig) -> torch.Tensor:
    """DAPO's soft overlong punishment (reward.overlong_buffer = L_buf > 0; verl's dapo reward
    manager, verl/workers/reward_manager/dapo.py:121-127 at 1dda039): min(-(L - (L_max - L_buf)) /
    L_buf * penalty, 0) with L_max = rollout.max_new_tokens: 0 up to the last L_buf tokens, then
    falling linearly to -penalty at L_max."""
    expected = max_new_tokens - cfg.overlong_buffer
    excess = (torch.as_tensor(lengths, dtype=torch.float64) - expected) / cfg.overlong_buffer
    return torch.clamp(-excess * cfg.overlong_penalty, max=0.0)


def _base(c: Components, cfg: RewardConfig) -> torch.Tensor:
    return cfg.w_f1 * c["f1"] + cfg.w_fmt * c["fmt"]  # eq. 11


VARIANTS: dict[str, Callable[[Components, RewardConfig], torch.Tensor]] = {
    "base": _base,  # eq. 11, "Basic R1"
    "length": lambda c, cfg: _base(c, cfg) + cfg.w_len * c["len"],  # eq. 12-13
    "short": lambda c, cfg: _base(c, cfg) + cfg.w_short * c["short"],  # eq. 12, 14
    "length_rp": lambda c, cfg: _base(c, cfg) + cfg.w_len * c["len"] - c["rep"],  # eq. 15
    "bilateral": lambda c, cfg: _base(c, cfg) + c["br"] - c["rep"],  # eq. 3, the paper's BR
}


def final_rewards(
    components: Components,
    lengths,
    mean_length: float,
    mean_f1: float,
    cfg: RewardConfig,
    max_new_tokens: int = 0,
) -> tuple[torch.Tensor, Components]:
    """The configured variant's r^Final per sample, plus every component (for logging).
    `mean_length`, `mean_f1` are the cache's L-bar and r-bar_F1 (eq. 7), current step included.
    With reward.overlong_buffer > 0, DAPO's overlong penalty (`overlong_penalty`, L_max =
    `max_new_tokens`) is added to any variant, its own component "overlong"."""
    c = dict(components)
    c["length"] = torch.as_tensor(lengths, dtype=torch.float64).flatten()
    if c["length"].shape != c["f1"].shape:
        raise ValueError(f"{c['length'].numel()} lengths for {c['f1'].numel()} responses")
    c["ratio"] = length_ratio(c["length"], mean_length)
    c["br"], c["br_short"], c["br_long"] = bilateral_bonus(c["f1"], c["ratio"], mean_f1, cfg)
    c["len"] = length_reward(c["f1"], c["ratio"], mean_f1, cfg)
    c["short"] = short_reward(c["f1"], c["ratio"], mean_f1, cfg)
    c["final"] = VARIANTS[cfg.variant](c, cfg)
    if cfg.overlong_buffer > 0:
        if max_new_tokens < cfg.overlong_buffer:  # verl allows the ramp to span the whole budget
            raise ValueError(
                f"reward.overlong_buffer = {cfg.overlong_buffer} needs rollout.max_new_tokens "
                f">= it, got {max_new_tokens}"
            )
        c["overlong"] = overlong_penalty(c["length"], max_new_tokens, cfg)
        c["final"] = c["final"] + c["overlong"]
    return c["final"], c


def reward_metrics(components: Components) -> dict[str, float]:
    """Step means of every component, and the fraction of samples given delta on each side (SPEC
    §2)."""
    names = {
        "f1": "reward/f1",
        "fmt": "reward/format",
        "rep": "reward/repetition_penalty",
        "br": "reward/br",
        "len": "reward/length",
        "short": "reward/short",
        "overlong": "reward/overlong",
        "final": "reward/final",
        "length": "response/length",
    }  # fmt: skip
    metrics = {
        label: components[key].mean().item() for key, label in names.items() if key in components
    }
    for side in ("short", "long"):
        if f"br_{side}" in components:
            metrics[f"reward/br_{side}_fraction"] = components[f"br_{side}"].double().mean().item()
    return metrics
