"""The labelled table of the StimuliQA builder (paper §3.1): one row per stimulus, an id, the
stimulus text and one column per catalogue variable (psyrl.dataset.catalogue) holding the annotated
number, or nothing (empty, NA, N/A, null) where the variable was not coded. CSV with a header row
(comma, semicolon or tab separated), JSONL, or a `.json` array of objects. Validated whole: every
problem is reported as `file:line: what was wrong`, nothing is built.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from psyrl.core.records import DataError, parse_numbered, raise_line_errors, read_jsonl
from psyrl.dataset.catalogue import (
    Variable,
    json_element_lines,
    line_of,
    number_text,
    parse_json,
    read_text,
)

# looked for in this order when --text-column is not given
TEXT_COLUMNS = ("stimuli", "stimulus", "text", "story")
# cells that mean "not coded" (case-insensitive)
MISSING = {"", "na", "n/a", "nan", "null", "none", "-"}


@dataclass(frozen=True)
class LabelledStimulus:
    """One row of the labelled table: the variables coded for this stimulus, code -> value."""

    id: str
    text: str
    values: dict[str, float] = field(default_factory=dict)


def load_labelled(
    path: str | Path,
    catalogue: dict[str, Variable],
    id_column: str | None = None,
    text_column: str | None = None,
    ignore_columns: Sequence[str] = (),
) -> list[LabelledStimulus]:
    """Every row of a CSV (comma, semicolon or tab separated) or JSONL table of labelled stimuli,
    values checked against the catalogue's ranges; a DataError lists `file:line: problem` for every
    bad row. The id column is `id` and the text column the first of TEXT_COLUMNS, in any case,
    unless named. Columns that are neither the id, the text nor a catalogue variable are an error
    unless named in `ignore_columns` (a misspelt variable would otherwise vanish silently); columns
    without a name (a spreadsheet's index, a trailing comma) are ignored."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such table of labelled stimuli")
    rows = json_rows(path) if path.suffix.lower() in (".jsonl", ".json") else csv_rows(path)
    header = list(dict.fromkeys(k for _, row in rows if isinstance(row, dict) for k in row))
    # where a column first appears: the header of a CSV, the first row naming it in JSONL
    first_line = {} if path.suffix.lower() in (".jsonl", ".json") else dict.fromkeys(header, 1)
    for lineno, row in rows:
        for key in row if isinstance(row, dict) else ():
            first_line.setdefault(key, lineno)
    lower = {c.lower(): c for c in reversed(header)}
    id_column = id_column or lower.get("id", "id")
    text_column = text_column or next(
        (lower[c] for c in TEXT_COLUMNS if c in lower), TEXT_COLUMNS[0]
    )
    errors = []
    for column, option in ((id_column, "--id-column"), (text_column, "--text-column")):
        if rows and column not in header:
            errors.append(
                f"{path}:1: no {column!r} column (columns: {', '.join(header)}); name it with "
                f"{option}"
            )
    known = {id_column, text_column, *catalogue, *ignore_columns}
    for column in header:
        if column not in known:
            close = difflib.get_close_matches(column, list(catalogue), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            errors.append(
                f"{path}:{first_line.get(column, 1)}: column {column!r} is not a variable of "
                f"the catalogue; {hint}pass "
                f"--ignore-column {column} to build without it"
            )
    raise_line_errors(path, errors, "column(s)")
    stimuli = parse_numbered(
        path, rows, lambda row: _stimulus(row, catalogue, id_column, text_column), "row(s)"
    )
    if not stimuli:
        raise DataError(f"{path}: the table holds no stimuli")
    return stimuli


def _stimulus(
    row, catalogue: dict[str, Variable], id_column: str, text_column: str
) -> LabelledStimulus:
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    problems = []
    ident, text = row.get(id_column), row.get(text_column)
    if isinstance(ident, int) and not isinstance(ident, bool):
        ident = str(ident)
    if not isinstance(ident, str) or not ident.strip():
        problems.append(f"{id_column!r} must be a non-empty string, got {json.dumps(ident)}")
    if not isinstance(text, str) or not text.strip():
        problems.append(
            f"{text_column!r} (the stimulus) must be a non-empty string, got "
            f"{json.dumps(text)[:60]}"
        )
    values = {}
    for code, variable in catalogue.items():
        raw = row.get(code)
        if raw is None or (isinstance(raw, str) and raw.strip().lower() in MISSING):
            continue
        try:
            value = float(raw) if not isinstance(raw, bool) else math.nan
        except (TypeError, ValueError):
            value = math.nan
        if not math.isfinite(value):
            problems.append(
                f"{code!r}: {json.dumps(raw)[:40]} is not a number (leave the cell empty when not "
                "coded)"
            )
        elif not variable.low <= value <= variable.high:
            problems.append(
                f"{code!r}: {number_text(value)} is outside the catalogue's range "
                f"{variable.range_text}"
            )
        else:
            values[code] = value
    if problems:
        raise ValueError("; ".join(problems))
    return LabelledStimulus(ident.strip(), text.strip(), values)


def csv_rows(path: Path) -> list[tuple[int, dict]]:
    """(first line, {column: cell}) per data row; the delimiter is the header line's most frequent
    of `,` `;` tab. Ragged rows and repeated column names are errors."""
    text = read_text(path)
    first = text.split("\n", 1)[0]
    delimiter = max(",;\t", key=first.count)
    reader = csv.reader(io.StringIO(text, newline=""), delimiter=delimiter)
    try:
        header = next(reader, None)
        if header is None:
            raise DataError(f"{path}: empty file (expected a header row)")
        header = [h.strip() for h in header]
        repeated = sorted({h for h in header if h and header.count(h) > 1})
        if repeated:
            raise DataError(f"{path}:1: header: column {repeated[0]!r} appears twice")
        rows, errors, line = [], [], reader.line_num + 1
        for cells in reader:
            if any(c.strip() for c in cells):
                if len(cells) != len(header):
                    errors.append(
                        f"{path}:{line}: {len(cells)} cells, the header has {len(header)}"
                    )
                # a column without a name is a spreadsheet's index or a trailing comma: ignored
                else:
                    rows.append((line, {h: c for h, c in zip(header, cells) if h}))
            line = reader.line_num + 1
    except csv.Error as e:
        raise DataError(f"{path}:{reader.line_num}: {e}") from None
    raise_line_errors(path, errors, "row(s)")
    return rows


def json_rows(path: Path) -> list[tuple[int, dict]]:
    """(line, object) per row of a JSONL file, or of a .json file holding one JSON array of
    objects."""
    text = read_text(path) if path.suffix.lower() == ".json" else ""
    if text.lstrip().startswith("["):
        rows = parse_json(path, text)
        return [
            (line_of(text, offset), row)
            for offset, row in zip(json_element_lines(text, True), rows)
        ]
    bad = []
    rows = read_jsonl(path, bad=bad)
    raise_line_errors(path, [f"{path}:{lineno}: {problem}" for lineno, problem in bad], "line(s)")
    return rows
