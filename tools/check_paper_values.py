"""Cross-check every paper value typed into the experiment files against the paper's text (issue
31).

    python tools/check_paper_values.py PAPER.txt [FILE.toml ...]    (default: experiments/*.toml)

The text is the paper as plain text (its tables as tab-separated lines above their "Table N:"
captions, blocks headed by a model's name); it is not in the repository, and nothing else in psyrl
reads it. For each [tables.paper] of each file: the table's header names psyrl's `columns` in the
same order; every typed row is a row of that block of that table, with exactly the printed values
(F1 or Acc columns by the table's metric; Table 2's values and the differences it prints in
parentheses, against the row above them without any); a section's values (`table = "§4.6"`) are the
numbers of the quoted sentence, found in that section. The paper's own inconsistencies (a printed
difference that is not the difference of its printed values) are listed as notes. Exit status 1 on
any mismatch.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CELL = re.compile(r"(-?\d+(?:\.\d+)?)(%?)(?:\(([+-]?\d+(?:\.\d+)?)\))?")
# the paper's column headers, as psyrl's columns
HEADERS = {
    "tombench": "tombench",
    "simpletom": "simpletom",
    "socialiqa": "socialiqa",
    "social iqa": "socialiqa",
    "cosmosqa": "cosmosqa",
    "cosmos qa": "cosmosqa",
    "big-bench hard": "bbh",
    "specific emotions": "specific emotions",
    "targeted emotions": "targeted emotions",
    "direction of change": "direction of change",
    "self identification": "self identification",
    "needs fulfilment": "needs fulfilment",
    "national theme": "national theme",
    "overall": "all items",
}


def normalise(text: str) -> str:
    """The text as the files spell it: LaTeX's $\\times$ as ×."""
    return text.replace("$\\times$", "×")


def read_tables(text: str) -> dict[str, dict]:
    """Each table the text carries, by its caption's name ("Table 2"): {header: [psyrl columns],
    blocks: {block: {row: [cells]}}}, a cell (value, percent, printed difference or None)."""
    lines = text.splitlines()
    tables = {}
    for number, line in enumerate(lines):
        caption = re.match(r"(Table \d+):", line)
        if not caption:
            continue
        end = number
        while end > 0 and not lines[end - 1].strip():  # the blank line between table and caption
            end -= 1
        start = end
        while start > 0 and lines[start - 1].strip():
            start -= 1
        body = lines[start:end]
        if not body or "\t" not in body[0]:
            continue  # a caption under a table the text does not carry (Tables 6-13)
        header = [HEADERS.get(h.strip().lower(), h.strip()) for h in body[0].split("\t")[1:]]
        blocks: dict[str, dict] = {"": {}}
        block = ""
        for row in body[1:]:
            if "\t" not in row:
                block = row.strip()
                blocks[block] = {}
                continue
            label, *cells = row.split("\t")
            if not label.strip():
                continue  # the F1 / Acc line under the header
            matches = [CELL.fullmatch(c.strip()) for c in cells if c.strip()]
            blocks[block][label.strip()] = [
                (float(m[1]), bool(m[2]), None if m[3] is None else float(m[3])) if m else None
                for m in matches
            ]  # None: not a number (Table 5's yes/no)
        tables[caption[1]] = {"header": [h for h in header if h], "blocks": blocks}
    return tables


def section(text: str, number: str) -> str:
    """The text of section `number` ("4.6"), up to the next numbered heading, on one line."""
    lines = text.splitlines()
    found = [i for i, line in enumerate(lines) if line.startswith(f"{number} ")]
    if not found:
        return ""
    end = next(
        (i for i in range(found[0] + 1, len(lines)) if re.match(r"\d+(\.\d+)* [A-Z]", lines[i])),
        len(lines),
    )
    return " ".join(" ".join(lines[found[0] : end]).split())


def same(typed, printed) -> bool:
    return len(typed) == len(printed) and all(
        b is not None and abs(a - b) < 1e-9 for a, b in zip(typed, printed)
    )


