"""Evaluation on the OOD benchmarks (paper §4.1 "Metrics", appendix B, SPEC §7): which items are
scored, how one response is scored, and the per-benchmark and per-task results.

Pure functions of records and responses (no model here: `evaluate.py` generates). Scoring uses
`psyrl.core.text` and the format check of `psyrl.rl.rewards`, the definitions training uses:
  F1           token-set F1 of the extracted answer to the gold answer text (eq. 4-5);
  F1-accuracy  the option of highest F1 to the extracted answer is the choice; a tie at the top
  (all-zero and
               duplicate options included) is `E`, "not applicable", and counts wrong;
  format       eq. 6 (the exact tag layout of the prompt mode).
StimuliQA-format files have no options: F1 and format only, grouped by `subdimension` (Table 2
layout).

Beside the paper's metrics (issue 41 item 6, `psyrl evaluate --accuracy`, `--choose-by`): a row may
carry `accuracy/<signal>` (an accuracy signal in [0, 1] of the extracted answer to the gold text)
and, when options are chosen by similarity, `option_similarity` with the choice and correctness
that follow from it. The recipe computes them; here they are summarised and can be taken off again.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from psyrl.core.errors import PsyrlError
from psyrl.core.records import BenchmarkRecord, DataError, StimuliRecord, load_records, read_jsonl
from psyrl.core.text import choice_of, extract_answer, format_reward, option_scores, token_f1

# Table 3, in its column order
PAPER_BENCHMARKS = ("tombench", "simpletom", "socialiqa", "cosmosqa", "bbh")
EXTRA_BENCHMARKS = ("emobench",)  # StimuliQA-like, not one of the paper's benchmarks
DISPLAY_NAMES = {
    "tombench": "ToMbench",
    "simpletom": "SimpleToM",
    "socialiqa": "SocialIQa",
    "cosmosqa": "CosmosQA",
    "bbh": "BIG-Bench Hard",
    "emobench": "EmoBench",
}
HALVES = ("all", "selftrain", "eval")
SIGNAL_PREFIX = "accuracy/"  # a row's and a summary's key of an accuracy signal beside the paper's


class EvalError(PsyrlError, ValueError):
    """Bad evaluation input: an unknown benchmark, a bad predictions file, settings that do not
    match a resume."""


@dataclass(frozen=True)
class Source:
    """One evaluated file."""

    name: str
    """The results' label: the benchmark name of a benchmark-schema file, `<folder>/<stem>` of a
    StimuliQA file."""
    path: Path
    schema: str
    """`benchmark` (multiple choice: F1 and F1-accuracy) or `stimuliqa` (F1 and format, by
    subdimension)."""
    records: tuple


def resolve_sources(specs: Sequence[str], benchmark_dir: str | Path) -> list[Source]:
    """Benchmark names (`tombench`, …, `emobench`: `<benchmark_dir>/<name>/*.jsonl`) or paths to
    JSONL files in the benchmark or StimuliQA schema, every line validated; item ids must be unique
    over all of them."""
    known = PAPER_BENCHMARKS + EXTRA_BENCHMARKS
    sources, first_source_of = [], {}
    for spec in dict.fromkeys(specs):  # a name given twice is evaluated once
        if spec in known:
            files = sorted((Path(benchmark_dir) / spec).glob("*.jsonl"))
            if len(files) != 1:
                # none: a --benchmark-dir without it; the shipped ones can be copied there
                copy = (
                    "; `psyrl data benchmarks --out DIR` copies psyrl's into DIR"
                    if not files
                    else ""
                )
                raise EvalError(
                    f"{Path(benchmark_dir) / spec}: expected exactly one .jsonl file, found "
                    f"{len(files)}{copy}"
                )
            path = files[0]
        elif spec.endswith(".jsonl") or Path(spec).is_file():
            path = Path(spec)
        else:
            raise EvalError(
                f"unknown benchmark {spec!r}: expected one of {', '.join(known)}, or the path of a "
                "JSONL file in the benchmark or StimuliQA schema"
            )
        records = load_records(path)  # DataError: file:line of every bad line
        if isinstance(records[0], StimuliRecord):
            schema, name = "stimuliqa", f"{path.parent.name}/{path.stem}"
        else:
            schema, name = "benchmark", records[0].benchmark
            others = sorted({r.benchmark for r in records} - {name})
            if others:
                raise DataError(
                    f"{path}: one benchmark per file expected; it holds {name!r} and {others}"
                )
        if any(s.name == name for s in sources):
            raise EvalError(
                f"{path}: a second source named {name!r} (rename the file or its benchmark field)"
            )
        for r in records:
            if r.id in first_source_of:
                raise EvalError(f"{path}: item id {r.id!r} is also in {first_source_of[r.id]}")
            first_source_of[r.id] = path
        sources.append(Source(name, path, schema, tuple(records)))
    if not sources:
        raise EvalError("no benchmark to evaluate")
    return sources


def _unit_hash(text: str) -> float:
    """A stable number in [0, 1) from a string (sha256: the same on every machine and Python)."""
    return int(hashlib.sha256(text.encode("utf-8")).hexdigest()[:16], 16) / 2**64


def half_of(item_id: str, seed: int) -> str:
    """SPEC §8: `selftrain` or `eval`, by a seeded hash of the item id (an item's half never depends
    on the others)."""
    return "selftrain" if _unit_hash(f"half:{seed}:{item_id}") < 0.5 else "eval"


def item_seed(seed: int, item_id: str) -> int:
    """The sampling seed of one item: its draws do not depend on the rank, batch, --limit or resume
    it runs in."""
    return int(hashlib.sha256(f"item:{seed}:{item_id}".encode()).hexdigest()[:15], 16)


def task_of(record: BenchmarkRecord | StimuliRecord) -> str:
    """The per-task group: a benchmark's `task`, a StimuliQA record's `subdimension` (Table 2)."""
    return record.task if isinstance(record, BenchmarkRecord) else record.subdimension


def select_items(records: Sequence, limit: int, half: str, seed: int) -> list:
    """The items of one source that are evaluated, in file order: those of `half` (`all`,
    `selftrain`, `eval`), then at most `limit` per task (0: no limit), picked by a seeded hash of
    the id (the same items for any order)."""
    if half not in HALVES:
        raise EvalError(f"unknown split {half!r}: expected one of {', '.join(HALVES)}")
    kept = [r for r in records if half == "all" or half_of(r.id, seed) == half]
    if limit <= 0:
        return kept
    by_task: dict[str, list] = {}
    for r in kept:
        by_task.setdefault(task_of(r), []).append(r)
    chosen = {
        r.id
        for group in by_task.values()
        for r in sorted(group, key=lambda r: _unit_hash(f"limit:{seed}:{r.id}"))[:limit]
    }
    return [r for r in kept if r.id in chosen]


def score_response(
    record: BenchmarkRecord | StimuliRecord,
    source: str,
    response: str,
    tokens: int,
    finish: str,
    mean_logprob: float,
    mode: str,
) -> dict:
    """One row of predictions.jsonl without the prompt: the extracted answer, F1 to the gold text,
    format (eq. 6), and for multiple-choice records the per-option F1, the choice (0-based option
    index; null = E) and correctness."""
    extracted = extract_answer(response)
    row = {
        "id": record.id,
        "benchmark": source,
        "task": task_of(record),
        "index": record.meta.get("source_index") if isinstance(record, BenchmarkRecord) else None,
        "response": response,
        "extracted": extracted,
        "f1": token_f1(extracted, record.answer),
        "format": format_reward(response, mode),
        "tokens": tokens,
        "finish": finish,
        "mean_logprob": mean_logprob,
        "option_f1": None,
        "choice": None,
        "correct": None,
    }
    if isinstance(record, BenchmarkRecord):
        row["option_f1"] = option_scores(extracted, record.options)
        row["choice"] = choice_of(row["option_f1"])
        row["correct"] = row["choice"] == record.answer_index
    return row


def choose_by_scores(row: dict, record: BenchmarkRecord, scores: Sequence[float]) -> None:
    """`--choose-by similarity`: the row's choice is the option of highest similarity to the
    extracted answer, by SPEC §7's rule otherwise (a tie at the top, or a top of 0, is E)."""
    row["option_similarity"] = list(scores)
    row["choice"] = choice_of(row["option_similarity"])
    row["correct"] = row["choice"] == record.answer_index


