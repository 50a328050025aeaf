"""Generate the config reference of docs/config.md: every table of `psyrl.core.config.Config`, each
key's type, default and meaning, the meaning being the docstring written under the field.

    python tools/config_reference.py                    print the reference
    python tools/config_reference.py docs/config.md     write it between the file's markers

`make docs` runs the second; a test (tests/core/test_config_reference.py) fails when docs/config.md
is out of date. Nothing in psyrl imports this file; `psyrl config show --explain` prints the same
docstrings (psyrl.core.tomlconf.field_docs) as comments above a config's keys.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path
from typing import Literal

from psyrl.core.config import Config
from psyrl.core.tomlconf import field_docs, table_classes, toml_value

START, END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


def reference(root: type = Config) -> str:
    """Markdown reference of every table and key: type, default, meaning."""
    out = []
    for table, cls in table_classes(root).items():
        docs, hints, default = field_docs(cls), typing.get_type_hints(cls), cls()
        out += [
            f"#### `[{table}]`",
            "",
            "| key | type | default | meaning |",
            "| --- | --- | --- | --- |",
        ]
        for f in dataclasses.fields(cls):
            hint = hints[f.name]
            if typing.get_origin(hint) is Literal:
                kind = " \\| ".join(f'"{c}"' for c in typing.get_args(hint))
            elif typing.get_origin(hint) is list:
                kind = f"array of {typing.get_args(hint)[0].__name__}"
            else:
                kind = hint.__name__
            out.append(
                f"| `{f.name}` | {kind} | `{toml_value(getattr(default, f.name))}` | "
                f"{docs.get(f.name, '')} |"
            )
        out.append("")
    return "\n".join(out)


def between_markers(text: str, reference_text: str) -> str:
    """`text` with whatever stands between START and END replaced by `reference_text`."""
    start = text.find(START)
    end = text.find(END, start)
    if start < 0 or end < start:
        raise ValueError(f"markers {START} ... {END} not found")
    return f"{text[: start + len(START)]}\n{reference_text}\n{text[end:]}"


def main(argv: list[str]) -> int:
    if not argv:
        print(reference())
        return 0
    path = Path(argv[0])
    try:
        path.write_text(
            between_markers(path.read_text(encoding="utf-8"), reference()), encoding="utf-8"
        )
    except (OSError, ValueError) as e:
        print(f"{path}: {e}", file=sys.stderr)
        return 1
    print(f"wrote the config reference into {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
