"""Records, validation and ordering of the data (SPEC §6): StimuliQA and the benchmark schema.

Every loader validates every line before returning anything: a file with bad lines raises one
`DataError` listing `file:line: what was wrong` and never trains silently on the rest. The §4.1
split rule (`split_by_variable`), the SFT target (`sft_target`) and the seeded, resumable example
order (`Cursor`, `next_indices`) live here; nothing re-implements them.
"""

from __future__ import annotations

import dataclasses
import json
import random
import typing
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from psyrl.core.atomic import write_text
from psyrl.core.config import DataConfig
from psyrl.core.errors import PsyrlError
from psyrl.core.text import ANSWER_CLOSE, ANSWER_OPEN, THINK_CLOSE, THINK_OPEN

# paper §3.1 and Table 2; the subdimension -> dimension pairing is psyrl's reading (the paper lists
# both, not the map)
SUBDIMENSIONS: dict[str, str] = {
    "specific emotions": "emotional reactions",
    "targeted emotions": "emotional reactions",
    "direction of change": "narrative transformation",
    "self identification": "narrative transformation",
    "needs fulfilment": "collective psychology",
    "national theme": "collective psychology",
}
DIMENSIONS: tuple[str, ...] = (
    "emotional reactions",
    "narrative transformation",
    "collective psychology",
)
MAX_REPORTED_ERRORS = 20


class DataError(PsyrlError, ValueError):
    """A data file a run cannot use; the message lists `file:line: problem` for every bad line (up
    to 20)."""


@dataclass(frozen=True)
class StimuliRecord:
    """One StimuliQA item (SPEC §6). SFT needs only stimuli, question, answer (+ reasoning in `cot`
    mode)."""

    id: str
    stimuli: str
    question: str
    answer: str
    variable: str = ""
    """The psychological variable's code (e.g. `B_disap`); "" when unlabelled (SFT-only sets)."""
    dimension: str = ""
    subdimension: str = ""
    reasoning: str | None = None
    """A step-by-step rationale without the answer (appendix B's reasoning samples, `psyrl build
    reasoning`): the `cot` SFT target's think text by default (data.think_from)."""
    reason: str | None = None
    """The generator's `Reason:` line ("Explain why the answer is correct", appendix A.1's dataset
    prompt), kept by `psyrl build qa` / `comparison`; the think text with data.think_from =
    "reason". Left out of the written JSON when None (files without it are as before)."""


@dataclass(frozen=True)
class BenchmarkRecord:
    """One multiple-choice item in the benchmark schema of `data/benchmarks/README.md`."""

    id: str
    benchmark: str
    task: str
    context: str
    question: str
    options: tuple[str, ...]
    answer_index: int
    answer: str
    meta: dict = field(default_factory=dict)


def stimulus_and_question(record: StimuliRecord | BenchmarkRecord) -> tuple[str, str]:
    """What an accuracy signal (the judge) reads beside the two answers: a StimuliQA record's
    stimuli or a benchmark item's context, and its question."""
    stimulus = record.context if isinstance(record, BenchmarkRecord) else record.stimuli
    return stimulus, record.question


# ---------------------------------------------------------------- validation of one JSON object
# (key, type, may be empty); a type of `tuple` means a JSON list of strings
_STIMULI_KEYS = {
    "id": (str, False),
    "stimuli": (str, False),
    "question": (str, False),
    "answer": (str, False),
}
# SPEC §6: SFT needs only stimuli, question, answer (+ reasoning); the labels group evaluation
# results
_STIMULI_OPTIONAL = {
    "variable": (str, True),
    "dimension": (str, True),
    "subdimension": (str, True),
    "reasoning": (str, True),
    "reason": (str, True),
}
# optional record fields added after files were written: left out when None, so those files stay
# byte for byte what they were (data/demo)
_OMIT_WHEN_NONE = ("reason",)
_BENCHMARK_KEYS = {
    "id": (str, False),
    "benchmark": (str, False),
    "task": (str, True),
    "context": (str, True),
    "question": (str, False),
    "options": (tuple, False),
    "answer_index": (int, False),
    "answer": (str, False),
}
_BENCHMARK_OPTIONAL = {"meta": (dict, True)}
_TYPE_NAMES = {str: "a string", int: "an integer", tuple: "a list of strings", dict: "an object"}


