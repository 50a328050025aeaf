"""`psyrl data convert`: a table a user already has into psyrl's two data formats (SPEC §6).

Sources: a Hugging Face `datasets` save_to_disk directory, parquet, CSV/TSV, JSONL (or a `.json`
array) and chat JSONL (one user/assistant exchange per line). `--map` names the source column of
each field; every row is checked by the validators of `psyrl.core.records` and every problem is
reported as `source:line` (or `source: row N`), column, what was expected. The written file is
loaded back with `load_stimuliqa` / `load_benchmark` before it is renamed into place.

Parquet and `datasets` directories are read with pyarrow alone (`pip install -e '.[data]'`):
save_to_disk writes Arrow IPC streams listed in its state.json, so `datasets` and its pandas are not
needed to read them.
"""

from __future__ import annotations

import json
import math
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from psyrl.core.atomic import temporary
from psyrl.core.errors import PsyrlError
from psyrl.core.records import (
    DataError,
    benchmark_record,
    load_benchmark,
    load_stimuliqa,
    raise_line_errors,
    stimuli_record,
    write_jsonl,
)
from psyrl.dataset.labelled import csv_rows, json_rows

KINDS = ("datasets", "parquet", "csv", "jsonl", "chat")
TARGETS = ("stimuliqa", "benchmark")
SUFFIXES = {
    ".parquet": "parquet",
    ".csv": "csv",
    ".tsv": "csv",
    ".jsonl": "jsonl",
    ".json": "jsonl",
}
# the --map keys each target takes
TARGET_KEYS = {
    "stimuliqa": (
        "id",
        "stimuli",
        "question",
        "answer",
        "options",
        "answer_index",
        "variable",
        "dimension",
        "subdimension",
        "reasoning",
        "reason",
    ),
    "benchmark": ("id", "stimuli", "question", "answer", "options", "answer_index", "task", "meta"),
}
# keys whose null cell means "not given" rather than a bad row
OPTIONAL = {
    "stimuliqa": {"variable", "dimension", "subdimension", "reasoning", "reason"},
    "benchmark": {"stimuli", "task", "meta"},
}
# the columns of a chat source besides the line's other top-level keys
CHAT_COLUMNS = ("system", "user", "assistant", "user_context", "user_question")
INSTALL_HINT = "pip install -e '.[data]' (or: pip install 'pyarrow>=15')"


class ConvertError(PsyrlError, ValueError):
    """A conversion that cannot start: a bad --map, an existing --out, a missing dependency."""


@dataclass(frozen=True)
class Source:
    """A source table read whole: its columns and its rows, each with its 1-based number."""

    path: Path
    kind: str
    columns: tuple[str, ...]
    rows: list[tuple[int, dict]]
    """(line number for csv/jsonl/chat, else row number; {column: value})."""

    def where(self, n: int) -> str:
        """`file:line` for text files, `file: row N` for tables (a binary file has no lines)."""
        lines = self.kind in ("csv", "jsonl", "chat")
        return f"{self.path}:{n}" if lines else f"{self.path}: row {n}"


# ---------------------------------------------------------------- reading a source
def detect_kind(path: Path) -> str:
    """datasets for a save_to_disk directory, else from the suffix (chat is told from the lines)."""
    if path.is_dir():
        if (path / "state.json").is_file():
            return "datasets"
        if (path / "dataset_dict.json").is_file():
            splits = json.loads((path / "dataset_dict.json").read_text(encoding="utf-8"))
            names = ", ".join(splits.get("splits", [])) or "none listed"
            raise DataError(
                f"{path}: a DatasetDict (splits: {names}); give one split's "
                "directory, e.g. SOURCE/train"
            )
        raise DataError(
            f"{path}: a directory without state.json: not a datasets save_to_disk directory"
        )
    kind = SUFFIXES.get(path.suffix.lower())
    if kind is None:
        raise ConvertError(
            f"{path}: cannot tell the format from the suffix {path.suffix!r}; "
            f"pass --from ({', '.join(KINDS)})"
        )
    return kind


