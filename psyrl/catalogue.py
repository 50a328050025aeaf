"""The inputs of the StimuliQA builder (paper §3.1, appendix B): a variable catalogue and a table of labelled stimuli.

Catalogue (TOML, or JSON with the same shape): one `[[variable]]` table per psychological variable:

    [[variable]]
    code = "B_disap"                        # the table's column name, the prompts' [column_name]
    description = "disappointment ..."      # the prompts' [description]
    range = [0, 3]                          # the annotation scale: lowest and highest value ([range])
    dimension = "emotional reactions"       # one of the paper's three (§3.1)
    subdimension = "specific emotions"      # one of Table 2's six
    category = "disappointment"             # optional: the prompt's [category]; default: the subdimension
    topics = ["a broken promise", ...]      # optional seed topics for `psyrl build topics` / `comparison`

Labelled table (CSV with a header row, or JSONL): an id column, the stimulus text, and one column per catalogue
variable holding the annotated number, or nothing (empty, NA, N/A, null) where the variable was not coded.
Both files are validated whole: every problem is reported as `file:line: what was wrong`, nothing is built.
"""

from __future__ import annotations

import csv
import difflib
import io
import json
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import tomli

from psyrl.data import DIMENSIONS, SUBDIMENSIONS, DataError, parse_numbered, raise_line_errors

TEXT_COLUMNS = ("stimuli", "stimulus", "text", "story")  # looked for in this order when --text-column is not given
MISSING = {"", "na", "n/a", "nan", "null", "none", "-"}  # cells that mean "not coded" (case-insensitive)
_KEYS = {"code": str, "description": str, "range": list, "dimension": str, "subdimension": str, "category": str,
         "topics": list}
_OPTIONAL = {"category", "topics"}
_CODE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def number_text(x: float) -> str:
    """2.0 -> "2", 2.5 -> "2.5": a label as an annotator wrote it."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


@dataclass(frozen=True)
class Variable:
    """One psychological variable of the catalogue."""

    code: str
    description: str
    low: float
    high: float
    dimension: str
    subdimension: str
    category: str
    topics: tuple[str, ...] = ()

    @property
    def range_text(self) -> str:
        """The prompt's [range]: `0 to 3`."""
        return f"{number_text(self.low)} to {number_text(self.high)}"


@dataclass(frozen=True)
class LabelledStimulus:
    """One row of the labelled table: the variables coded for this stimulus, code -> value."""

    id: str
    text: str
    values: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------- catalogue
