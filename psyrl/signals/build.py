"""The accuracy signals a run computes, built from its config (`reward.accuracy`, `.mix`,
`.log_accuracy`): `build_signal` makes one by name, `Accuracy` holds a run's and scores each batch
of responses with all of them (psyrl.rl.accuracy: the pairs, the paper's F1, the mix). The
encoder and the judge are imported only when a config names them."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from psyrl.core.records import stimulus_and_question
from psyrl.core.text import extract_answer
from psyrl.rl.accuracy import Pair, Scores, TokenF1, reward_accuracy


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
        if "custom" in self.names:  # the plug-in's loader, for a run that has one
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
                *(stimulus_and_question(record) if record is not None else ("", "")),
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
        return Scores(reward_accuracy(signals, self.reward), signals, extras, fallbacks)
