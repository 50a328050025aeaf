"""Continual self-training (paper §3.3, appendix B "Continual Learning Module", SPEC §8).

    self_train(x) <=> valid(x) and confidence(x) > tau

valid = format compliant (eq. 6); confidence = the F1 of the extracted answer to its best-matching
option (the paper's, tau = 0.4) or, as a second option, the geometric-mean token probability
exp(mean log p) of the response under the sampler. A kept prediction's answer is replaced by that
option's text (a seeded random one of the tied options on an E tie) and becomes a StimuliQA record
that `train_sft.py` takes as it is; in `cot` mode the model's own <think> text is its reasoning. The
gold answers are never read: only each item's context, question and options.

The paper self-trained on the validation items it then reported (transductive). psyrl labels the
`selftrain` half of a benchmark (`evaluate.py --split selftrain`) and reports on the `eval` half.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence

from psyrl.core.prompts import question_text
from psyrl.core.records import BenchmarkRecord, StimuliRecord
from psyrl.core.text import option_scores, think_text
from psyrl.eval.benchmarks import EvalError

CONFIDENCES = ("f1", "logprob")
PAPER_TAU = 0.4


def relabel(scores: Sequence[float], rng: random.Random) -> int | None:
    """The best-matching option; a random one of the tied best on an E tie; None when no option
    matches at all."""
    top = max(scores)
    if top == 0.0:
        return None
    tied = [i for i, s in enumerate(scores) if s == top]
    return tied[0] if len(tied) == 1 else rng.choice(tied)


def confidence_of(scores: Sequence[float], mean_logprob: float, confidence: str) -> float:
    """`f1`: the best option's F1 to the extracted answer; `logprob`: exp(mean token
    log-probability), in (0, 1]."""
    if confidence == "f1":
        return max(scores)
    if confidence == "logprob":
        return math.exp(mean_logprob)
    raise EvalError(f"unknown confidence {confidence!r}: expected one of {', '.join(CONFIDENCES)}")


def _unlabelled(record: BenchmarkRecord) -> BenchmarkRecord:
    """The record without its gold answer, so that nothing below can read it."""
    return dataclasses.replace(record, answer_index=-1, answer="")


EVALUATION_ONLY = ("tombench",)  # ToMbench's licence: "Use ToMBench for evaluation purposes only"


def self_label(
    rows: Sequence[dict],
    records: Mapping[str, BenchmarkRecord],
    tau: float = PAPER_TAU,
    confidence: str = "f1",
    seed: int = 0,
    mode: str = "cot",
    options: str = "paper",
    include_evaluation_only: bool = False,
) -> tuple[list[StimuliRecord], dict[str, int]]:
    """(the SFT records, counts) from prediction rows (`psyrl.eval.benchmarks.score_response` rows,
    in any order) and the benchmark records they answer (by id). Counts: predictions, kept, and why
    the others were dropped. Items of evaluation-only benchmarks (ToMbench) are left out unless
    `include_evaluation_only`; items without a context are left out (a StimuliQA record needs its
    stimuli)."""
    counts = {
        "predictions": len(rows),
        "kept": 0,
        "evaluation_only": 0,
        "no_context": 0,
        "format_invalid": 0,
        "low_confidence": 0,
        "no_matching_option": 0,
    }
    kept = []
    for row in rows:
        if row["id"] not in records:
            raise EvalError(
                f"prediction {row['id']!r} has no benchmark record (a predictions file of other "
                "data?)"
            )
        record = _unlabelled(records[row["id"]])
        if record.benchmark in EVALUATION_ONLY and not include_evaluation_only:
            counts["evaluation_only"] += 1
            continue
        if not record.context.strip():
            counts["no_context"] += 1
            continue
        if row["format"] != 1.0:
            counts["format_invalid"] += 1
            continue
        if confidence == "logprob" and row.get("mean_logprob") is None:
            raise EvalError(
                f"prediction {row['id']!r} has no mean_logprob (an --engine openai run: APIs "
                "return no log-probs here); use --confidence f1"
            )
        # recomputed: the file's own copy is not trusted
        scores = option_scores(row["extracted"], record.options)
        if not confidence_of(scores, row["mean_logprob"], confidence) > tau:
            counts["low_confidence"] += 1
            continue
        choice = relabel(scores, random.Random(f"relabel:{seed}:{record.id}"))  # per item
        if choice is None:
            counts["no_matching_option"] += 1
            continue
        reasoning = think_text(row["response"]) if mode == "cot" else None
        kept.append(
            StimuliRecord(
                id=f"self/{record.id}",
                stimuli=record.context,
                question=question_text(record, options),
                answer=record.options[choice],
                variable=f"{record.benchmark}/{record.task}" if record.task else record.benchmark,
                reasoning=reasoning.strip() if reasoning else None,
            )
        )
        counts["kept"] += 1
    return kept, counts
