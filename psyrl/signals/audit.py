"""Does an accuracy signal measure what it claims? (issue 41 item 5): `psyrl reward audit`'s
figures, and the rows `psyrl reward score` and `psyrl reward audit` read.

A triple is a gold answer, a `right` answer (correct, e.g. a paraphrase) and a `wrong` one (e.g. the
opposite emotion in the gold's words). For one signal's scores of the right and wrong answers:

- `above`: the fraction of triples with score(right) > score(wrong). A tie is not above: a signal
  that cannot tell the two apart has not ranked the right one higher.
- `margin`: the mean of score(right) - score(wrong), in the signal's own units.

Each with a 95 % bootstrap interval: 10,000 resamples of the triples with replacement (seeded, the
same resamples for both figures), percentile method (the 2.5th and 97.5th percentiles of the
resampled means, linearly interpolated as numpy's default).

Probes (`psyrl reward audit --probes`): answers a policy could write without knowing the item
(psyrl/assets/judge/probes.jsonl: score lines, fake headings and tags, "ignore the rubric",
openers such as "Thought process:", an empty answer, every emotion word). Each probe is scored
against every triple's gold answer, stimulus and question. For one signal and probe:

- `above_wrong`: the fraction of triples with score(probe) > score(wrong), the triple's labelled
  wrong answer (a tie is not above); `above_right` likewise against its right answer.
- `mean`: the probe's mean score; `unscored`: triples the judge gave no score (not above in the
  pairwise counts).

A probe *beats* the wrong answers when its mean score is above the mean score of the triples'
wrong answers (the same triples, those it was scored on): a policy that wrote it every time instead
of a wrong guess would earn more reward. The pairwise counts show how often. A probe the judge
leaves unscored on any triple *escapes the judge*, a finding of its own, not a probe "below the
wrong answers": the answer steered the judge off its format. Training scores such a reply 0 and
counts it among the fallbacks (psyrl.signals.judge), so it earns no more than a wrong answer, but a
policy that finds it drives the fallback rate up to judge.max_fallback_rate, where the run stops;
and a judge that can be steered so may be steered further.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch

from psyrl.core.records import DataError, raise_line_errors, read_jsonl
from psyrl.rl.accuracy import Pair

RESAMPLES = 10_000
LEVEL = 0.95
SEED = 0
OPTIONAL = ("stimulus", "question")


# ---------------------------------------------------------------- rows
class RowsError(DataError):
    """A file of rows the reward tools cannot read: a file's contents, exit status 1 as for every
    command (docs/cli.md)."""


@dataclass(frozen=True)
class Triple:
    """One audit case: a gold answer, a right answer and a wrong one."""

    gold: str
    right: str
    wrong: str
    stimulus: str = ""
    question: str = ""

    def pairs(self) -> tuple[Pair, Pair]:
        """(right, wrong) as Pairs to score against the gold."""
        return (
            Pair(self.gold, self.right, self.stimulus, self.question),
            Pair(self.gold, self.wrong, self.stimulus, self.question),
        )


def _fields(obj, required: Sequence[str], may_be_empty: Sequence[str] = ()) -> dict[str, str]:
    """The string fields of one decoded line; a ValueError names every problem."""
    expected = ", ".join(f'"{k}"' for k in required)
    if not isinstance(obj, dict):
        kind = type(obj).__name__ if obj is not None else "null"
        raise ValueError(f"expected a JSON object with string keys {expected}, got a JSON {kind}")
    problems = []
    for key in (*required, *OPTIONAL):
        if key not in obj or (key in OPTIONAL and obj[key] is None):
            if key in required:
                problems.append(f"missing key {key!r} (a string)")
            continue
        value = obj[key]
        if not isinstance(value, str):
            problems.append(f"key {key!r}: expected a string, got {json.dumps(value)[:60]}")
        elif key in required and key not in may_be_empty and not value.strip():
            problems.append(f"key {key!r}: must not be empty")
    if problems:
        raise ValueError("; ".join(problems))
    return {k: obj[k] for k in (*required, *OPTIONAL) if obj.get(k) is not None}


def _load(path: str | Path, parse, what: str) -> list:
    """Every row of a JSONL file through `parse`, or one DataError listing every bad line."""
    path = Path(path)
    if not path.is_file():
        raise RowsError(f"{path}: no such file")
    bad: list[tuple[int, str]] = []
    numbered = read_jsonl(path, bad=bad)
    rows, errors = [], list(bad)
    for lineno, obj in numbered:
        try:
            rows.append(parse(obj))
        except ValueError as e:
            errors.append((lineno, str(e)))
    errors.sort(key=lambda error: error[0])
    try:
        raise_line_errors(path, [f"{path}:{n}: {problem}" for n, problem in errors])
    except DataError as e:
        raise RowsError(str(e)) from None
    if not rows:
        raise RowsError(
            f"{path}: the file holds no rows (expected one JSON object per line: {what})"
        )
    return rows


def load_pairs(path: str | Path) -> list[Pair]:
    """`psyrl reward score`'s rows: "gold" and "prediction" (the answer text; may be empty),
    optional "stimulus" and "question"; other keys are ignored."""
    return _load(
        path,
        lambda obj: Pair(**_fields(obj, ("gold", "prediction"), may_be_empty=("prediction",))),
        '"gold" and "prediction"',
    )


def load_triples(path: str | Path) -> list[Triple]:
    """`psyrl reward audit`'s rows: "gold", "right" and "wrong", optional "stimulus" and
    "question"; other keys (e.g. an id or a category) are ignored."""
    return _load(
        path,
        lambda obj: Triple(**_fields(obj, ("gold", "right", "wrong"))),
        '"gold", "right", "wrong"',
    )


@dataclass(frozen=True)
class Probe:
    """An answer written to game a signal, the same for every item."""

    id: str
    what: str
    prediction: str


def load_probes(path: str | Path | None = None) -> list[Probe]:
    """The probes of a JSONL file ("id", "what", "prediction"; the prediction may be empty), or the
    shipped set (psyrl/assets/judge/probes.jsonl) when `path` is None."""
    if path is None:
        path = Path(str(resources.files("psyrl") / "assets" / "judge" / "probes.jsonl"))

    def parse(obj) -> Probe:
        fields = _fields(obj, ("id", "what", "prediction"), may_be_empty=("prediction",))
        return Probe(fields["id"], fields["what"], fields["prediction"])

    return _load(path, parse, '"id", "what", "prediction"')


def probe_pairs(probes: Sequence[Probe], triples: Sequence[Triple]) -> list[Pair]:
    """Each probe against each triple, probe-major: [P * n]."""
    return [
        Pair(t.gold, probe.prediction, t.stimulus, t.question) for probe in probes for t in triples
    ]


@dataclass(frozen=True)
class ProbeFigures:
    """One probe's figures under one signal, over n triples."""

    id: str
    mean: float
    """Mean score over the triples it was scored on (0 when none)."""
    above_wrong: float
    """Fraction of triples with score(probe) > score(wrong answer)."""
    above_right: float
    """Fraction of triples with score(probe) > score(right answer)."""
    unscored: int
    """Triples the judge gave no score (counted as not above)."""
    beats: bool
    """Its mean is above the wrong answers' mean on the triples it was scored on."""
    escapes: bool
    """The judge left it unscored on at least one triple: a finding (the module's docstring)."""


