"""The README's reading order names real code: every `file:START-END` range in its table is a whole
file (START 1, END its last line) or exactly one function's lines, so the ranges and the line count
cannot drift from the code unnoticed."""

import ast
import re
from pathlib import Path

ROW = re.compile(r"^\| *(\d+) \| `([\w/.]+):(\d+)-(\d+)` \|", re.M)


def reading_order() -> list[tuple[str, int, int]]:
    text = Path("README.md").read_text(encoding="utf-8")
    section = text.split("## Read the algorithm in this order")[1].split("\n## ")[0]
    return [(path, int(a), int(b)) for _, path, a, b in ROW.findall(section)]


def test_the_reading_order_ranges_are_files_or_functions():
    rows = reading_order()
    assert 1 <= len(rows) <= 10  # issue 40: ten files at most
    for path, start, end in rows:
        source = Path(path).read_text(encoding="utf-8")
        lines = len(source.splitlines())
        if start == 1:
            assert end == lines, f"{path}: the README says 1-{end}, the file has {lines} lines"
            continue
        spans = [
            (min([n.lineno] + [d.lineno for d in n.decorator_list]), n.end_lineno)
            for n in ast.walk(ast.parse(source))
            if isinstance(n, (ast.FunctionDef, ast.ClassDef))
        ]
        assert (start, end) in spans, f"{path}:{start}-{end} is no function's lines"


def test_the_reading_order_states_its_line_count():
    rows = reading_order()
    total = sum(end - start + 1 for _, start, end in rows)
    text = Path("README.md").read_text(encoding="utf-8")
    assert f"in {len(rows)} files and {total:,} lines" in text.replace("ten files", "10 files")
    assert total <= 1500
