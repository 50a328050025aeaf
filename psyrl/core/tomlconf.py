"""TOML <-> nested dataclasses: a root dataclass whose fields are tables of scalar keys.

Every bad input raises one `ConfigError` naming the file, the line and the key (tomli keeps no
positions for values, so the line is found by scanning the text for `key =` inside `[table]`). Knows
nothing of psyrl's tables: `psyrl.core.config` passes its root class in.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import textwrap
import typing
from collections.abc import Sequence
from pathlib import Path
from typing import Literal

import tomli

from psyrl.core.errors import PsyrlError


class ConfigError(PsyrlError, ValueError):
    """A configuration a run cannot use; the message names where (file:line or --set) and the
    key."""


class FieldError(ValueError):
    """A bad value for one key of a table, raised by a table's `__post_init__`; the loader adds file
    and line."""

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key, self.message = key, message


def hide_credentials(text: str) -> str:
    """`text` with a URL's user:password@ (to its last @) and its query shown as ***, so an error
    never prints a password or a key: "u=http://a:b@c@host/v1?key=k" -> "u=http://***@host/v1?***"."""
    text = re.sub(r"(://)[^\s\"']*@", r"\1***@", text)
    return re.sub(r"(://[^\s\"']*[?#])[^\s\"']*", r"\1***", text)


def require(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise FieldError(key, message)


def check_choices(table) -> None:
    """Raise FieldError for a `Literal[...]` field of a dataclass holding a value outside its
    choices."""
    for name, hint in typing.get_type_hints(type(table)).items():
        if typing.get_origin(hint) is Literal and getattr(table, name) not in typing.get_args(hint):
            choices = [str(c) for c in typing.get_args(hint)]
            value = getattr(table, name)
            close = difflib.get_close_matches(str(value), choices, n=1)
            hint_text = f"; did you mean {close[0]!r}?" if close else ""
            raise FieldError(
                name, f"expected one of {', '.join(map(repr, choices))}, got {value!r}{hint_text}"
            )


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
        if not source:
            raise ConfigError("the config path is empty")
        raw, text = read_toml(path, "config file", ConfigError)
    where = {}  # (table, key) -> "--set ..." for overridden values

    def locate(table: str, key: str | None) -> str:
        if (table, key) in where:
            return where[table, key]
        line = find_line(text, (table,) if key is None else (table, key))
        if line is None and key is None:  # a table that only an override created
            line_from_set = next((v for (t, _), v in where.items() if t == table), None)
            if line_from_set:
                return line_from_set
        return f"{source}:{line}" if line else source

    classes = table_classes(root)
    for table, values in raw.items():
        if not isinstance(values, dict):
            raise ConfigError(f"{locate(table, None)}: {_not_a_table(table, values, classes)}")
    for override in overrides:
        table, key, value = _parse_override(override)
        raw.setdefault(table, {})[key] = value
        where[table, key] = "--set " + hide_credentials(override)
    built = {}
    for table, values in raw.items():
        if table not in classes:
            raise ConfigError(
                f"{locate(table, None)}: unknown table [{table}]{_suggest(table, classes)}"
            )
        built[table] = _build_table(table, classes[table], values, locate)
    return root(**built)


def _not_a_table(name: str, value, classes: dict[str, type]) -> str:
    if name in classes:
        return f"'{name}' must be a table ([{name}]), got {_type_name(value)}"
    owners = [t for t, cls in classes.items() if name in typing.get_type_hints(cls)]
    if owners:
        return f"key '{name}' is outside any table; it belongs under [{owners[0]}]"
    return f"unknown key '{name}' outside any table (tables: {', '.join(classes)})"


def _parse_override(override: str) -> tuple[str, str, object]:
    name, sep, value = override.partition("=")
    table, dot, key = name.strip().partition(".")
    if not sep or not dot or not table or not key or "." in key:
        raise ConfigError(
            f"--set {hide_credentials(override)}: expected table.key=value, e.g. --set "
            "reward.variant=base"
        )
    try:  # a TOML value (1, 0.5, true, "text"); anything else is taken as a bare string
        parsed = tomli.loads(f"v = {value}")["v"]
    except tomli.TOMLDecodeError as e:
        if value.strip()[:1] in ("'", '"', "[", "{"):  # meant as TOML, but broken
            shown = hide_credentials(override)
            raise ConfigError(f"--set {shown}: invalid TOML value: {e.msg}") from None
        parsed = value
    return table, key.strip(), parsed


def _build_table(table: str, cls: type, values: dict, locate) -> object:
    hints = typing.get_type_hints(cls)
    kwargs = {}
    for key, value in values.items():
        if key not in hints:
            raise ConfigError(
                f"{locate(table, key)}: unknown key '{key}' in [{table}]{_suggest(key, hints)}"
            )
        try:
            kwargs[key] = _check_type(hints[key], value)
        except TypeError as e:
            where = locate(table, key)
            tip = (
                " (--set values are TOML: 0.5, true, '\"quoted text\"')"
                if where.startswith("--set")
                else ""
            )
            raise ConfigError(f"{where}: [{table}] {key}: {e}{tip}") from None
    try:
        return cls(**kwargs)
    except FieldError as e:
        raise ConfigError(f"{locate(table, e.key)}: [{table}] {e.key}: {e.message}") from None


def _check_type(hint, value):
    """The value as the field's type (int -> float is the only conversion), else TypeError. Literal
    choices are checked by the table itself (`check_choices`)."""
    if typing.get_origin(hint) is Literal:
        choices = typing.get_args(hint)
        if not isinstance(value, type(choices[0])) or isinstance(value, bool) != isinstance(
            choices[0], bool
        ):
            raise TypeError(
                f"expected one of {', '.join(map(repr, choices))}, got {_type_name(value)} "
                f"{value!r}"
            )
        return value
    if typing.get_origin(hint) is list:  # list[str] or list[float]: an array of one kind
        item = typing.get_args(hint)[0]
        if not isinstance(value, list):
            raise TypeError(
                f"expected an array of {_type_name(item())}s, got {_type_name(value)} {value!r}"
            )
        try:
            return [_check_type(item, v) for v in value]
        except TypeError:
            raise TypeError(
                f"expected an array of {_type_name(item())}s, got {_type_name(value)} {value!r}"
            ) from None
    if isinstance(value, bool) != (hint is bool):  # bool is an int subclass: keep them apart
        raise TypeError(f"expected {hint.__name__}, got {_type_name(value)} {value!r}")
    if hint is float and isinstance(value, (int, float)):
        if not math.isfinite(value):
            raise TypeError(f"expected a finite float, got {value!r}")
        return float(value)
    if hint is int and isinstance(value, int) and not -(2**63) <= value < 2**63:
        raise TypeError(f"expected a 64-bit int, got {value!r}")
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


def read_toml(path: str | Path, what: str, error: type[Exception]) -> tuple[dict, str]:
    """(the document, its text) of the TOML file `path`; `error` naming the file, and the line of a
    syntax error, when it cannot be read or parsed. `what` names the file in the message."""
    try:
        text = Path(path).read_text(encoding="utf-8-sig")  # -sig: a byte-order mark is not TOML
    except (OSError, UnicodeDecodeError) as e:
        raise error(f"{path}: cannot read {what}: {e}") from None
    try:
        return tomli.loads(text), text
    except tomli.TOMLDecodeError as e:
        raise error(f"{path}:{e.lineno}: invalid TOML: {e.msg} (column {e.colno})") from None


def find_line(text: str, path: tuple) -> int | None:
    """First line whose prefix of the file, parsed as TOML, holds the nested key `path` (a table
    index for an array of tables): exact for every TOML spelling (headers, dotted keys, inline
    tables). Runs only on errors."""
    lines = text.splitlines(keepends=True)
    for number in range(1, len(lines) + 1):
        try:
            node = tomli.loads("".join(lines[:number]))
        except tomli.TOMLDecodeError:
            continue  # cut inside a multi-line value
        for part in path:
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and isinstance(part, int) and part < len(node):
                node = node[part]
            else:
                break
        else:
            return number
    return None


# ---------------------------------------------------------------- writing


def field_docs(cls: type) -> dict[str, str]:
    """The docstring under each field of a dataclass, read from its source (Python keeps no field
    docstrings at run time), on one line each."""
    import ast
    import inspect

    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for node, after in zip(body, body[1:]):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
        ):
            docs[node.target.id] = " ".join(str(after.value.value).split())
    return docs


def dump(config, explain: bool = False) -> str:
    """TOML text that `load` reads back to an equal config; with `explain`, each key's docstring
    (its meaning, and the paper's or a peer's source) above it as comments."""
    out = []
    for table, cls in table_classes(type(config)).items():
        out.append(f"[{table}]")
        docs = field_docs(cls) if explain else {}
        for key, value in dataclasses.asdict(getattr(config, table)).items():
            if key in docs:
                out += textwrap.wrap(docs[key], 98, initial_indent="# ", subsequent_indent="# ")
            out.append(f"{key} = {toml_value(value)}")
        out.append("")
    return "\n".join(out)


_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\t": "\\t",
    "\r": "\\r",
    "\b": "\\b",
    "\f": "\\f",
}


def toml_value(value) -> str:
    """A value as TOML text (`dump`'s, and the defaults of tools/config_reference.py)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    # a TOML basic string: control characters (DEL too) as \uXXXX escapes
    if isinstance(value, str):
        return (
            '"'
            + "".join(
                _ESCAPES.get(c, f"\\u{ord(c):04x}" if c < " " or c == "\x7f" else c) for c in value
            )
            + '"'
        )
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)  # int, or a finite float: repr round-trips exactly
