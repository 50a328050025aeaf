"""The accuracy signal in r_F1's role (`reward.accuracy`, issue 41): the accuracy term of eq. 3,
11, the r-bar of eq. 7 that the trajectory cache averages, and eq. 8's comparison with it.

`f1` is the paper's token-set F1 (eq. 4-5) and the default. The others, `semantic` (a local
sentence encoder), `judge` (an LLM judge) and `custom` (the reward plug-in), are built by
psyrl.signals.build when a config names them, so the paper's run loads none of them; `mix` is a
weighted sum of signals (`reward_accuracy`). A signal is an object with a `name` and
`__call__(pairs) -> float64 [N]` in [0, 1]; `psyrl reward audit` checks one before training on it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from psyrl.core.text import normalize, set_f1


@dataclass(frozen=True)
class Pair:
    """One answer to score against its gold answer."""

    gold: str
    prediction: str
    """The answer text, already extracted from <answer>...</answer>."""
    stimulus: str = ""
    question: str = ""


def token_f1(pairs: Sequence[Pair]) -> torch.Tensor:
    """Eq. 4-5: set F1 of the normalised words of prediction and gold, float64 [N]."""
    gold_sets: dict[str, set[str]] = {}  # a prompt's G responses share one gold answer
    scores = []
    for pair in pairs:
        if pair.gold not in gold_sets:
            gold_sets[pair.gold] = set(normalize(pair.gold))
        scores.append(set_f1(set(normalize(pair.prediction)), gold_sets[pair.gold]))
    return torch.tensor(scores, dtype=torch.float64)


class TokenF1:
    name = "f1"

    def __call__(self, pairs: Sequence[Pair]) -> torch.Tensor:
        return token_f1(pairs)


@dataclass
class Scores:
    """One batch of responses scored by every signal a run computes."""

    accuracy: torch.Tensor
    """The reward's accuracy, float64 [N] in [0, 1]: r_F1's role in eq. 3, 7, 8."""
    signals: dict[str, torch.Tensor]
    """Each computed signal by name, float64 [N] (the paper's F1 always among them)."""
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    """A plug-in's components, "custom/<name>" -> [N]; a judge's "judge_refused" [N] (scored 0)."""
    judge_fallbacks: torch.Tensor | None = None
    """1 where the judge gave no score (judge.on_failure says what stood in), else 0."""


def reward_accuracy(signals: dict[str, torch.Tensor], reward) -> torch.Tensor:
    """The accuracy in r_F1's role from the computed signals: reward.accuracy's own, or with
    accuracy = "mix" the sum of reward.mix_weights times reward.mix's signals; in [0, 1]."""
    if reward.accuracy == "mix":
        accuracy = sum(w * signals[n] for n, w in zip(reward.mix, reward.mix_weights))
    else:
        accuracy = signals[reward.accuracy]
    return accuracy.clamp(0.0, 1.0)
