"""The paper's values beside psyrl's (issue 31): results.md and results.json of a hand-written
fixture, exactly (a paper value inside psyrl's interval, one outside, a row and a column the paper
does not have, a printed and a derived difference); every malformed [tables.paper] is one error
naming the file, the line and the key; `psyrl experiment <a copy of table2-qwen2.5-3b.toml>
--tables-only` prints the three-part cells; the shipped files' paper columns are psyrl's columns."""

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_tables import row, write_evaluation

from psyrl.cli.experiment import experiment_command
from psyrl.core.records import SUBDIMENSIONS
from psyrl.experiment.read import load_experiment
from psyrl.experiment.spec import ExperimentError, plan
from psyrl.experiment.stats import UNSEEDED, paired
from psyrl.experiment.tables import ALL

REPO = Path(__file__).resolve().parents[2]

FILE = """[experiment]
description = "Paper values beside psyrl's."
bootstrap = 400

[evaluate]
benchmarks = ["x.jsonl", "y.jsonl"]

[runs.a]
kind = "evaluate"
label = "Ours"
model = "models/a"

[runs.b]
kind = "evaluate"
label = "Baseline"
model = "models/b"

[runs.c]                       # psyrl's own row: not in the paper
kind = "evaluate"
label = "Extra"
model = "models/c"

[[tables]]
title = "F1 by benchmark"
columns = "benchmarks"
rows = ["a", "b", "c"]
deltas = ["b"]
compare = [["b", "a"]]

[tables.paper]
table = "Table 9"
block = "Model-X"
columns = ["y", "x"]

[tables.paper.rows]
a = { row = "Ours", values = [48.5, 40] }
b = { row = "Baseline", values = [100, 10] }

[tables.paper.differences]
a = { minus = "b", values = [-2, 30] }
"""
# F1 of items 1, 2 (benchmark x) and 3, 4 (benchmark y), one run each
SCORES = {
    "a": ([0.0, 1.0], [0.0, 1.0]),
    "b": ([0.0, 0.0], [1.0, 1.0]),
    "c": ([0.5, 0.5], [0.5, 0.5]),
}


