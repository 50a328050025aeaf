"""Scoring a T-GRPO step's responses (paper §3.2, SPEC §2-3): the per-response half of the
reward, which needs no trajectory cache, and the step's reward metrics.

Each rank scores the responses it sampled (`score_responses`: r_F1, r_fmt, p_rep of eq. 4-6 and 9);
`gather_samples` gives every rank the whole step's `Sample`s in step order, so that every rank
pushes the same values into its trajectory cache and computes the same final rewards (eq. 3, 7-8)
and advantages (eq. 2): those phases are written out in the loop, `psyrl/recipes/tgrpo.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from psyrl.core.config import RewardConfig
from psyrl.core.records import StimuliRecord
from psyrl.rl.rewards import Components, answer_components, reward_metrics
from psyrl.runtime.distributed import Dist, all_gather_lists
from psyrl.runtime.sampler import Completion


@dataclass(frozen=True)
class Sample:
    """One response of a T-GRPO step with the scores that need no cache; after `gather_samples`,
    every rank holds the step's B x G of them in step order (prompt position, then index)."""

    position: int
    """The prompt's place in the step, 0 <= position < B (rollout.prompts)."""
    index: int
    """The response's place in its prompt's group, 0 <= index < G (rollout.samples)."""
    id: str
    """The id of the prompt's StimuliQA record."""
    text: str
    """The response as decoded, without its stop token."""
    length: int
    """Response tokens, the stop token included when generated: |o_i| of eq. 1, L_i of eq. 7."""
    finish_reason: str
    """`stop` (a stop token ended it) or `length` (rollout.max_new_tokens did)."""
    f1: float
    """r_F1 of eq. 4-5 in [0, 1], or the signal in its role (reward.accuracy)."""
    fmt: float
    """r_fmt of eq. 6: 1 when the response has the think/answer format, else 0."""
    rep: float
    """p_rep of eq. 9, the repetition penalty in [0, reward.tau_rep] (subtracted in eq. 3)."""
    extra: dict[str, float]
    """Beyond the paper's F1 alone (reward.accuracy, .mix, .log_accuracy): `accuracy/<name>` per
    signal computed, `custom/<name>` per plug-in component, `judge_fallback` 1 where the judge
    gave no score, `judge_refused` 1 where its reply held none (scored 0); else empty."""


def score_responses(
    groups: Sequence[Sequence[Completion]],
    records: Sequence[StimuliRecord],
    positions: Sequence[int],
    mode: str,
    cfg: RewardConfig,
    accuracy=None,
) -> list[Sample]:
    """This rank's share of the step scored: groups[k] holds the G completions of the prompt at
    positions[k], whose record is records[k]; each response gets r_F1, r_fmt and p_rep
    (`psyrl.rl.rewards.answer_components`, prompt mode `mode`; `accuracy`: reward.accuracy's
    signals, psyrl.signals.build.Accuracy), all of the rank's responses in one call (an encoder
    batches them, a judge asks them concurrently)."""
    flat = [
        (p, r, i, c) for p, r, group in zip(positions, records, groups) for i, c in enumerate(group)
    ]
    parts = answer_components(
        [c.text for *_, c in flat], [r.answer for _, r, _, _ in flat], mode, cfg, accuracy,
        [r for _, r, _, _ in flat],
    )  # fmt: skip
    samples = []
    for n, (position, record, i, c) in enumerate(flat):
        values = {k: v[n].item() for k, v in parts.items()}
        f1, fmt, rep = values.pop("f1"), values.pop("fmt"), values.pop("rep")
        samples.append(
            Sample(
                position, i, record.id, c.text, len(c.token_ids), c.finish_reason, f1, fmt, rep,
                values,
            )
        )  # fmt: skip
    return samples


def gather_samples(local: list[Sample], dist: Dist) -> list[Sample]:
    """Every rank's samples, in step order (position, then index): the same list on every rank."""
    return sorted(all_gather_lists(local, dist), key=lambda s: (s.position, s.index))


def answer_tensors(samples: Sequence[Sample]) -> tuple[Components, torch.Tensor]:
    """The step's r_F1, r_fmt, p_rep as `Components` (float64 [B*G] each) and its response lengths
    [B*G]: the inputs of the cache's first phase and of `psyrl.rl.rewards.final_rewards`."""
    parts = {
        k: torch.tensor([getattr(s, k) for s in samples], dtype=torch.float64)
        for k in ("f1", "fmt", "rep")
    }
    lengths = torch.tensor([s.length for s in samples], dtype=torch.float64)
    return parts, lengths


def step_metrics(
    samples: Sequence[Sample], components: Components, adv: torch.Tensor, G: int
) -> dict[str, float]:
    """The step's reward components (SPEC §2), response lengths, truncation and zero-variance
    groups, over all B x G responses (`adv` [B*G])."""
    lengths = [s.length for s in samples]
    groups = components["final"].reshape(-1, G)  # [B, G]
    # a reward plug-in's extra components, and the paper's F1 beside its accuracy
    extra = sorted({k for s in samples for k in s.extra} - {"judge_fallback"})
    fallbacks = [s.extra["judge_fallback"] for s in samples if "judge_fallback" in s.extra]
    n = max(len(fallbacks), 1)
    judge = {"judge_fallbacks": sum(fallbacks), "judge_fallback_rate": sum(fallbacks) / n}
    return {
        **{
            f"reward/{k.removeprefix('custom/')}": sum(s.extra[k] for s in samples) / len(samples)
            for k in extra
        },
        **({f"reward/{k}": v for k, v in judge.items()} if fallbacks else {}),
        **reward_metrics(components),
        "response/length_max": max(lengths),
        "response/truncated": sum(s.finish_reason == "length" for s in samples) / len(samples),
        "rollout/advantage_abs_mean": adv.abs().mean().item(),
        "rollout/zero_variance_groups": (groups.amax(dim=1) == groups.amin(dim=1))
        .double()
        .mean()
        .item(),
    }
