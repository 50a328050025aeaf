"""The experiment's tables from its evaluations' predictions.jsonl: each cell a mean over seeds with
its 95 % bootstrap interval (psyrl.experiment.stats), Table 2's delta tables against named rows, and
paired comparisons."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from psyrl.eval.benchmarks import read_predictions
from psyrl.experiment.spec import Experiment, TableSpec, Unit
from psyrl.experiment.stats import UNSEEDED, bootstrap, paired

ALL = "all items"
SEP = " / "  # benchmark / task, where a table's tasks come from several benchmarks
Scores = dict[int, dict[str, float]]  # seed (UNSEEDED for a run without) -> item id -> score


def row_scores(units: Sequence[Unit], table: TableSpec) -> dict[str, Scores]:
    """Column -> scores of one run's finished evaluations; {} when none is finished."""
    columns: dict[str, Scores] = {}
    for unit in units:
        path = unit.eval_dir / "predictions.jsonl"
        if not (unit.eval_dir / "results.json").is_file():
            continue
        rows, _ = read_predictions(path)
        seed = UNSEEDED if unit.seed is None else unit.seed
        for r in rows:
            if table.columns == "tasks" and table.benchmark and r["benchmark"] != table.benchmark:
                continue
            value = _metric(r, table.metric)
            if value is None:
                continue
            column = (
                r["benchmark"]
                if table.columns == "benchmarks"
                else r["task"]
                if table.benchmark
                else f"{r['benchmark']}{SEP}{r['task']}"
            )
            item = f"{r['benchmark']}/{r['id']}"
            columns.setdefault(column, {}).setdefault(seed, {})[item] = value
            columns.setdefault(ALL, {}).setdefault(seed, {})[item] = value
    return columns


def _metric(row: dict, metric: str) -> float | None:
    if metric == "f1":
        return 100 * row["f1"]
    correct = row.get("correct")
    return None if correct is None else 100.0 * bool(correct)


def build_table(experiment: Experiment, table: TableSpec, units: Sequence[Unit]) -> dict:
    """{title, metric, columns, rows: [{run, label, seeds, cells}], deltas: {base: rows}, compare:
    [...]}; a cell is an Estimate's dict, or None where the run has no such column."""
    by_run = {
        name: [u for u in units if u.run.name == name]
        for name in {*table.rows, *table.deltas, *(x for p in table.compare for x in p)}
    }
    scores = {name: row_scores(group, table) for name, group in by_run.items()}
    if table.columns == "tasks" and not table.benchmark:
        # one benchmark (the usual case): its tasks by their own names
        named = {c.partition(SEP)[0] for run in scores.values() for c in run if c != ALL}
        if len(named) <= 1:
            scores = {
                name: {c.partition(SEP)[2] if c != ALL else c: v for c, v in run.items()}
                for name, run in scores.items()
            }
    columns = [c for c in _first_seen(scores[name] for name in table.rows) if c != ALL] + [ALL]
    resamples = experiment.resamples

    def cells(name: str, against: str | None = None) -> dict:
        out = {}
        for column in columns:
            mine = scores[name].get(column)
            theirs = scores[against].get(column) if against else None
            if not mine or (against and not theirs):
                out[column] = None
            else:
                try:
                    estimate = (
                        paired(mine, theirs, resamples) if against else bootstrap(mine, resamples)
                    )
                except ValueError:  # no seed or item in common (runs of other --seeds)
                    out[column] = None
                    continue
                out[column] = estimate.as_dict()
        return out

    def label(name: str) -> str:
        return experiment.runs[name].label or name

    result = {
        "title": table.title,
        "metric": table.metric,
        "columns": columns,
        "note": table.note,
        "rows": [
            {"run": n, "label": label(n), "seeds": _seeds(scores[n]), "cells": cells(n)}
            for n in table.rows
        ],
        "deltas": {
            base: [
                {"run": n, "label": label(n), "cells": cells(n, base)}
                for n in table.rows
                if n != base and scores[n] and scores[base]
            ]
            for base in table.deltas
        },
        "compare": [
            {
                "a": a,
                "b": b,
                "label": f"{label(a)} − {label(b)}",
                "cells": cells(a, b) if scores[a] and scores[b] else {},
            }
            for a, b in table.compare
        ],
    }
    return result