@pytest.fixture
def fixture(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    path = tmp_path / "paper.toml"
    path.write_text(FILE)
    experiment = load_experiment(path, str(tmp_path / "runs"))
    units = {u.key: u for u in plan(experiment)}
    for run, (x, y) in SCORES.items():
        rows = [row("x", i, "", f, None) for i, f in zip((1, 2), x)]
        rows += [row("y", i, "", f, None) for i, f in zip((3, 4), y)]
        write_evaluation(units[(run, None)].eval_dir, rows)
    return experiment


def estimate(mean, low, high, items):
    return {"mean": mean, "low": low, "high": high, "seeds": 1, "items": items}


def cell(psyrl, paper=None):
    both = psyrl is not None and paper is not None
    return {
        "psyrl": psyrl,
        "paper": paper,
        "difference": psyrl["mean"] - paper if both else None,
        "inside": psyrl["low"] <= paper <= psyrl["high"] if both else None,
    }


def items_of(run: str, sign: float = 1.0) -> dict:
    x, y = SCORES[run]
    scores = dict(zip(("x/1", "x/2", "y/3", "y/4"), [100 * f for f in (*x, *y)]))
    return {UNSEEDED: scores}


def pooled(a: str, b: str) -> dict:
    """A - B over all four items: the one interval here that is not fixed by the design."""
    return paired(items_of(a), items_of(b), 400).as_dict()


def test_results_md_and_json_exactly(fixture):
    result = CliRunner().invoke(
        experiment_command,
        [str(fixture.path), "--tables-only", "--output-dir", str(fixture.output_dir)],
    )
    assert result.exit_code == 0, result.output
    out = fixture.results_dir
    saved = json.loads((out / "results.json").read_text())
    # by design: a's scores per benchmark are {0, 100}: mean 50, interval [0, 100] (a resample of
    # two items is all 0 or all 100 a quarter of the time each); b's and c's are constant
    half = estimate(50.0, 0.0, 100.0, 2)
    a_b, c_b, b_a = pooled("a", "b"), pooled("c", "b"), pooled("b", "a")
    table = {
        "title": "F1 by benchmark",
        "metric": "f1",
        "columns": ["y", "x", ALL],  # the paper's columns first, in its order
        "note": "",
        "paper": {
            "table": "Table 9",
            "columns": ["y", "x"],
            "rows": {
                "a": {"row": "Ours", "block": "Model-X"},
                "b": {"row": "Baseline", "block": "Model-X"},
            },
            "differences": {"a": {"minus": "b", "row": "Ours", "block": "Model-X"}},
        },
        "rows": [
            {
                "run": "a",
                "label": "Ours",
                "seeds": [],
                "evaluates": "models/a",
                "checkpoints": [],
                "paper_row": "Ours",
                # 48.5 and 40 lie inside [0, 100]; the pooled column is psyrl's alone
                "cells": {
                    "y": cell(half, 48.5),
                    "x": cell(half, 40.0),
                    ALL: cell(estimate(50.0, 0.0, 100.0, 4)),
                },
            },
            {
                "run": "b",
                "label": "Baseline",
                "seeds": [],
                "evaluates": "models/b",
                "checkpoints": [],
                "paper_row": "Baseline",
                # y: 100 on [100, 100] is inside (the bounds count); x: 10 is outside [0, 0]
                "cells": {
                    "y": cell(estimate(100.0, 100.0, 100.0, 2), 100.0),
                    "x": cell(estimate(0.0, 0.0, 0.0, 2), 10.0),
                    ALL: cell(estimate(50.0, 0.0, 100.0, 4)),
                },
            },
            {
                "run": "c",
                "label": "Extra",
                "seeds": [],
                "evaluates": "models/c",
                "checkpoints": [],
                "paper_row": None,
                "cells": {
                    "y": cell(estimate(50.0, 50.0, 50.0, 2)),
                    "x": cell(estimate(50.0, 50.0, 50.0, 2)),
                    ALL: cell(estimate(50.0, 50.0, 50.0, 4)),
                },
            },
        ],
        "deltas": {
            "b": [
                # a - b: y items 0 - 100, 100 - 100; x items 0 - 0, 100 - 0; the paper's printed
                # differences (-2, +30), not the difference of its values (-51.5, +30)
                {
                    "run": "a",
                    "label": "Ours",
                    "cells": {
                        "y": cell(estimate(-50.0, -100.0, 0.0, 2), -2.0),
                        "x": cell(estimate(50.0, 0.0, 100.0, 2), 30.0),
                        ALL: cell(a_b),
                    },
                },
                {
                    "run": "c",
                    "label": "Extra",
                    "cells": {
                        "y": cell(estimate(-50.0, -50.0, -50.0, 2)),
                        "x": cell(estimate(50.0, 50.0, 50.0, 2)),
                        ALL: cell(c_b),
                    },
                },
            ]
        },
        # b - a: no printed difference, so the difference of the paper's values: 100 - 48.5, 10 - 40
        "compare": [
            {
                "a": "b",
                "b": "a",
                "label": "Baseline − Ours",
                "cells": {
                    "y": cell(estimate(50.0, 0.0, 100.0, 2), 51.5),
                    "x": cell(estimate(-50.0, -100.0, 0.0, 2), -30.0),
                    ALL: cell(b_a),
                },
            }
        ],
    }
    root = fixture.run_root
    assert saved == {
        "experiment": "paper",
        "file": str(fixture.path),
        "description": "Paper values beside psyrl's.",
        "runs": [
            {
                "run": r,
                "seed": None,
                "title": r,
                "dir": str(root / r),
                "status": "done",
                "wall_s": None,
            }
            for r in "abc"
        ],
        "tables": [table],
    }

    def pooled_cell(e: dict) -> str:
        return f"{e['mean']:+.1f} [{e['low']:+.1f}, {e['high']:+.1f}] · no paper value"

    expected = f"""# paper

Paper values beside psyrl's.

`psyrl experiment {fixture.path}`: 3 of 3 runs done; 0.0 min of run time recorded (runs of \
earlier invocations included); runs in {root}/.

## F1 by benchmark

F1 ×100. A cell: psyrl's mean over seeds [95 % bootstrap interval over seeds and items] · the \
paper's value (Table 9: the Model-X block) · psyrl − paper (inside or outside: whether the paper's \
value lies inside psyrl's interval).

| run | y | x | all items |
| --- | ---: | ---: | ---: |
| Ours (1 run; paper: Ours) | 50.0 [0.0, 100.0] · paper 48.50 · +1.5 (inside) | \
50.0 [0.0, 100.0] · paper 40.00 · +10.0 (inside) | 50.0 [0.0, 100.0] · no paper value |
| Baseline (1 run; paper: Baseline) | 100.0 [100.0, 100.0] · paper 100.00 · +0.0 (inside) | \
0.0 [0.0, 0.0] · paper 10.00 · -10.0 (outside) | 50.0 [0.0, 100.0] · no paper value |
| Extra (1 run; not in the paper) | 50.0 [50.0, 50.0] · no paper value | \
50.0 [50.0, 50.0] · no paper value | 50.0 [50.0, 50.0] · no paper value |

What each row evaluates:

- Ours: models/a
- Baseline: models/b
- Extra: models/c

Δ vs Baseline (paired by seed and item; the paper's Δ: its printed difference where it prints \
one, else the difference of its two values):

| run | y | x | all items |
| --- | ---: | ---: | ---: |
| Ours | -50.0 [-100.0, +0.0] · paper -2.00 · -48.0 (inside) | \
+50.0 [+0.0, +100.0] · paper +30.00 · +20.0 (inside) | {pooled_cell(a_b)} |
| Extra | -50.0 [-50.0, -50.0] · no paper value | +50.0 [+50.0, +50.0] · no paper value | \
{pooled_cell(c_b)} |

Paired comparisons (a difference whose interval excludes 0 is one the seeds and items support; \
the paper's Δ: its printed difference where it prints one, else the difference of its two values):

| A − B | y | x | all items |
| --- | ---: | ---: | ---: |
| Baseline − Ours | +50.0 [+0.0, +100.0] · paper +51.50 · -1.5 (inside) | \
-50.0 [-100.0, +0.0] · paper -30.00 · -20.0 (inside) | {pooled_cell(b_a)} |

## Runs

| run | status | wall | directory |
| --- | ---: | ---: | ---: |
| a | done | – | {root / "a"} |
| b | done | – | {root / "b"} |
| c | done | – | {root / "c"} |
"""
    assert (out / "results.md").read_text() == expected


def test_a_table_not_run_yet_shows_the_papers_values(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    path = tmp_path / "paper.toml"
    path.write_text(FILE)
    experiment = load_experiment(path, str(tmp_path / "runs"))
    result = CliRunner().invoke(
        experiment_command, [str(path), "--tables-only", "--output-dir", str(tmp_path / "runs")]
    )
    assert result.exit_code == 0, result.output
    saved = json.loads((experiment.results_dir / "results.json").read_text())["tables"][0]
    assert saved["columns"] == ["y", "x", ALL]
    assert saved["rows"][0]["cells"]["y"] == cell(None, 48.5)
    # the printed difference a - b, beside an empty delta row
    assert [r["run"] for r in saved["deltas"]["b"]] == ["a"]
    markdown = (experiment.results_dir / "results.md").read_text()
    assert "| Ours (not run yet; paper: Ours) | – · paper 48.50 | – · paper 40.00 | – |" in markdown
    assert "| Ours | – · paper -2.00 | – · paper +30.00 | – |" in markdown


# ---------------------------------------------------------------- malformed [tables.paper]

HEAD = """[evaluate]
benchmarks = ["x.jsonl"]

[runs.a]
kind = "evaluate"
model = "m"

[runs.b]
kind = "evaluate"
model = "m"

[[tables]]
rows = ["a", "b"]
"""
PAPER = '[tables.paper]\ntable = "Table 1"\ncolumns = ["x", "y"]\n'
ROWS = "[tables.paper.rows]\n"

CASES = [
    ("not-a-table", HEAD + 'paper = "Table 1"  # <-\n', "paper must be a table ([tables.paper])"),
    (
        "unknown-key",
        HEAD + PAPER + 'blocks = "Q"  # <-\n' + ROWS + 'a = { row = "A", values = [1, 2] }\n',
        "paper: unknown key 'blocks' (valid: block, columns, differences, rows, table)",
    ),
    (
        "no-table-name",
        HEAD
        + '[tables.paper]  # <-\ncolumns = ["x"]\n'
        + ROWS
        + 'a = { row = "A", values = [1] }\n',
        'paper needs table = where the values are printed (e.g. "Table 2", "§4.6")',
    ),
    (
        "table-name-not-a-string",
        HEAD + "[tables.paper]\ntable = 2  # <-\n",
        "table must be a str, got 2",
    ),
    (
        "columns-repeated",
        HEAD + '[tables.paper]\ntable = "T"\ncolumns = ["x", "x"]  # <-\n',
        "paper needs columns = [distinct column names]",
    ),
    (
        "no-columns",
        HEAD + '[tables.paper]  # <-\ntable = "T"\n',
        "paper needs columns = [distinct column names]",
    ),
    (
        "no-rows",
        HEAD + '[tables.paper]  # <-\ntable = "T"\ncolumns = ["x"]\n',
        "paper has no rows: add [tables.paper.rows]",
    ),
    (
        "row-of-another-table",
        HEAD + PAPER + ROWS + 'c = { row = "C", values = [1, 2] }  # <-\n',
        "paper: 'c' is not a row of this table (rows: a, b)",
    ),
    (
        "rows-not-a-table",
        HEAD + PAPER + 'rows = ["a"]  # <-\n',
        "paper: rows must be a table of run = {...}",
    ),
    (
        "entry-not-a-table",
        HEAD + PAPER + ROWS + "a = [1, 2]  # <-\n",
        "paper: rows.a must be a table: { row = ..., values = [...] }",
    ),
    (
        "unknown-row-key",
        HEAD + PAPER + ROWS + 'a = { row = "A", value = [1, 2] }  # <-\n',
        "paper: rows.a: unknown key 'value' (valid: block, row, values)",
    ),
    (
        "no-row-label",
        HEAD + PAPER + ROWS + "a = { values = [1, 2] }  # <-\n",
        "paper: rows.a needs row = the paper's row label (or sentence)",
    ),
    (
        "too-few-values",
        HEAD + PAPER + ROWS + 'a = { row = "A", values = [1] }  # <-\n',
        "paper: rows.a needs values = 2 numbers (one per column: x, y), got [1]",
    ),
    (
        "value-not-a-number",
        HEAD + PAPER + ROWS + 'a = { row = "A", values = [1, "26.89%"] }  # <-\n',
        "paper: rows.a needs values = 2 numbers (one per column: x, y), got [1, '26.89%']",
    ),
    (
        "value-a-bool",
        HEAD + PAPER + ROWS + 'a = { row = "A", values = [1, true] }  # <-\n',
        "needs values = 2 numbers",
    ),
    (
        "no-values",
        HEAD + PAPER + ROWS + 'a = { row = "A" }  # <-\n',
        "paper: rows.a needs values = 2 numbers (one per column: x, y), got None",
    ),
    (
        "block-not-a-string",
        HEAD + PAPER + ROWS + 'a = { row = "A", block = 1, values = [1, 2] }  # <-\n',
        "block must be a str, got 1",
    ),
    (
        "difference-without-minus",
        HEAD + PAPER + ROWS + 'b = { row = "B", values = [1, 2] }\n'
        "[tables.paper.differences]\n"
        "b = { values = [1, 2] }  # <-\n",
        "paper: differences.b needs minus = the row it is taken against (rows: a, b), got ''",
    ),
    (
        "difference-against-no-row",
        HEAD + PAPER + ROWS + 'b = { row = "B", values = [1, 2] }\n'
        "[tables.paper.differences]\n"
        'b = { minus = "z", values = [1, 2] }  # <-\n',
        "paper: differences.b needs minus = the row it is taken against (rows: a, b), got 'z'",
    ),
    (
        "difference-without-row-label",
        HEAD
        + PAPER
        + "[tables.paper.differences]\n"
        + 'b = { minus = "a", values = [1, 2] }  # <-\n',
        "paper: differences.b needs row = the paper's row label (or sentence)",
    ),
]


def marked_line(text: str) -> int:
    lines = [n for n, line in enumerate(text.splitlines(), 1) if "# <-" in line]
    assert len(lines) == 1
    return lines[0]


@pytest.mark.parametrize("text,fragment", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_paper_values_name_file_line_and_key(tmp_path, monkeypatch, text, fragment):
    monkeypatch.chdir(REPO)
    path = tmp_path / "exp.toml"
    path.write_text(text)
    with pytest.raises(ExperimentError) as caught:
        load_experiment(path)
    message = str(caught.value)
    assert message.startswith(f"{path}:{marked_line(text)}: "), message
    assert fragment in message, message
    assert "\n" not in message


def test_a_difference_takes_the_label_of_its_row(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    path = tmp_path / "exp.toml"
    path.write_text(
        HEAD
        + '[tables.paper]\ntable = "Table 1"\nblock = "Q"\ncolumns = ["x", "y"]\n'
        + ROWS
        + 'b = { row = "B", block = "", values = [1, 2] }\n'
        + '[tables.paper.differences]\nb = { minus = "a", values = [0.5, -1] }\n'
    )
    paper = load_experiment(path).tables[0].paper
    assert (paper.table, paper.columns) == ("Table 1", ("x", "y"))
    difference = paper.differences["b"]
    assert (difference.row, difference.block, difference.minus) == ("B", "", "a")
    assert difference.values == (0.5, -1.0)
    assert paper.value("b", "y") == 2.0 and paper.value("a", "y") is None
    assert paper.value("b", ALL) is None  # a column the paper does not have
    # printed against a; against anything else there is no difference (a has no values)
    assert paper.difference("b", "a", "y") == -1.0
    assert paper.difference("a", "b", "y") is None


# ---------------------------------------------------------------- the shipped files

# subdimension tasks: what a StimuliQA evaluation's predictions carry
TASKS = {ALL, *SUBDIMENSIONS}


@pytest.mark.parametrize(
    "path", sorted((REPO / "experiments").glob("*qwen*.toml")), ids=lambda p: p.stem
)
def test_shipped_paper_columns_are_psyrls_columns(path, monkeypatch):
    monkeypatch.chdir(REPO)
    experiment = load_experiment(path)
    for table in experiment.tables:
        if table.paper is None:
            continue
        if table.columns == "benchmarks":
            names = {*experiment.eval_benchmarks, ALL}
        elif table.columns == "index":
            names = {"index 1", "index 2", "index 3", ALL}
        else:
            names = TASKS
        assert set(table.paper.columns) <= names, (table.title, table.paper.columns)


def test_table2_file_prints_three_part_cells(tmp_path, monkeypatch):
    """`psyrl experiment <a copy of table2-qwen2.5-3b.toml> --tables-only` on hand-written
    predictions: Naïve (3 seeds) and the group-scope variant (seed 0)."""
    monkeypatch.chdir(REPO)
    copy = tmp_path / "table2-qwen2.5-3b.toml"
    shutil.copy(REPO / "experiments" / copy.name, copy)
    experiment = load_experiment(copy, str(tmp_path / "runs"))
    units = {u.key: u for u in plan(experiment)}
    # one item per subdimension at F1 0.1 (10 x 100): Naïve's 13.44 ... lie outside [10, 10],
    # except where an item scores its paper value
    tasks = sorted(SUBDIMENSIONS)
    for seed in (0, 1, 2):
        rows = [row("stimuliqa", i, task, 0.1, None) for i, task in enumerate(tasks)]
        write_evaluation(units[("naive", seed)].eval_dir, rows)
    write_evaluation(
        units[("bilateral-group", 0)].eval_dir,
        [row("stimuliqa", i, task, 0.5, None) for i, task in enumerate(tasks)],
    )
    result = CliRunner().invoke(
        experiment_command, [str(copy), "--tables-only", "--output-dir", str(tmp_path / "runs")]
    )
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    # the paper's column order; every cell: psyrl [interval] · paper · difference (outside)
    assert (
        "| run | specific emotions | targeted emotions | direction of change | self identification "
        "| needs fulfilment | national theme | all items |" in lines
    )
    paper = [13.44, 13.27, 19.97, 16.20, 15.19, 18.68, 15.34]  # Table 2, 3B, Naïve
    naive = [f"10.0 [10.0, 10.0] · paper {p:.2f} · {10 - p:+.1f} (outside)" for p in paper]
    assert "| Naïve (3 seeds; paper: Naïve) | " + " | ".join(naive) + " |" in lines
    # a row psyrl adds: its cells say the paper has no value
    assert (
        '| + BR, per-group advantages (A.3\'s "grpo") (seed 0; not in the paper) | '
        + " | ".join(["50.0 [50.0, 50.0] · no paper value"] * 7)
        + " |"
    ) in lines
    # a row not run yet shows the paper's value alone
    assert any(
        line.startswith("| SFT (not run yet; paper: SFT) | – · paper 22.45 |") for line in lines
    )
    # the SFT row states its checkpoint
    assert "- SFT: the median-F1 checkpoint (appendix B) of SFT run sft" in lines
    # Δ vs Naïve: CoT's printed +0.42 beside no estimate yet
    assert any(line.startswith("| CoT | – · paper +0.42 |") for line in lines)
    saved = json.loads((experiment.results_dir / "results.json").read_text())["tables"][0]
    naive = saved["rows"][0]["cells"]["all items"]
    assert naive["paper"] == 15.34 and naive["inside"] is False
    assert naive["difference"] == pytest.approx(10.0 - 15.34)