def read_source(path: str | Path, kind: str | None = None) -> Source:
    """Every row of a source; `kind` None detects it (a .jsonl whose first line has `messages` is
    chat)."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"{path}: no such file or directory")
    auto, kind = kind is None, kind or detect_kind(path)
    if kind in ("datasets", "parquet"):
        rows = list(enumerate(_arrow_rows(path, kind), start=1))
    elif kind == "csv":
        rows = csv_rows(path)
    else:
        rows = json_rows(path)
        bad = [
            f"{path}:{n}: expected a JSON object, got {type(row).__name__}"
            for n, row in rows
            if not isinstance(row, dict)
        ]
        raise_line_errors(path, bad, "line(s)")
        if auto and rows and "messages" in rows[0][1]:
            kind = "chat"
    if kind == "chat":
        rows = _chat_rows(path, rows)
    if not rows:
        raise DataError(f"{path}: the source holds no rows")
    seen = dict.fromkeys(CHAT_COLUMNS) if kind == "chat" else {}
    columns = tuple(dict.fromkeys([*seen, *(k for _, row in rows for k in row)]))
    return Source(path, kind, columns, rows)


def _pyarrow():
    """pyarrow, imported when a parquet file or a datasets directory is read (an optional extra)."""
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ModuleNotFoundError as e:
        if not (e.name or "").startswith("pyarrow"):
            raise
        raise ConvertError(
            f"reading parquet or a datasets directory needs pyarrow: {INSTALL_HINT}"
        ) from None
    return pyarrow


def _arrow_rows(path: Path, kind: str) -> list[dict]:
    """The rows of a parquet file or of a save_to_disk directory's shards, in order."""
    pa = _pyarrow()
    if kind == "parquet":
        files = [path]
    else:
        try:
            state = json.loads((path / "state.json").read_text(encoding="utf-8"))
            files = [path / f["filename"] for f in state["_data_files"]]
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise DataError(f"{path / 'state.json'}: not a datasets state file ({e})") from None
    tables = []
    for file in files:
        try:
            if kind == "parquet":
                tables.append(pa.parquet.read_table(file))
            else:  # save_to_disk shards are Arrow IPC streams, not files
                with pa.memory_map(str(file)) as stream:
                    tables.append(pa.ipc.open_stream(stream).read_all())
        except (OSError, pa.ArrowException) as e:
            raise DataError(f"{file}: cannot read it as {kind} ({e})") from None
    return pa.concat_tables(tables).to_pylist() if len(tables) > 1 else tables[0].to_pylist()


def _chat_rows(path: Path, rows: list[tuple[int, dict]]) -> list[tuple[int, dict]]:
    """One exchange per line -> columns system, user, assistant, user_context, user_question."""
    flat, errors = [], []
    for n, obj in rows:
        try:
            flat.append((n, _chat_row(obj)))
        except ValueError as e:
            errors.append(f"{path}:{n}: {e}")
    raise_line_errors(path, errors, "line(s)")
    return flat


def _chat_row(obj: dict) -> dict:
    messages = obj.get("messages")
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages
    ):
        raise ValueError(
            "column 'messages': expected a list of {role, content} objects with string content"
        )
    roles = [m["role"] for m in messages]
    if roles not in (["user", "assistant"], ["system", "user", "assistant"]):
        raise ValueError(
            "column 'messages': expected one exchange (an optional system turn, one "
            f"user turn, one assistant turn), got roles {', '.join(roles) or 'none'}"
        )
    turns = {m["role"]: m["content"] for m in messages}
    # a story then its question is the usual layout: the last paragraph is the question
    parts = re.split(r"\n[ \t]*\n", turns["user"].strip())
    context, question = "\n\n".join(parts[:-1]), parts[-1]
    others = {k: v for k, v in obj.items() if k != "messages"}
    return {**others, **turns, "user_context": context, "user_question": question}