def _first_seen(groups) -> list[str]:
    seen: dict[str, None] = {}
    for group in groups:
        seen.update(dict.fromkeys(group))
    return list(seen)


def _seeds(columns: dict[str, Scores]) -> list[int]:
    return sorted(s for s in columns.get(ALL, {}) if s >= 0)


# ---------------------------------------------------------------- markdown


def _cell(cell: dict | None, signed: bool = False) -> str:
    if cell is None:
        return "–"
    sign = "+" if signed else ""
    return f"{cell['mean']:{sign}.1f} [{cell['low']:{sign}.1f}, {cell['high']:{sign}.1f}]"


def _grid(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def table_markdown(table: dict) -> str:
    metric = "F1 ×100" if table["metric"] == "f1" else "accuracy %"
    columns = table["columns"]
    parts = [f"## {table['title']}", ""]
    if table["note"]:
        parts += [table["note"], ""]
    parts += [f"{metric}: mean over seeds [95 % bootstrap interval over seeds and items].", ""]
    rows = []
    for row in table["rows"]:
        seeds = row["seeds"]
        runs = (
            f"{len(seeds)} seeds"
            if len(seeds) > 1
            else f"seed {seeds[0]}"
            if seeds
            else ("1 run" if row["cells"][ALL] else "not run yet")
        )
        rows.append([f"{row['label']} ({runs})"] + [_cell(row["cells"][c]) for c in columns])
    parts += [_grid(["run"] + columns, rows), ""]
    for base, delta_rows in table["deltas"].items():
        label = next((r["label"] for r in table["rows"] if r["run"] == base), base)
        parts += [f"Δ vs {label} (paired by seed and item):", ""]
        parts += [
            _grid(
                ["run"] + columns,
                [[r["label"]] + [_cell(r["cells"][c], True) for c in columns] for r in delta_rows],
            ),
            "",
        ]
    if table["compare"]:
        parts += [
            "Paired comparisons (a difference whose interval excludes 0 is one the seeds "
            "and items support):",
            "",
        ]
        parts += [
            _grid(
                ["A − B"] + columns,
                [
                    [c["label"]] + [_cell(c["cells"].get(col), True) for col in columns]
                    for c in table["compare"]
                ],
            ),
            "",
        ]
    return "\n".join(parts)


def results_markdown(experiment: Experiment, tables: list[dict], runs: list[dict]) -> str:
    done = sum(r["status"] == "done" for r in runs)
    wall = sum(r.get("wall_s") or 0 for r in runs)
    parts = [f"# {experiment.name}", ""]
    if experiment.description:
        parts += [experiment.description, ""]
    parts += [
        f"`psyrl experiment {experiment.path}`: {done} of {len(runs)} runs done; "
        f"{wall / 60:.1f} min of run time recorded (runs of earlier invocations included); "
        f"runs in {experiment.run_root}/.",
        "",
    ]
    parts += [table_markdown(t) for t in tables]
    parts += [
        "## Runs",
        "",
        _grid(
            ["run", "status", "wall", "directory"],
            [
                [
                    r["title"],
                    r["status"],
                    f"{r['wall_s']:.0f} s" if r.get("wall_s") else "–",
                    r["dir"],
                ]
                for r in runs
            ],
        ),
        "",
    ]
    return "\n".join(parts)


def write_results(experiment: Experiment, tables: list[dict], runs: list[dict]) -> Path:
    """results.md and results.json in experiments/<name>/: beside the file, or under the working
    directory for a file shipped in the package."""
    import json

    from psyrl.core.atomic import write_text

    out = experiment.results_dir
    out.mkdir(parents=True, exist_ok=True)
    write_text(
        out / "results.json",
        json.dumps(
            {
                "experiment": experiment.name,
                "file": str(experiment.path),
                "description": experiment.description,
                "runs": runs,
                "tables": tables,
            },
            indent=1,
            ensure_ascii=False,
        )
        + "\n",
    )
    write_text(out / "results.md", results_markdown(experiment, tables, runs))
    return out
