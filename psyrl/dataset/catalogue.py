"""The variable catalogue of the StimuliQA builder (paper §3.1, appendix B): TOML, or JSON with the
same shape, one `[[variable]]` table per psychological variable:

    [[variable]]
    code = "B_disap"                        # the table's column name, the prompts' [column_name]
    description = "disappointment ..."      # the prompts' [description]
    range = [0, 3]                          # the annotation scale: lowest and highest value
    ([range])
    dimension = "emotional reactions"       # one of the paper's three (§3.1)
    subdimension = "specific emotions"      # one of Table 2's six
    category = "disappointment"             # optional: the prompt's [category]; default: the
    subdimension
    topics = ["a broken promise", ...]      # optional seed topics for `psyrl build topics` /
    `comparison`

Validated whole: every problem is reported as `file:line: what was wrong`, nothing is built. The
labelled table that goes with it: psyrl.dataset.labelled.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import tomli

from psyrl.core.records import DIMENSIONS, SUBDIMENSIONS, DataError, raise_line_errors

_KEYS = {
    "code": str,
    "description": str,
    "range": list,
    "dimension": str,
    "subdimension": str,
    "category": str,
    "topics": list,
}
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


# ---------------------------------------------------------------- catalogue
def load_catalogue(path: str | Path) -> dict[str, Variable]:
    """The catalogue's variables by code, in file order; a DataError lists `file:line: problem` for
    every bad entry."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such catalogue file")
    text = read_text(path)
    if path.suffix.lower() == ".json":
        top = parse_json(path, text)
        # {"variable": [...]} or the list alone
        entries = top.get("variable") if isinstance(top, dict) else top
        starts = (
            json_element_lines(text, isinstance(top, list)) if isinstance(entries, list) else []
        )
        key_line = lambda start, key: _line_after(text, start, rf'"{key}"\s*:')
    else:
        try:
            top = tomli.loads(text)
        except tomli.TOMLDecodeError as e:
            raise DataError(f"{path}: invalid TOML: {e}") from None
        entries = top.get("variable")
        starts = [
            m.start()
            for m in re.finditer(r"^[ \t]*\[\[[ \t]*variable[ \t]*\]\]", text, re.MULTILINE)
        ]
        key_line = lambda start, key: _line_after(text, start, rf"^[ \t]*{key}[ \t]*=")
    if isinstance(entries, dict):
        raise DataError(
            f"{path}: `variable` is one table; write each variable as [[variable]] (an array of "
            "tables)"
        )
    if not isinstance(entries, list) or not entries:
        raise DataError(
            f'{path}: expected one or more [[variable]] tables (JSON: {{"variable": [...]}} or a '
            f"list), found {'none' if isinstance(top, dict | list) else type(top).__name__}"
        )
    unknown = sorted(set(top) - {"variable"}) if isinstance(top, dict) else []
    errors = (
        [f"{path}:1: unknown top-level key {unknown[0]!r} (expected only [[variable]] tables)"]
        if unknown
        else []
    )
    variables: dict[str, Variable] = {}
    for i, entry in enumerate(entries):
        start = starts[i] if i < len(starts) else 0
        try:
            variable = _variable(entry)
        except _EntryError as e:
            line = key_line(start, e.key) if e.key else line_of(text, start)
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
            raise _EntryError(
                key,
                f"{key!r} must be {'a list' if kind is list else 'a string'}, got "
                f"{json.dumps(entry[key])[:60]}",
            )
        elif kind is str and not entry[key].strip():
            raise _EntryError(key, f"{key!r} must not be empty")
    code = entry["code"]
    if not _CODE.fullmatch(code):
        raise _EntryError(
            "code", f"code {code!r} must be a letter then letters, digits or _ (a column name)"
        )
    bounds = entry["range"]
    if (
        len(bounds) != 2
        or not all(
            isinstance(b, int | float) and not isinstance(b, bool) and math.isfinite(b)
            for b in bounds
        )
        or not bounds[0] < bounds[1]
    ):
        raise _EntryError(
            "range",
            f"range must be [lowest, highest], two numbers, lowest first; got {json.dumps(bounds)}",
        )
    if entry["dimension"] not in DIMENSIONS:
        raise _EntryError(
            "dimension", f"dimension {entry['dimension']!r} is not one of {', '.join(DIMENSIONS)}"
        )
    if entry["subdimension"] not in SUBDIMENSIONS:
        raise _EntryError(
            "subdimension",
            f"subdimension {entry['subdimension']!r} is not one of {', '.join(SUBDIMENSIONS)}",
        )
    topics = entry.get("topics", [])
    if not all(isinstance(t, str) and t.strip() for t in topics):
        raise _EntryError("topics", "topics must be a list of non-empty strings")
    return Variable(
        code,
        entry["description"].strip(),
        float(bounds[0]),
        float(bounds[1]),
        entry["dimension"],
        entry["subdimension"],
        entry.get("category", entry["subdimension"]).strip(),
        tuple(t.strip() for t in topics),
    )


def read_text(path: Path) -> str:
    """The file as UTF-8 (a byte-order mark dropped); a bad byte is a DataError naming its line."""
    raw = path.read_bytes()
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line, column = raw[: e.start].count(b"\n") + 1, e.start - raw.rfind(b"\n", 0, e.start)
        raise DataError(
            f"{path}:{line}: not valid UTF-8 (byte {column} of the line); save it as UTF-8"
        ) from None


def parse_json(path: Path, text: str):
    """The JSON document `text`, read from `path`; a syntax error is a DataError naming its line."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise DataError(f"{path}:{e.lineno}: invalid JSON ({e.msg} at column {e.colno})") from None


def line_of(text: str, offset: int) -> int:
    return text.count("\n", 0, offset) + 1


def _line_after(text: str, start: int, pattern: str) -> int:
    """The line of the first match of `pattern` at or after `start` (the entry's own key), else the
    entry's line."""
    match = re.compile(pattern, re.MULTILINE).search(text, start)
    return line_of(text, match.start() if match else start)


def json_element_lines(text: str, top_level_list: bool) -> list[int]:
    """The offsets of the elements of a JSON catalogue's variable array (the top-level "variable"
    key's, or the document's when it is a list)."""
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