# ---------------------------------------------------------------- --map
def parse_map(texts: Sequence[str], target: str) -> dict[str, str]:
    """`KEY=COLUMN[,KEY=COLUMN...]` (repeatable) -> {key: column}; checks the keys the target
    needs."""
    if target not in TARGETS:
        raise ConvertError(f"unknown target {target!r}: expected one of {', '.join(TARGETS)}")
    allowed, mapping = TARGET_KEYS[target], {}
    for part in (p.strip() for text in texts for p in text.split(",") if p.strip()):
        key, eq, column = (s.strip() for s in part.partition("="))
        if not eq or not key or not column:
            raise ConvertError(f"--map: {part!r} is not KEY=COLUMN (e.g. question=prompt)")
        if key not in allowed:
            raise ConvertError(
                f"--map: unknown key {key!r} for --to {target} (keys: {', '.join(allowed)})"
            )
        if key in mapping:
            raise ConvertError(f"--map: {key} is given twice ({mapping[key]!r}, {column!r})")
        if "+" in column and key != "options":
            raise ConvertError(f"--map: only options joins columns with +, not {key}")
        mapping[key] = column
    needed = ["question"] + (["stimuli"] if target == "stimuliqa" else ["options"])
    missing = [k for k in needed if k not in mapping]
    if target == "stimuliqa":
        if "answer" in mapping and ({"options", "answer_index"} & mapping.keys()):
            raise ConvertError(
                "--map: --to stimuliqa takes the answer from answer=COLUMN or from "
                "options=COLUMN,answer_index=COLUMN, not both"
            )
        if "answer" not in mapping and not {"options", "answer_index"} <= mapping.keys():
            missing.append("answer")
    elif not {"answer", "answer_index"} & mapping.keys():
        missing.append("answer or answer_index")
    if missing:
        hint = (
            "; --to benchmark writes multiple-choice items: for an open-answer evaluation set "
            "convert --to stimuliqa (evaluate.py scores it by F1 and format)"
            if target == "benchmark" and "options" in missing
            else ""
        )
        raise ConvertError(
            f"--map lacks {', '.join(missing)} (--to {target} needs {_needs(target)}){hint}"
        )
    return mapping


def _needs(target: str) -> str:
    if target == "stimuliqa":
        return "question, stimuli, and answer or options + answer_index"
    return "question, options, and answer or answer_index"


def check_columns(source: Source, mapping: dict[str, str]) -> None:
    """Every mapped column exists in the source (a dotted name: its first part)."""
    for key, spec in mapping.items():
        for column in spec.split("+"):
            if column not in source.columns and column.split(".")[0] not in source.columns:
                raise ConvertError(
                    f"--map {key}={spec}: {source.path} has no column {column!r}; "
                    f"its columns: {', '.join(source.columns)}"
                )


# ---------------------------------------------------------------- one row
def _show(value) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)[:60]


def _blank(value) -> bool:
    return (
        value is None
        or (isinstance(value, str) and not value.strip())
        or (isinstance(value, float) and math.isnan(value))
    )


def _cell(row: dict, column: str):
    """The row's value of `column`; a dotted name reaches into a struct (`choices.text`)."""
    if column in row:
        return row[column]
    value = row
    for part in column.split("."):
        if not isinstance(value, dict) or part not in value:
            raise ValueError("missing from this row")
        value = value[part]
    return value


def _string(value) -> str:
    # numbers are common in id and answer columns; NaN is pandas' empty cell, not a number
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not _blank(value):
        return str(value)
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {_show(value)}")
    return value.strip()


def _options(row: dict, spec: str) -> list[str]:
    columns = spec.split("+")
    if len(columns) > 1:
        values = []
        for column in columns:
            try:
                values.append(_cell(row, column))
            except ValueError:
                raise ValueError(f"{column!r} is missing from this row") from None
        while values and _blank(values[-1]):  # rows with fewer options leave the last cells empty
            values.pop()
        return [_string(v) for v in values]
    value = _cell(row, spec)
    if isinstance(value, str):  # a CSV cell holds the list as JSON
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise ValueError(
                f"expected a list of strings (in a text cell: a JSON list such as "
                f'["yes", "no"]), got {_show(value)}'
            ) from None
    if not isinstance(value, list):
        raise ValueError(f"expected a list of strings, got {_show(value)}")
    return [_string(v) for v in value]


def _index(value) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit():
            return int(text)
        if len(text) == 1 and text in string.ascii_letters:
            return ord(text.upper()) - ord("A")
    raise ValueError(
        f"expected a 0-based option number or an option letter (A, B, ...), got {_show(value)}"
    )


def _meta(value) -> dict:
    if isinstance(value, str):  # a CSV cell holds the object as JSON
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    if not isinstance(value, dict):
        raise ValueError(f"expected an object, got {_show(value)}")
    return value


def _label(key: str, mapping: dict[str, str]) -> str:
    return f"column {mapping[key]!r} ({key})"