def paper_row(row: dict, record: BenchmarkRecord | StimuliRecord) -> dict:
    """The row as the paper scores it: no accuracy signal, the choice of highest F1 (a resumed
    evaluation scores its earlier rows again with this run's options). A row of the paper's scoring
    comes back equal."""
    row = {
        k: v for k, v in row.items() if k != "option_similarity" and not k.startswith(SIGNAL_PREFIX)
    }
    if isinstance(record, BenchmarkRecord) and row.get("option_f1") is not None:
        row["choice"] = choice_of(row["option_f1"])
        row["correct"] = row["choice"] == record.answer_index
    return row


def summarize(rows: Sequence[dict]) -> dict:
    """F1 ×100, accuracy % (None without options), count, E choices, format-compliance %, mean
    response tokens; then, when the rows carry them, each accuracy signal's mean ×100
    (`accuracy/<name>`) and `choose_by: similarity` when that chose the options."""
    n = len(rows)
    multiple_choice = all(r["correct"] is not None for r in rows)
    summary = {
        "count": n,
        "f1": 100 * sum(r["f1"] for r in rows) / n,
        "accuracy": 100 * sum(bool(r["correct"]) for r in rows) / n if multiple_choice else None,
        "not_applicable": sum(r["choice"] is None for r in rows) if multiple_choice else None,
        "format": 100 * sum(r["format"] for r in rows) / n,
        "length": sum(r["tokens"] for r in rows) / n,
    }
    for key in (k for k in rows[0] if k.startswith(SIGNAL_PREFIX)):
        summary[key] = 100 * sum(r[key] for r in rows) / n
    if multiple_choice and "option_similarity" in rows[0]:
        summary["choose_by"] = "similarity"
    return summary


