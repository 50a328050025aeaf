"""The accuracy signals a run computes, built from its config (`reward.accuracy`, `.mix`,
`.log_accuracy`): `build_signal` makes one by name, `Accuracy` holds a run's and scores each batch
of responses with all of them (psyrl.rl.accuracy: the pairs, the paper's F1, the mix). The
encoder and the judge are imported only when a config names them."""

from __future__ import annotations

from collections import deque
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
        self.judge_cfg = cfg.judge
        self.window: deque[tuple[int, int]] = deque(maxlen=cfg.judge.fallback_window)
        self.told = False  # the run's first fallback printed
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
            judge = self.built["judge"]
            fallbacks = torch.as_tensor(judge.fallback_mask, dtype=torch.float64)
            # the subset the answer caused (scored 0, never masked): reward/judge_refused
            extras["judge_refused"] = torch.as_tensor(judge.refused_mask, dtype=torch.float64)
        return Scores(reward_accuracy(signals, self.reward), signals, extras, fallbacks)

    # ------------------------------------------------------------------ the judge's fallbacks
    def kept(self, samples: Sequence) -> torch.Tensor | None:
        """judge.on_failure = "mask" with the judge in the reward: [N] bool, False where the judge
        left the response unanswered (its advantage is 0, the cache's means leave it out); None
        when every response keeps its place (always, with the paper's F1). A response whose
        reply held no score line is kept, scored 0: the answer can cause that failure, and
        masking it would spare the answer a wrong answer's negative advantage."""
        judged = self.reward.accuracy == "judge" or (
            self.reward.accuracy == "mix" and "judge" in self.reward.mix
        )
        if not judged or self.judge_cfg.on_failure != "mask":
            return None
        failed = torch.tensor([unanswered(s) for s in samples])  # [N]
        return ~failed if failed.any() else None

    def watch(self, samples: Sequence, step: int, dist) -> None:
        """The judge's fallbacks among a step's responses, all ranks' (every rank holds the same
        `samples`, so every rank takes the same branch): the run's first one is printed with its
        error, on rank 0; past judge.max_fallback_rate over the last judge.fallback_window steps
        the run stops with the error. Nothing without a judge."""
        if "judge" not in self.built:
            return
        from psyrl.runtime.distributed import all_gather_lists, print0
        from psyrl.signals.judge import JudgeError

        judge = self.built["judge"]
        failed = sum(s.extra.get("judge_fallback", 0.0) > 0 for s in samples)
        self.window.append((failed, len(samples)))
        if not failed:
            return
        # the error is known on the ranks that asked: rank 0 may have had none
        errors = all_gather_lists([e for e in (judge.first_error, judge.latest_error) if e], dist)
        first, latest = (errors[0], errors[-1]) if errors else ("(not recorded)",) * 2
        if not self.told:
            self.told = True
            lost = sum(unanswered(s) for s in samples)
            uses = [f"{failed - lost} replied without a score line: scored 0"] * (lost < failed)
            if lost:
                use = FALLBACK_USE[self.judge_cfg.on_failure]
                uses.append(
                    f"{lost} unanswered: judge.on_failure = {self.judge_cfg.on_failure!r}: {use}"
                )
            print0(
                f"step {step}: the judge did not score {failed} of {len(samples)} responses "
                f"({'; '.join(uses)}); first error: {first}",
                dist,
            )
        missed, total = (sum(column) for column in zip(*self.window))
        if missed / total > self.judge_cfg.max_fallback_rate:
            raise JudgeError(
                f"step {step}: the judge did not score {missed} of {total} responses over the last "
                f"{len(self.window)} step(s), more than judge.max_fallback_rate = "
                f"{self.judge_cfg.max_fallback_rate:g}; last error: {latest}"
            )


def unanswered(sample) -> bool:
    """The judge did not score the sample for a cause its answer cannot have (a timeout, no
    connection, a 5xx, a 429, the step's deadline): on_failure applies. A reply without a score
    line (`judge_refused`) is counted among the fallbacks but scored 0."""
    return sample.extra.get("judge_fallback", 0.0) > 0 and not sample.extra.get("judge_refused")


FALLBACK_USE = {  # judge.on_failure's use of a response the judge did not score
    "mask": "left out of the loss",
    "f1": "trained on the paper's F1 instead",
    "stop": "the run stops",
}