def _check_keys(obj, required: dict, optional: dict) -> list[str]:
    if not isinstance(obj, dict):
        return [f"expected a JSON object, got {type(obj).__name__}"]
    problems = [f"missing key {k!r}" for k in required if k not in obj]
    problems += [
        f"unknown key {k!r} (expected {', '.join(list(required) + list(optional))})"
        for k in obj
        if k not in required and k not in optional
    ]
    for key, (kind, may_be_empty) in {**required, **optional}.items():
        if key not in obj or (key in optional and obj[key] is None):
            continue
        value = obj[key]
        ok = (
            (isinstance(value, list) and all(isinstance(v, str) for v in value))
            if kind is tuple
            else (isinstance(value, kind) and not (kind is int and isinstance(value, bool)))
        )
        if not ok:
            problems.append(
                f"key {key!r}: expected {_TYPE_NAMES[kind]}, got {json.dumps(value)[:60]}"
            )
        elif (
            not may_be_empty
            and kind in (str, tuple)
            and not (value.strip() if kind is str else value)
        ):
            problems.append(f"key {key!r}: must not be empty")
    return problems


def stimuli_record(obj) -> StimuliRecord:
    """Validate one decoded JSON line as a StimuliQA record; raises ValueError naming every
    problem."""
    problems = _check_keys(obj, _STIMULI_KEYS, _STIMULI_OPTIONAL)
    if not problems:
        if obj.get("dimension") and obj["dimension"] not in DIMENSIONS:
            problems.append(
                f"key 'dimension': {obj['dimension']!r} is not one of {', '.join(DIMENSIONS)}"
            )
        if obj.get("subdimension") and obj["subdimension"] not in SUBDIMENSIONS:
            problems.append(
                f"key 'subdimension': {obj['subdimension']!r} is not one of "
                f"{', '.join(SUBDIMENSIONS)}"
            )
    if problems:
        raise ValueError("; ".join(problems))
    labels = {k: obj.get(k) or "" for k in ("variable", "dimension", "subdimension")}
    return StimuliRecord(**{**obj, **labels})


def benchmark_record(obj) -> BenchmarkRecord:
    """Validate one decoded JSON line as a benchmark record; raises ValueError naming every
    problem."""
    problems = _check_keys(obj, _BENCHMARK_KEYS, _BENCHMARK_OPTIONAL)
    if not problems:
        options, index = obj["options"], obj["answer_index"]
        if len(options) < 2:
            problems.append(f"key 'options': expected at least 2 options, got {len(options)}")
        elif any(not o.strip() for o in options):
            problems.append("key 'options': an option is empty")
        elif not 0 <= index < len(options):
            problems.append(
                f"key 'answer_index': {index} is out of range for {len(options)} options"
            )
        elif obj["answer"] != options[index]:
            problems.append(
                f"key 'answer': {obj['answer']!r} != options[{index}] = {options[index]!r}"
            )
    if problems:
        raise ValueError("; ".join(problems))
    return BenchmarkRecord(
        **{**obj, "options": tuple(obj["options"]), "meta": obj.get("meta") or {}}
    )


# ---------------------------------------------------------------- files
def _decode(line: bytes):
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"not valid UTF-8 (byte {e.start + 1} of the line)") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"invalid JSON ({e.msg} at column {e.colno})") from None


def read_jsonl(
    path: str | Path, parse=None, bad: list | None = None, torn: list | None = None
) -> list[tuple[int, object]]:
    """(line number, value) of every non-blank line of a JSONL file, UTF-8 (a byte-order mark is
    dropped), each value through `parse` when given (a function raising ValueError on a value it
    refuses). A bad line (not UTF-8, not JSON, refused) raises a DataError `path:line: problem`,
    unless a list takes it as (line, problem) and it is left out: `bad` takes every bad line, `torn`
    only a bad last line without its newline (a write a crash cut short: what the crash-recovery
    readers tolerate)."""
    numbered = []
    with Path(path).open("rb") as f:
        for lineno, line in enumerate(f, start=1):
            if lineno == 1 and line.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte-order mark
                line = line[3:]
            if not line.strip():
                continue
            try:
                value = _decode(line)
                numbered.append((lineno, value if parse is None else parse(value)))
            except ValueError as e:  # only the last line can lack its newline
                sink = torn if torn is not None and not line.endswith(b"\n") else bad
                if sink is None:
                    raise DataError(f"{path}:{lineno}: {e}") from None
                sink.append((lineno, str(e)))
    return numbered