def probe_figures(
    probes: Sequence[Probe],
    scores: torch.Tensor,
    right: torch.Tensor,
    wrong: torch.Tensor,
    unscored: torch.Tensor | None = None,
) -> list[ProbeFigures]:
    """Each probe's figures from its scores [P * n] (probe-major, `probe_pairs`), the triples'
    right and wrong answers' scores [n] each, and `unscored` [P * n] bool (None: all scored)."""
    n = right.numel()
    scores = scores.double().reshape(len(probes), n)  # [P, n]
    missing = (
        torch.zeros_like(scores, dtype=torch.bool)
        if unscored is None
        else unscored.reshape(len(probes), n)
    )  # [P, n]
    figures = []
    for probe, row, miss in zip(probes, scores, missing):
        scored = row[~miss]
        mean = scored.mean().item() if scored.numel() else 0.0
        figures.append(
            ProbeFigures(
                id=probe.id,
                mean=mean,
                above_wrong=((row > wrong.double()) & ~miss).double().mean().item(),
                above_right=((row > right.double()) & ~miss).double().mean().item(),
                unscored=int(miss.sum()),
                beats=bool(scored.numel()) and mean > wrong.double()[~miss].mean().item(),
                escapes=bool(miss.any()),
            )
        )
    return figures


# ---------------------------------------------------------------- figures
@dataclass(frozen=True)
class Audit:
    """One signal's figures on n triples."""

    n: int
    above: float
    """Fraction of triples with score(right) > score(wrong) (a tie is not above)."""
    above_interval: tuple[float, float]
    ties: int
    """Triples with score(right) == score(wrong)."""
    margin: float
    """Mean of score(right) - score(wrong)."""
    margin_interval: tuple[float, float]


def bootstrap_means(
    values: torch.Tensor, resamples: int = RESAMPLES, seed: int = SEED
) -> torch.Tensor:
    """The means of `resamples` resamples of `values` ([n] or [n, k], resampled along n, with
    replacement), float64 [resamples] or [resamples, k]."""
    n = values.shape[0]
    generator = torch.Generator().manual_seed(seed)
    index = torch.randint(0, n, (resamples, n), generator=generator)  # [R, n]
    return values.double()[index].mean(1)  # [R] or [R, k]


def percentile_interval(means: torch.Tensor, level: float = LEVEL) -> torch.Tensor:
    """The percentile method's interval of bootstrap statistics [R, ...]: [2, ...] (low, high)."""
    tail = (1.0 - level) / 2
    return torch.quantile(means, torch.tensor([tail, 1.0 - tail], dtype=means.dtype), dim=0)


def audit(
    right: torch.Tensor, wrong: torch.Tensor, resamples: int = RESAMPLES, seed: int = SEED
) -> Audit:
    """One signal's figures from its scores of the right and the wrong answers, [n] each."""
    if right.shape != wrong.shape or right.ndim != 1 or right.numel() == 0:
        raise ValueError(
            f"expected two score vectors of one length n >= 1, got {right.shape} and {wrong.shape}"
        )
    right, wrong = right.double(), wrong.double()
    above = (right > wrong).double()  # [n]
    margin = right - wrong  # [n]
    paired = torch.stack([above, margin], dim=1)  # [n, 2]: one resample serves both
    low, high = percentile_interval(bootstrap_means(paired, resamples, seed))  # [2] each
    return Audit(
        n=right.numel(),
        above=above.mean().item(),
        above_interval=(low[0].item(), high[0].item()),
        ties=int((right == wrong).sum()),
        margin=margin.mean().item(),
        margin_interval=(low[1].item(), high[1].item()),
    )