def aggregate(rows: Sequence[dict]) -> dict:
    """{benchmark: {**summary, "tasks": {task: summary}}}, benchmarks and tasks in first-seen
    order."""
    grouped: dict[str, dict[str, list]] = {}
    for r in rows:
        grouped.setdefault(r["benchmark"], {}).setdefault(r["task"], []).append(r)
    return {
        name: {
            **summarize([r for group in tasks.values() for r in group]),
            "tasks": {task: summarize(group) for task, group in tasks.items()},
        }
        for name, tasks in grouped.items()
    }


def read_predictions(path: str | Path, tolerate_torn_end: bool = False) -> tuple[list[dict], int]:
    """(rows, dropped) of a predictions.jsonl. A bad line is an EvalError with file:line, except,
    when `tolerate_torn_end`, a last line cut short by a crash (no newline at its end): it is
    dropped and counted."""
    path = Path(path)
    if not path.is_file():
        raise EvalError(f"{path}: no such predictions file")
    torn = [] if tolerate_torn_end else None
    try:
        numbered = read_jsonl(path, _prediction_row, torn=torn)
    except DataError as e:
        raise EvalError(str(e)) from None
    return [row for _, row in numbered], len(torn or ())


def _prediction_row(row) -> dict:
    keys = {"id", "benchmark", "task", "f1", "format", "tokens"}
    if not isinstance(row, dict) or not keys <= row.keys():
        raise ValueError(
            "not a prediction row (keys id, benchmark, task, f1, format, tokens expected)"
        )
    return row