def raise_line_errors(path: Path, errors: list[str], what: str = "line(s)") -> None:
    """A DataError listing the first 20 `file:line: problem` messages, if there are any."""
    if errors:
        shown = errors[:MAX_REPORTED_ERRORS]
        more = f"\n... and {len(errors) - len(shown)} more" if len(errors) > len(shown) else ""
        raise DataError(
            f"{path}: {len(errors)} bad {what}, nothing loaded:\n" + "\n".join(shown) + more
        )


def parse_numbered(
    path: Path,
    numbered: Iterable[tuple[int, object]],
    parse,
    what: str = "line(s)",
    bad: Sequence[tuple[int, str]] = (),
) -> list:
    """parse(x) for every (line number, x), each record's `id` unique; a DataError lists every bad
    one, the (line, problem) pairs of `bad` (lines read_jsonl could not decode) in their place."""
    records, errors, first_line_of = [], list(bad), {}
    for lineno, item in numbered:
        try:
            record = parse(item)
        except ValueError as e:
            errors.append((lineno, str(e)))
            continue
        if record.id in first_line_of:
            first = first_line_of[record.id]
            errors.append((lineno, f"duplicate id {record.id!r} (first on line {first})"))
            continue
        first_line_of[record.id] = lineno
        records.append(record)
    errors.sort(key=lambda error: error[0])  # stable: a line has one problem at most
    raise_line_errors(path, [f"{path}:{n}: {problem}" for n, problem in errors], what)
    return records


# what a missing file's message adds: the commands that make one of that format
MAKE = {
    "stimuliqa": "; make one with `psyrl build qa ...` (from labelled stimuli: docs/data.md) or "
    "`psyrl data convert SOURCE --to stimuliqa ...` (from your own table or dataset)",
    "benchmark": "; make one with `psyrl data convert SOURCE --to benchmark ...`",
    "any": "; `psyrl data convert --help` makes one from your own table or dataset",
}


def _read(
    path: str | Path, kind: str = "any"
) -> tuple[Path, list[tuple[int, object]], list[tuple[int, str]]]:
    """(path, its decoded lines, its undecodable lines) of a data file that exists."""
    path = Path(path)
    if not path.is_file():
        made = MAKE[kind]
        if path.parent.name == "demo":  # the tiny presets read data/demo/ of the working directory
            made = f"; write the synthetic demo set with `psyrl demo-data --out {path.parent}`"
        raise DataError(f"{path}: no such data file{made}")
    bad = []
    return path, read_jsonl(path, bad=bad), bad


def _records(path: Path, numbered: list, bad: list, parse) -> list:
    records = parse_numbered(path, numbered, parse, bad=bad)
    if not records:
        raise DataError(f"{path}: the file holds no records")
    return records


def load_stimuliqa(path: str | Path) -> list[StimuliRecord]:
    """All records of a StimuliQA JSONL file, or a DataError listing every bad line."""
    return _records(*_read(path, "stimuliqa"), stimuli_record)


def load_benchmark(path: str | Path) -> list[BenchmarkRecord]:
    """All records of a benchmark-schema JSONL file, or a DataError listing every bad line."""
    return _records(*_read(path, "benchmark"), benchmark_record)


def load_records(path: str | Path) -> list[StimuliRecord] | list[BenchmarkRecord]:
    """A StimuliQA or benchmark file, whichever its first record is (a `stimuli` or an `options`
    key); every line validated."""
    path, numbered, bad = _read(path)
    if bad and (not numbered or bad[0][0] < numbered[0][0]):  # the first line is no JSON: no schema
        raise DataError(f"{path}:{bad[0][0]}: {bad[0][1]}")
    if not numbered:
        raise DataError(f"{path}: the file holds no records")
    lineno, first = numbered[0]
    if isinstance(first, dict) and "stimuli" in first:
        return _records(path, numbered, bad, stimuli_record)
    if isinstance(first, dict) and "options" in first:
        return _records(path, numbered, bad, benchmark_record)
    raise DataError(
        f"{path}:{lineno}: neither a StimuliQA record (no 'stimuli' key) nor a "
        "benchmark record (no 'options' key)"
    )