def check_file(path: Path, tables: dict, text: str, report) -> None:
    from psyrl.experiment.read import load_experiment

    experiment = load_experiment(path)
    for spec in experiment.tables:
        paper = spec.paper
        if paper is None:
            continue
        where = f"{path.name} ({spec.metric})"
        if paper.table.startswith("§"):
            body = section(text, paper.table[1:])
            for run, entry in paper.differences.items():
                quote = " ".join(entry.row.split())
                numbers = [float(n) for n in re.findall(r"\d+(?:\.\d+)?", quote)]
                ok = bool(body) and quote in body and same(entry.values, numbers)
                report(ok, f"{where}: {paper.table}, {run} − {entry.minus}", entry.values, numbers)
            continue
        table = tables.get(paper.table)
        if table is None:
            report(False, f"{where}: no {paper.table} in the text", (), ())
            continue
        header_ok = table["header"] == list(paper.columns)
        columns = "" if header_ok else f": {list(paper.columns)}, printed {table['header']}"
        report(header_ok, f"{where}: {paper.table}'s columns{columns}", (), ())
        for run, entry in paper.rows.items():
            cells = table["blocks"].get(entry.block, {}).get(entry.row)
            name = f"{where}: {paper.table}, {entry.block or 'top'}, {entry.row} ({run})"
            if cells is None:
                report(False, f"{name}: no such row", entry.values, ())
                continue
            report(True, name, entry.values, _printed(cells, spec.metric))
        for run, entry in paper.differences.items():
            block = table["blocks"].get(entry.block, {})
            cells = block.get(entry.row)
            base = _base_row(block, entry.row)
            name = f"{where}: {paper.table}, {entry.block or 'top'}, {entry.row} − {base} ({run})"
            minus = paper.rows.get(entry.minus)
            if cells is None or minus is None or minus.row != base:
                report(False, f"{name}: the difference is not against {entry.minus}'s row", (), ())
                continue
            report(True, name, entry.values, [d for _, _, d in cells])
            printed = [v for v, _, _ in cells]
            for column, delta, value, other in zip(
                paper.columns, entry.values, printed, [v for v, _, _ in block[base]]
            ):
                if abs(value - other - delta) > 0.01 + 1e-9:
                    report(
                        None,
                        f"{name}, {column}: the paper prints {delta:+.2f}, its values give "
                        f"{value - other:+.2f} ({value:.2f} − {other:.2f}); results.md shows the "
                        "printed difference",
                        (),
                        (),
                    )


def _printed(cells: list, metric: str) -> list:
    """The printed values a table of `metric` takes: Acc (%) cells, or the others."""
    return [c and c[0] for c in cells if c is None or c[1] == (metric == "accuracy")]


def _base_row(block: dict, label: str) -> str:
    """The row a printed difference is taken against: the nearest row above without any."""
    base = ""
    for row, cells in block.items():
        if row == label:
            return base
        if all(d is None for _, _, d in cells):
            base = row
    return base


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    text = normalise(Path(argv[0]).read_text(encoding="utf-8"))
    files = [Path(a).resolve() for a in argv[1:]] or sorted((REPO / "experiments").glob("*.toml"))
    sys.path.insert(0, str(REPO))
    import os

    os.chdir(REPO)  # the files' config paths are relative to the repository root
    tables = read_tables(text)
    counts = {"rows": 0, "values": 0, "mismatches": 0, "notes": 0}

    def report(ok, name, typed, printed) -> None:
        if ok is None:
            counts["notes"] += 1
            print(f"note      {name}")
            return
        ok = ok and same(typed, printed)
        counts["rows"] += 1
        counts["values"] += len(typed)
        counts["mismatches"] += not ok
        print(
            f"{'ok' if ok else 'MISMATCH':9} {name}"
            + ("" if ok else f": typed {list(typed)}, printed {list(printed)}")
        )

    checked = [f for f in files if "[tables.paper" in f.read_text(encoding="utf-8")]
    for path in checked:
        check_file(path, tables, text, report)
    print(
        f"{counts['values']} typed values in {counts['rows']} rows and headers of {len(checked)} "
        f"files: {counts['mismatches']} mismatches; {counts['notes']} notes on the paper's own "
        "arithmetic"
    )
    return 1 if counts["mismatches"] else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
