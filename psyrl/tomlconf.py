"""TOML <-> nested dataclasses: a root dataclass whose fields are tables of scalar keys.

Every bad input raises one `ConfigError` naming the file, the line and the key (tomli keeps no
positions for values, so the line is found by scanning the text for `key =` inside `[table]`).
Knows nothing of psyrl's tables: `psyrl.config` passes its root class in.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import inspect
import json
import re
import textwrap
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import tomli


class ConfigError(ValueError):
    """A configuration a run cannot use; the message names where (file:line or --set) and the key."""


class FieldError(ValueError):
    """A bad value for one key of a table, raised by a table's `__post_init__`; the loader adds file and line."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


def require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise FieldError(key, message)


def table_classes(root: type) -> dict[str, type]:
    """TOML table name -> its dataclass, in the root's field order."""
    hints = typing.get_type_hints(root)
    return {f.name: hints[f.name] for f in dataclasses.fields(root)}


# ---------------------------------------------------------------- reading


def load(root: type, path: str | Path | None, overrides: Sequence[str] = ()):
    """Read a TOML file (None: all defaults), apply `table.key=value` overrides, build `root`."""
    raw, text, source = {}, "", "<defaults>"
    if path is not None:
        source = str(path)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"{source}: cannot read config file: {e}") from None
        try:
            raw = tomli.loads(text)
        except tomli.TOMLDecodeError as e:
            raise ConfigError(f"{source}:{e.lineno}: invalid TOML: {e.msg} (column {e.colno})") from None
    where = {}  # (table, key) -> "--set ..." for overridden values
    for override in overrides:
        table, key, value = _parse_override(override)
        if not isinstance(raw.setdefault(table, {}), dict):
            raise ConfigError(f"--set {override}: '{table}' is not a table")
        raw[table][key] = value
        where[table, key] = f"--set {override}"

    def locate(table: str, key: str | None) -> str:
        if (table, key) in where:
            return where[table, key]
        line = _find_line(text, table, key)
        if line is None and key is None:  # a table that only an override created
            line_from_set = next((v for (t, _), v in where.items() if t == table), None)
            if line_from_set:
                return line_from_set
        return f"{source}:{line}" if line else source

    classes = table_classes(root)
    built = {}
    for table, values in raw.items():
        if table not in classes:
            raise ConfigError(f"{locate(table, None)}: unknown table [{table}]{_suggest(table, classes)}")
        if not isinstance(values, dict):
            raise ConfigError(f"{locate(table, None)}: '{table}' must be a table, got {_type_name(values)}")
        built[table] = _build_table(table, classes[table], values, locate)
    return root(**built)


def _parse_override(override: str) -> tuple[str, str, object]:
    name, sep, value = override.partition("=")
    table, dot, key = name.strip().partition(".")
    if not sep or not dot or not table or not key or "." in key:
        raise ConfigError(f"--set {override}: expected table.key=value, e.g. --set reward.variant=base")
    try:  # a TOML value (1, 0.5, true, "text"); anything else is taken as a bare string
        parsed = tomli.loads(f"v = {value}")["v"]
    except tomli.TOMLDecodeError:
        parsed = value
    return table, key.strip(), parsed


def _build_table(table: str, cls: type, values: dict, locate) -> object:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(f"{locate(table, key)}: unknown key '{key}' in [{table}]{_suggest(key, hints)}")
        try:
            kwargs[key] = _check_type(hints[key], value)
        except TypeError as e:
            raise ConfigError(f"{locate(table, key)}: [{table}] {key}: {e}") from None
    try:
        return cls(**kwargs)
    except FieldError as e:
        raise ConfigError(f"{locate(table, e.key)}: [{table}] {e.key}: {e.message}") from None


def _check_type(hint, value):
    """The value as the field's type (int -> float is the only conversion), else TypeError."""
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if value not in choices:
            close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise TypeError(f"expected one of {', '.join(repr(c) for c in choices)}, got {value!r}{hint}")
        return value
    if isinstance(value, bool) != (hint is bool):  # bool is an int subclass: keep them apart
        raise TypeError(f"expected {hint.__name__}, got {_type_name(value)} {value!r}")
    if hint is float and isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, hint):
        return value
    raise TypeError(f"expected {hint.__name__}, got {_type_name(value)} {value!r}")


def _type_name(value) -> str:
    names = {bool: "bool", int: "int", float: "float", str: "string", dict: "table", list: "array"}
    return names.get(type(value), type(value).__name__)


def _suggest(name: str, valid) -> str:
    close = difflib.get_close_matches(name, list(valid), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"{hint} (valid: {', '.join(valid)})"


def _find_line(text: str, table: str, key: str | None) -> int | None:
    """Line number of `key =` inside `[table]` (or of the header, or a dotted `table.key =`)."""
    header = re.compile(rf"^\s*\[\s*{re.escape(table)}\s*\]\s*(#.*)?$")
    assign = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*=") if key else None
    dotted = re.compile(
        rf"^\s*{re.escape(table)}\s*(\.\s*{re.escape(key)}\s*)?=" if key else rf"^\s*{re.escape(table)}\s*[.=]"
    )
    current = None  # the table whose body we are in; None before the first header
    for number, line in enumerate(text.splitlines(), start=1):
        if re.match(r"^\s*\[", line):
            current = table if header.match(line) else ""
            if key is None and current == table:
                return number
        elif current == table and assign is not None and assign.match(line):
            return number
        elif current is None and dotted.match(line):
            return number
    if key is not None:  # a sub-table `[table.key]` where a scalar was expected
        subtable = re.compile(rf"^\s*\[\s*{re.escape(table)}\s*\.\s*{re.escape(key)}\s*\]")
        return next((n for n, line in enumerate(text.splitlines(), start=1) if subtable.match(line)), None)
    return None


# ---------------------------------------------------------------- writing


def dump(config) -> str:
    """TOML text that `load` reads back to an equal config."""
    out = []
    for table in table_classes(type(config)):
        out.append(f"[{table}]")
        for key, value in dataclasses.asdict(getattr(config, table)).items():
            out.append(f"{key} = {_toml_value(value)}")
        out.append("")
    return "\n".join(out)


def _toml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # JSON string escapes are valid TOML basic-string escapes
    return repr(value)  # int, or float: repr round-trips exactly (inf and nan are TOML too)


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, read from its source."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def reference(root: type) -> str:
    """Markdown reference of every table and key: type, default, meaning."""
    out = []
    for table, cls in table_classes(root).items():
        docs, hints, default = field_docs(cls), typing.get_type_hints(cls), cls()
        out += [f"#### `[{table}]`", "", "| key | type | default | meaning |", "| --- | --- | --- | --- |"]
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if typing.get_origin(hint) is Literal:
                kind = " \\| ".join(f'"{c}"' for c in typing.get_args(hint))
            else:
                kind = hint.__name__
            out.append(f"| `{f.name}` | {kind} | `{_toml_value(getattr(default, f.name))}` | {docs.get(f.name, '')} |")
        out.append("")
    return "\n".join(out)