def write_jsonl(path: str | Path, records: Iterable) -> None:
    """One JSON object per line, fields in dataclass order, UTF-8; written to a temporary file then
    renamed."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    lines = []
    for r in records:
        if dataclasses.is_dataclass(r):
            obj = {
                k: v
                for k, v in dataclasses.asdict(r).items()
                if not (k in _OMIT_WHEN_NONE and v is None)
            }
        else:
            obj = dict(r)
        lines.append(
            json.dumps(
                {k: list(v) if isinstance(v, tuple) else v for k, v in obj.items()},
                ensure_ascii=False,
            )
            + "\n"
        )
    write_text(path, "".join(lines))


# ---------------------------------------------------------------- SFT target (SPEC §6)
# data.think_from's values: the field holding the `cot` think text
THINK_SOURCES = typing.get_args(typing.get_type_hints(DataConfig)["think_from"])


def sft_target(record: StimuliRecord, mode: str, think_from: str = "reasoning") -> str | None:
    """The assistant text SFT teaches: `cot` -> think + answer tags, the think text taken from the
    record's `think_from` field (None when it has none), `direct` -> answer tag."""
    if mode == "direct":
        return f"{ANSWER_OPEN}{record.answer}{ANSWER_CLOSE}"
    if mode != "cot":
        raise ValueError(f"unknown prompt mode {mode!r}; expected 'cot' or 'direct'")
    if think_from not in THINK_SOURCES:
        raise ValueError(f"unknown think source {think_from!r}; expected one of {THINK_SOURCES}")
    think = getattr(record, think_from)
    if think is None or not think.strip():
        return None
    return f"{THINK_OPEN}{think}{THINK_CLOSE}{ANSWER_OPEN}{record.answer}{ANSWER_CLOSE}"


# ---------------------------------------------------------------- split rule (paper §4.1)
@dataclass(frozen=True)
class VariableSplit:
    train: list
    test: list
    excluded: dict[str, int]
    """variable -> item count, for variables under the minimum (the paper drops C_acol, C_agov,
    C_anet, C_apol)."""


def split_by_variable(
    records: Sequence, n_train: int, n_test: int, seed: int, min_count: int | None = None
) -> VariableSplit:
    """Paper §4.1: per variable a seeded sample of n_train train and n_test test items (200/100 in
    the paper); variables with fewer than `min_count` items (default n_train + n_test) are excluded
    and listed."""
    if n_train < 0 or n_test < 0:
        raise ValueError(f"n_train and n_test must be >= 0, got {n_train}, {n_test}")
    min_count = n_train + n_test if min_count is None else min_count
    by_variable: dict[str, list] = {}
    for r in records:
        by_variable.setdefault(r.variable, []).append(r)
    train, test, excluded = [], [], {}
    for variable in sorted(by_variable):
        items = by_variable[variable]
        if len(items) < min_count:
            excluded[variable] = len(items)
            continue
        order = list(range(len(items)))
        # str seeds hash with sha512: stable across runs
        random.Random(f"split:{seed}:{variable}").shuffle(order)
        n_tr = min(n_train, len(items))
        train += [items[i] for i in sorted(order[:n_tr])]
        test += [items[i] for i in sorted(order[n_tr : n_tr + n_test])]
    return VariableSplit(train, test, excluded)


# ---------------------------------------------------------------- seeded, resumable order
@dataclass
class Cursor:
    """Where a run is in its stream of examples: a fresh seeded permutation per epoch; saved in
    checkpoints."""

    epoch: int = 0
    position: int = 0


def epoch_permutation(n: int, seed: int, epoch: int, shuffle: bool = True) -> list[int]:
    order = list(range(n))
    if shuffle:
        random.Random(f"order:{seed}:{epoch}").shuffle(order)
    return order


def next_indices(
    cursor: Cursor, n: int, count: int, seed: int, shuffle: bool = True
) -> tuple[list[int], Cursor]:
    """The next `count` example indices of a data set of size n (crossing epochs), and the advanced
    cursor."""
    if n <= 0:
        raise ValueError("cannot draw examples from an empty data set")
    indices, epoch, position = [], cursor.epoch, cursor.position
    while len(indices) < count:
        order = epoch_permutation(n, seed, epoch, shuffle)
        take = order[position : position + count - len(indices)]
        indices += take
        position += len(take)
        if position >= n:
            epoch, position = epoch + 1, 0
    return indices, Cursor(epoch, position)