def row_object(
    row: dict, n: int, source: Source, target: str, mapping: dict[str, str], benchmark: str
) -> dict:
    """The output JSON object of one source row; a ValueError names the column of each problem."""
    values, problems = {}, []
    for key, column in mapping.items():
        try:
            value = _cell(row, column) if "+" not in column else None
            if key in OPTIONAL[target] and value is None and "+" not in column:
                continue
            if key == "options":
                values[key] = _options(row, column)
            elif key == "answer_index":
                values[key] = _index(value)
            elif key == "meta":
                values[key] = _meta(value)
            else:
                values[key] = _string(value)
        except ValueError as e:
            problems.append(f"{_label(key, mapping)}: {e}")
    if problems:
        raise ValueError("; ".join(problems))
    options, index, answer = values.get("options"), values.get("answer_index"), values.get("answer")
    if answer is None and index is not None:
        if not 0 <= index < len(options):
            raise ValueError(
                f"{_label('answer_index', mapping)}: option {index} is out of range "
                f"for {len(options)} options in {_label('options', mapping)}"
            )
        answer = options[index]
    if target == "benchmark" and index is None:
        if answer not in options:
            raise ValueError(
                f"{_label('answer', mapping)}: {answer!r} is not one of the options "
                f"in {_label('options', mapping)}: {_show(options)}"
            )
        index = options.index(answer)
    default_id = f"{benchmark if target == 'benchmark' else source.path.stem}/{n}"
    obj = {"id": values.get("id", default_id), "question": values["question"], "answer": answer}
    if target == "stimuliqa":
        obj["stimuli"] = values["stimuli"]
        obj.update({k: values[k] for k in OPTIONAL[target] if k in values})
        return obj
    return {
        **obj,
        "benchmark": benchmark,
        "task": values.get("task", ""),
        "context": values.get("stimuli", ""),
        "options": options,
        "answer_index": index,
        "meta": values.get("meta", {"source_file": source.path.name, "source_row": n}),
    }


def _in_columns(problem: str, target: str, mapping: dict[str, str]) -> str:
    """A validator's `key 'x'` said as the source column it came from."""
    names = {
        "context" if target == "benchmark" and k == "stimuli" else k: _label(k, mapping)
        for k in mapping
    }
    names.setdefault("benchmark", "--benchmark")
    names.setdefault("id", "the generated id")
    return re.sub(r"key '(\w+)'", lambda m: names.get(m[1], m[0]), problem)


def convert_rows(source: Source, target: str, mapping: dict[str, str], benchmark: str = "") -> list:
    """StimuliRecord or BenchmarkRecord per row, each validated by psyrl.core.records; a DataError
    lists `source:row: column (key): problem` for every bad row (the first 20)."""
    check_columns(source, mapping)
    validate = stimuli_record if target == "stimuliqa" else benchmark_record
    records, errors, first_row_of = [], [], {}
    for n, row in source.rows:
        try:
            record = validate(row_object(row, n, source, target, mapping, benchmark))
        except ValueError as e:
            errors.append(f"{source.where(n)}: {_in_columns(str(e), target, mapping)}")
            continue
        if record.id in first_row_of:
            where = _label("id", mapping) if "id" in mapping else "id"
            errors.append(
                f"{source.where(n)}: {where}: duplicate id {record.id!r} (first at "
                f"{source.where(first_row_of[record.id])})"
            )
            continue
        first_row_of[record.id] = n
        records.append(record)
    raise_line_errors(source.path, errors, "row(s)")
    return records


def convert(
    source_path: str | Path,
    target: str,
    mapping: dict[str, str],
    out: str | Path,
    kind: str | None = None,
    benchmark: str | None = None,
    overwrite: bool = False,
) -> tuple[Source, list]:
    """Read, convert, write `out` atomically and load it back with the target's loader; nothing is
    written on any error. `benchmark` defaults to `out`'s name without .jsonl."""
    out = Path(out)
    if out.is_dir():
        raise ConvertError(f"--out {out}: is a directory; expected a .jsonl file")
    if out.exists() and not overwrite:
        raise ConvertError(f"--out {out}: exists (pass --overwrite to replace it)")
    source = read_source(source_path, kind)
    records = convert_rows(source, target, mapping, benchmark or out.stem)
    tmp = temporary(out)
    write_jsonl(tmp, records)
    try:  # the loaders training and evaluate.py use, on the bytes that will be published
        (load_stimuliqa if target == "stimuliqa" else load_benchmark)(tmp)
    except DataError:
        tmp.unlink()
        raise
    tmp.replace(out)
    return source, records


# ---------------------------------------------------------------- the command
