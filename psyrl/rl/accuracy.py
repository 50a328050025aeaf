"""The accuracy signal in r_F1's role (`reward.accuracy`, issue 41): the accuracy term of eq. 3,
11, the r-bar of eq. 7 that the trajectory cache averages, and eq. 8's comparison with it.

`f1` is the paper's token-set F1 (eq. 4-5) and the default. `semantic` (a local sentence encoder,
psyrl.signals.semantic), `judge` (an LLM judge, psyrl.signals.judge) and `custom` (the reward
plug-in, psyrl.rl.reward_plugin) are imported only when a config names them, so the paper's run
loads none of them. `mix` is a weighted sum of signals. A signal is an object with a `name` and
`__call__(pairs) -> float64 [N]` in [0, 1]; `psyrl reward audit` checks one before training on it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from psyrl.core.text import extract_answer, normalize, set_f1


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


def build_signal(name: str, cfg, device="cpu", cache_dir: Path | None = None, rank: int = 0):
    """The signal `name` ("f1", "semantic", "judge") built from a Config (`custom` needs the
    responses themselves, so `Accuracy` calls the plug-in directly)."""
    if name == "f1":
        return TokenF1()
    if name == "semantic":
        from psyrl.signals.semantic import SemanticSignal

        return SemanticSignal(
            encoder=cfg.semantic.encoder, device=device, batch_size=cfg.semantic.batch_size
        )
    if name == "judge":
        from psyrl.signals.judge import JudgeSignal

        return JudgeSignal(cfg.judge, cache_dir=cache_dir, rank=rank)
    raise ValueError(f"unknown accuracy signal {name!r} (f1, semantic, judge, custom)")


@dataclass
class Scores:
    """One batch of responses scored by every signal a run computes."""

    accuracy: torch.Tensor
    """The reward's accuracy, float64 [N] in [0, 1]: r_F1's role in eq. 3, 7, 8."""
    signals: dict[str, torch.Tensor]
    """Each computed signal by name, float64 [N] (the paper's F1 always among them)."""
    extras: dict[str, torch.Tensor] = field(default_factory=dict)
    """The plug-in's extra components, "custom/<name>" -> [N]."""
    judge_fallbacks: torch.Tensor | None = None
    """1 where the judge gave no score and the paper's F1 stood in (on_failure = "f1"), else 0."""


class Accuracy:
    """The signals of a run's `reward.accuracy`, `reward.mix` and `reward.log_accuracy`, built
    once (an encoder's weights, the judge's cache) and applied to each batch of responses."""

    def __init__(self, cfg, device="cpu", cache_dir: Path | None = None, rank: int = 0):
        self.reward = cfg.reward
        self.names = cfg.reward.signals()
        self.built = {
            n: build_signal(n, cfg, device, cache_dir, rank)
            for n in dict.fromkeys(["f1", *self.names])
            if n != "custom"
        }
        self.plugin: Callable | None = None
        if "custom" in self.names:
            from psyrl.rl.reward_plugin import load_reward_plugin

            self.plugin = load_reward_plugin(cfg.reward.custom)

    @property
    def paper(self) -> bool:
        """True for the paper's signal alone: nothing beyond r_F1 to log."""
        return self.names == ["f1"]

    def __call__(
        self, responses: Sequence[str], golds: Sequence[str], records: Sequence | None = None
    ) -> Scores:
        if len(responses) != len(golds):
            raise ValueError(f"{len(responses)} responses but {len(golds)} gold answers")
        records = list(records) if records is not None else [None] * len(responses)
        pairs = [
            Pair(
                gold,
                extract_answer(response),
                "\n".join(getattr(record, "stimuli", None) or ()),
                getattr(record, "question", "") or "",
            )
            for response, gold, record in zip(responses, golds, records)
        ]
        signals = {name: signal(pairs) for name, signal in self.built.items()}
        extras, fallbacks = {}, None
        if self.plugin is not None:
            from psyrl.rl.reward_plugin import plugin_scores

            signals["custom"], extras = plugin_scores(
                self.plugin, self.reward.custom, responses, golds, records
            )
        if "judge" in self.built:
            fallbacks = torch.as_tensor(self.built["judge"].fallback_mask, dtype=torch.float64)
        if self.reward.accuracy == "mix":
            accuracy = sum(w * signals[n] for n, w in zip(self.reward.mix, self.reward.mix_weights))
        else:
            accuracy = signals[self.reward.accuracy]
        return Scores(accuracy.clamp(0.0, 1.0), signals, extras, fallbacks)