def load_catalogue(path: str | Path) -> dict[str, Variable]:
    """The catalogue's variables by code, in file order; a DataError lists `file:line: problem` for every bad entry."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such catalogue file")
    text = path.read_text(encoding="utf-8-sig")
    if path.suffix.lower() == ".json":
        try:
            top = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
        entries = top.get("variable") if isinstance(top, dict) else top  # {"variable": [...]} or the list alone
        starts = _json_element_lines(text, isinstance(top, list)) if isinstance(entries, list) else []
        key_line = lambda start, key: _line_after(text, start, rf'"{key}"\s*:')  # noqa: E731
    else:
        try:
            top = tomli.loads(text)
        except tomli.TOMLDecodeError as e:
            raise DataError(f"{path}: invalid TOML: {e}") from None
        entries = top.get("variable")
        starts = [m.start() for m in re.finditer(r"^[ \t]*\[\[[ \t]*variable[ \t]*\]\]", text, re.MULTILINE)]
        key_line = lambda start, key: _line_after(text, start, rf"^[ \t]*{key}[ \t]*=")  # noqa: E731
    if isinstance(entries, dict):
        raise DataError(f"{path}: `variable` is one table; write each variable as [[variable]] (an array of tables)")
    if not isinstance(entries, list) or not entries:
        raise DataError(f"{path}: expected one or more [[variable]] tables (JSON: {{\"variable\": [...]}} or a list), "
                        f"found {'none' if isinstance(top, dict | list) else type(top).__name__}")
    unknown = sorted(set(top) - {"variable"}) if isinstance(top, dict) else []
    errors = [f"{path}:1: unknown top-level key {unknown[0]!r} (expected only [[variable]] tables)"] if unknown else []
    variables: dict[str, Variable] = {}
    for i, entry in enumerate(entries):
        start = starts[i] if i < len(starts) else 0
        try:
            variable = _variable(entry)
        except _EntryError as e:
            line = key_line(start, e.key) if e.key else _line_of(text, start)
            errors.append(f"{path}:{line}: variable {i + 1}: {e}")
            continue
        if variable.code in variables:
            errors.append(f"{path}:{key_line(start, 'code')}: duplicate code {variable.code!r}")
            continue
        variables[variable.code] = variable
    raise_line_errors(path, errors, "variable(s)")
    return variables


class _EntryError(ValueError):
    def __init__(self, key: str | None, message: str):
        super().__init__(message)
        self.key = key


def _variable(entry) -> Variable:
    if not isinstance(entry, dict):
        raise _EntryError(None, f"expected a table, got {type(entry).__name__}")
    for key in entry:
        if key not in _KEYS:
            raise _EntryError(key, f"unknown key {key!r} (expected {', '.join(_KEYS)})")
    for key, kind in _KEYS.items():
        if key not in entry:
            if key not in _OPTIONAL:
                raise _EntryError(None, f"missing key {key!r}")
        elif not isinstance(entry[key], kind):
            raise _EntryError(key, f"{key!r} must be {'a list' if kind is list else 'a string'}, got "
                                   f"{json.dumps(entry[key])[:60]}")
        elif kind is str and not entry[key].strip():
            raise _EntryError(key, f"{key!r} must not be empty")
    code = entry["code"]
    if not _CODE.fullmatch(code):
        raise _EntryError("code", f"code {code!r} must be a letter then letters, digits or _ (a column name)")
    bounds = entry["range"]
    if (len(bounds) != 2 or not all(isinstance(b, int | float) and not isinstance(b, bool) and math.isfinite(b)
                                    for b in bounds) or not bounds[0] < bounds[1]):
        raise _EntryError("range", f"range must be [lowest, highest], two numbers, lowest first; got "
                                   f"{json.dumps(bounds)}")
    if entry["dimension"] not in DIMENSIONS:
        raise _EntryError("dimension", f"dimension {entry['dimension']!r} is not one of {', '.join(DIMENSIONS)}")
    if entry["subdimension"] not in SUBDIMENSIONS:
        raise _EntryError("subdimension",
                          f"subdimension {entry['subdimension']!r} is not one of {', '.join(SUBDIMENSIONS)}")
    topics = entry.get("topics", [])
    if not all(isinstance(t, str) and t.strip() for t in topics):
        raise _EntryError("topics", "topics must be a list of non-empty strings")
    return Variable(code, entry["description"].strip(), float(bounds[0]), float(bounds[1]), entry["dimension"],
                    entry["subdimension"], entry.get("category", entry["subdimension"]).strip(),
                    tuple(t.strip() for t in topics))


def _line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _line_after(text: str, start: int, pattern: str) -> int:
    """The line of the first match of `pattern` at or after `start` (the entry's own key), else the entry's line."""
    match = re.compile(pattern, re.MULTILINE).search(text, start)
    return _line_of(text, match.start() if match else start)


def _json_element_lines(text: str, top_level_list: bool) -> list[int]:
    """The offsets of the elements of a JSON catalogue's variable array (the top-level "variable" key's, or the
    document's when it is a list)."""
    decoder = json.JSONDecoder()
    key = re.search(r"\s*\[" if top_level_list else r'"variable"\s*:\s*\[', text)
    offsets, pos = [], key.end() if key else len(text)
    while pos < len(text):
        pos = len(text) - len(text[pos:].lstrip(" \t\r\n,"))
        if pos >= len(text) or text[pos] == "]":
            break
        offsets.append(pos)
        _, pos = decoder.raw_decode(text, pos)
    return offsets


# ---------------------------------------------------------------- labelled table
def load_labelled(path: str | Path, catalogue: dict[str, Variable], id_column: str | None = None,
                  text_column: str | None = None, ignore_columns: Sequence[str] = ()) -> list[LabelledStimulus]:
    """Every row of a CSV (comma, semicolon or tab separated) or JSONL table of labelled stimuli, values checked
    against the catalogue's ranges; a DataError lists `file:line: problem` for every bad row. The id column is `id`
    and the text column the first of TEXT_COLUMNS, in any case, unless named. Columns that are neither the id, the
    text nor a catalogue variable are an error unless named in `ignore_columns` (a misspelt variable would
    otherwise vanish silently); columns without a name (a spreadsheet's index, a trailing comma) are ignored."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such table of labelled stimuli")
    rows = _json_rows(path) if path.suffix.lower() in (".jsonl", ".json") else _csv_rows(path)
    header = list(dict.fromkeys(k for _, row in rows if isinstance(row, dict) for k in row))
    lower = {c.lower(): c for c in reversed(header)}
    id_column = id_column or lower.get("id", "id")
    text_column = text_column or next((lower[c] for c in TEXT_COLUMNS if c in lower), TEXT_COLUMNS[0])
    errors = []
    for column, option in ((id_column, "--id-column"), (text_column, "--text-column")):
        if rows and column not in header:
            errors.append(f"{path}:1: no {column!r} column (columns: {', '.join(header)}); name it with {option}")
    known = {id_column, text_column, *catalogue, *ignore_columns}
    for column in header:
        if column not in known:
            close = difflib.get_close_matches(column, list(catalogue), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            errors.append(f"{path}:1: column {column!r} is not a variable of the catalogue; {hint}pass "
                          f"--ignore-column {column} to build without it")
    raise_line_errors(path, errors, "column(s)")
    stimuli = parse_numbered(path, rows, lambda row: _stimulus(row, catalogue, id_column, text_column), "row(s)")
    if not stimuli:
        raise DataError(f"{path}: the table holds no stimuli")
    return stimuli


def _stimulus(row, catalogue: dict[str, Variable], id_column: str, text_column: str) -> LabelledStimulus:
    if not isinstance(row, dict):
        raise ValueError(f"expected a JSON object, got {type(row).__name__}")
    problems = []
    ident, text = row.get(id_column), row.get(text_column)
    if isinstance(ident, int) and not isinstance(ident, bool):
        ident = str(ident)
    if not isinstance(ident, str) or not ident.strip():
        problems.append(f"{id_column!r} must be a non-empty string, got {json.dumps(ident)}")
    if not isinstance(text, str) or not text.strip():
        problems.append(f"{text_column!r} (the stimulus) must be a non-empty string, got {json.dumps(text)[:60]}")
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
            problems.append(f"{code!r}: {json.dumps(raw)[:40]} is not a number (leave the cell empty when not coded)")
        elif not variable.low <= value <= variable.high:
            problems.append(f"{code!r}: {number_text(value)} is outside the catalogue's range {variable.range_text}")
        else:
            values[code] = value
    if problems:
        raise ValueError("; ".join(problems))
    return LabelledStimulus(ident.strip(), text.strip(), values)


def _text(path: Path) -> str:
    """The file as UTF-8 (a byte-order mark dropped); a bad byte is reported with its line."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line, column = raw[:e.start].count(b"\n") + 1, e.start - raw.rfind(b"\n", 0, e.start)
        raise DataError(f"{path}:{line}: not valid UTF-8 (byte {column} of the line); save it as UTF-8") from None


def _csv_rows(path: Path) -> list[tuple[int, dict]]:
    """(first line, {column: cell}) per data row; the delimiter is the header line's most frequent of `,` `;` tab.
    Ragged rows and repeated column names are errors."""
    text = _text(path)
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
                    errors.append(f"{path}:{line}: {len(cells)} cells, the header has {len(header)}")
                else:  # a column without a name is a spreadsheet's index or a trailing comma: ignored
                    rows.append((line, {h: c for h, c in zip(header, cells) if h}))
            line = reader.line_num + 1
    except csv.Error as e:
        raise DataError(f"{path}:{reader.line_num}: {e}") from None
    raise_line_errors(path, errors, "row(s)")
    return rows


def _json_rows(path: Path) -> list[tuple[int, dict]]:
    """(line, object) per row of a JSONL file, or of a .json file holding one JSON array of objects."""
    if path.suffix.lower() == ".json" and _text(path).lstrip().startswith("["):
        text = _text(path)
        try:
            rows = json.loads(text)
        except json.JSONDecodeError as e:
            raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None
        return [(_line_of(text, offset), row) for offset, row in zip(_json_element_lines(text, True), rows)]
    rows, errors = [], []
    with path.open("rb") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                rows.append((lineno, json.loads(line.decode("utf-8-sig" if lineno == 1 else "utf-8"))))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                errors.append(f"{path}:{lineno}: {'not valid UTF-8' if isinstance(e, UnicodeDecodeError) else e.msg}")
    raise_line_errors(path, errors, "line(s)")
    return rows
