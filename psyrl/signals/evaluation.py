"""Accuracy signals beside the paper's metrics in `psyrl evaluate` (issue 41 item 6): what to
score (`Scoring`: --accuracy, --choose-by, --signal-config), the signals built once before any
generation (`build_scorers`), and each prediction row scored after the paper's F1
(`score_signals`). Nothing here runs for the paper's scoring alone."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from psyrl.core.config import Config, load_config
from psyrl.core.presets import resolve_config
from psyrl.core.records import stimulus_and_question
from psyrl.eval.benchmarks import SIGNAL_PREFIX, EvalError, choose_by_scores
from psyrl.rl.accuracy import Pair
from psyrl.signals.build import build_signal

JUDGE_CACHE = "judge_cache"  # the judge's scores in --out, by content hash: a resume reads them


@dataclass(frozen=True)
class Scoring:
    """What evaluate.py scores beside the paper's metrics (issue 41 item 6); nothing by default."""

    accuracy: tuple[str, ...] = ()
    """Accuracy signals (`semantic`, `judge`), each a row's `accuracy/<name>` and a summary's mean
    ×100: of the extracted answer against the gold answer text, given the item's context and
    question."""
    choose_by: str = "f1"
    """A multiple-choice answer's option: `f1`, the one of highest F1 (SPEC §7, the paper), or
    `similarity`, the one of highest semantic similarity; a tie at the top is E either way."""
    signal_config: str | None = None
    """A psyrl config (file or preset) whose [semantic] and [judge] tables configure the signals;
    None: the defaults (the judge has no default endpoint)."""

    @property
    def paper(self) -> bool:
        """The paper's scoring alone: every output file as without these options."""
        return not self.accuracy and self.choose_by == "f1"


PAPER_SCORING = Scoring()  # the default: nothing beside the paper's metrics


@dataclass
class Scorers:
    """The built signals of a Scoring (rank 0 holds them)."""

    accuracy: dict = field(default_factory=dict)
    """Signal name -> signal (`psyrl.rl.accuracy`): `signal(pairs)` is float64 [N] in [0, 1]."""
    similarity: object | None = None
    """The semantic signal that chooses options (`choose_by = "similarity"`), else None."""
    settings: dict = field(default_factory=dict)
    """What eval.json and results.json record of them."""


def signal_settings(scoring: Scoring) -> Config | None:
    """The config of the signals (None for the paper's scoring), checked before any model is read:
    the judge needs an endpoint."""
    if scoring.paper:
        if scoring.signal_config is not None:
            raise EvalError(
                "--signal-config configures --accuracy semantic|judge and --choose-by similarity; "
                "neither was given"
            )
        return None
    path = None if scoring.signal_config is None else resolve_config(scoring.signal_config)
    cfg = load_config(path)
    if "judge" in scoring.accuracy and not (cfg.judge.base_url and cfg.judge.model):
        where = f"{path}'s [judge] table" if path else "no --signal-config FILE"
        raise EvalError(
            "--accuracy judge needs the judge's endpoint: base_url and model in the [judge] table "
            f"of a --signal-config FILE ({where} sets "
            f"base_url = {cfg.judge.base_url!r}, model = {cfg.judge.model!r}); see docs/judge.md"
        )
    return cfg


def build_scorers(scoring: Scoring, cfg: Config | None, out: Path) -> Scorers | None:
    """The signals of `scoring`, built before any generation (a missing encoder is said at once),
    on the CPU: a score does not depend on the device an evaluation or its resume ran on. The
    judge's cache is `out`/judge_cache."""
    if cfg is None:
        return None
    built = {n: build_signal(n, cfg, "cpu", out / JUDGE_CACHE) for n in scoring.accuracy}
    similarity = None
    if scoring.choose_by == "similarity":
        similarity = built.get("semantic") or build_signal("semantic", cfg, "cpu")
    settings: dict = {}
    if scoring.accuracy:
        settings["accuracy"] = list(scoring.accuracy)
    if similarity is not None:
        settings["choose_by"] = scoring.choose_by
    if similarity is not None or "semantic" in built:
        settings["semantic_encoder"] = str((similarity or built["semantic"]).directory)
    if "judge" in built:  # the key's variable by name only, as for --engine openai
        judge = cfg.judge
        settings["judge"] = {
            "base_url": judge.base_url,
            "model": judge.model,
            "rubric": judge.rubric or "(shipped)",
            "api_key_env": judge.api_key_env,
            "on_failure": judge.on_failure,
        }
    if scoring.signal_config is not None:
        settings["signal_config"] = scoring.signal_config
    return Scorers(built, similarity, settings)


def score_signals(rows: list[dict], records: dict, scorers: Scorers) -> dict:
    """After the paper's scoring (`score_response`): each row's `accuracy/<name>`, the signal of
    its extracted answer against the gold answer text, with the item's context and question; and
    with `choose_by = "similarity"`, a multiple-choice row's option_similarity, choice and
    correctness. One call per signal and benchmark: the encoder batches, the judge's requests run
    concurrently (judge.concurrency, judge.step_timeout_s per benchmark). Rows in item order: a
    resume scores the same batches, so the same floats. Returns what perf records."""
    by_benchmark: dict[str, list[dict]] = {}
    for row in rows:
        by_benchmark.setdefault(row["benchmark"], []).append(row)
    fallbacks = refused = 0
    for group in by_benchmark.values():
        pairs = [
            Pair(records[r["id"]].answer, r["extracted"], *stimulus_and_question(records[r["id"]]))
            for r in group
        ]
        for name, scorer in scorers.accuracy.items():
            for row, score in zip(group, scorer(pairs).tolist()):  # [N]
                row[SIGNAL_PREFIX + name] = score
            fallbacks += getattr(scorer, "fallbacks", 0)  # the judge's unscored answers
            refused += getattr(scorer, "refused", 0)  # of them, replies without a score: 0
        if scorers.similarity is not None:
            chosen = [(r, records[r["id"]]) for r in group if r["option_f1"] is not None]
            option_pairs = [Pair(o, r["extracted"]) for r, record in chosen for o in record.options]
            scores = scorers.similarity(option_pairs).tolist()  # [sum of the options]
            start = 0
            for row, record in chosen:
                choose_by_scores(row, record, scores[start : start + len(record.options)])
                start += len(record.options)
    if "judge" not in scorers.accuracy:
        return {}
    if fallbacks:
        judge = scorers.accuracy["judge"]
        print(
            f"evaluate: the judge did not score {fallbacks} answers (last error: "
            f"{judge.last_error}); {refused} of them it answered without a score line (their "
            "accuracy/judge is 0), the others' accuracy/judge is the paper's F1; all are asked "
            "again on a resume"
        )
    return {"judge_fallbacks": fallbacks}
