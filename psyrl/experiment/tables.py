"""The experiment's tables from its evaluations' predictions.jsonl: each cell a mean over seeds with
its 95 % bootstrap interval (psyrl.experiment.stats), Table 2's delta tables against named rows, and
paired comparisons; beside each, the paper's value from the file's [tables.paper] (issue 31), the
difference, and whether the paper's value lies inside psyrl's interval. Each row says what it
evaluates: which checkpoint of which run, or which model."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from psyrl.eval.benchmarks import read_predictions
from psyrl.eval.lengths import BENCHMARK, INDICES, TASK
from psyrl.experiment.spec import Experiment, PaperValues, TableSpec, Unit, partner_seed, unit_dir
from psyrl.experiment.stats import UNSEEDED, bootstrap, paired

ALL = "all items"
SEP = " / "  # benchmark / task, where a table's tasks come from several benchmarks
Scores = dict[int, dict[str, float]]  # seed (UNSEEDED for a run without) -> item id -> score
METRIC_NAMES = {
    "f1": "F1 ×100",
    "accuracy": "accuracy %",
    "valid": "valid samples (non-zero F1)",
    "tokens": "response length (tokens, every response)",
}
PAPER_DIGITS = {"f1": 2, "accuracy": 2, "valid": 0, "tokens": 0}  # as the paper prints them
RULE_NAMES = {
    "median": "median-F1 checkpoint (appendix B)",
    "best": "best-F1 checkpoint",
    "last": "last checkpoint",
}
KIND_NAMES = {"sft": "SFT run", "tgrpo": "T-GRPO run", "evaluate": "evaluation"}


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
            column = _column(r, table)
            value = _metric(r, table.metric)
            if column is None or value is None:
                continue
            item = f"{r['benchmark']}/{r['id']}"
            columns.setdefault(column, {}).setdefault(seed, {})[item] = value
            columns.setdefault(ALL, {}).setdefault(seed, {})[item] = value
    return columns


def _column(row: dict, table: TableSpec) -> str | None:
    """The row's column in `table`, or None where the table leaves it out."""
    if table.columns == "benchmarks":
        return row["benchmark"]
    if table.columns == "index":  # Figure 6: ToMbench's Unexpected Outcome Test by question index
        wanted = row["benchmark"] == BENCHMARK and row["task"] == TASK
        return f"index {row['index']}" if wanted and row.get("index") in INDICES else None
    if table.benchmark:
        return row["task"] if row["benchmark"] == table.benchmark else None
    return f"{row['benchmark']}{SEP}{row['task']}"


def _metric(row: dict, metric: str) -> float | None:
    if metric == "f1":
        return 100 * row["f1"]
    if metric == "valid":  # Figure 6 counts the responses with non-zero F1
        return float(row["f1"] > 0)
    if metric == "tokens":  # every response, so that two rows pair on the same items
        return float(row["tokens"])
    correct = row.get("correct")
    return None if correct is None else 100.0 * bool(correct)


def table_units(experiment: Experiment, name: str, units: Sequence[Unit]) -> list[Unit]:
    """The units whose evaluations make a row: the run's own, or a join's runs'."""
    parts = experiment.runs[name].parts or (name,)
    return [u for u in units if u.run.name in parts]


def build_table(experiment: Experiment, table: TableSpec, units: Sequence[Unit]) -> dict:
    """{title, metric, columns, note, paper, rows: [{run, label, seeds, evaluates, checkpoints,
    paper_row, cells}], deltas: {base: rows}, compare: [...]}. A cell is {psyrl: an Estimate's dict
    or None, paper: the paper's value or None, difference: psyrl - paper, inside: whether the
    paper's value lies in psyrl's interval}."""
    names = {*table.rows, *table.deltas, *(x for p in table.compare for x in p)}
    scores = {name: row_scores(table_units(experiment, name, units), table) for name in names}
    if table.columns == "tasks" and not table.benchmark:
        # one benchmark (the usual case): its tasks by their own names
        named = {c.partition(SEP)[0] for run in scores.values() for c in run if c != ALL}
        if len(named) <= 1:
            scores = {
                name: {c.partition(SEP)[2] if c != ALL else c: v for c, v in run.items()}
                for name, run in scores.items()
            }
    paper = table.paper
    # the paper's columns first, in its order: a table not run yet still shows its numbers
    ordered = [c for c in (paper.columns if paper else ()) if c != ALL]
    seen = _first_seen(scores[name] for name in table.rows)
    columns = ordered + [c for c in seen if c not in ordered and c != ALL] + [ALL]
    resamples = experiment.resamples

    def cells(name: str, against: str | None = None) -> dict:
        out = {}
        for column in columns:
            mine = scores[name].get(column)
            theirs = scores[against].get(column) if against else None
            estimate = None
            if mine and (theirs or not against):
                try:
                    found = (
                        paired(mine, theirs, resamples) if against else bootstrap(mine, resamples)
                    )
                    estimate = _counted(found.as_dict(), table.metric)
                except ValueError:  # no seed or item in common (runs of other --seeds)
                    estimate = None
            if paper is None:
                value = None
            elif against:
                value = paper.difference(name, against, column)
            else:
                value = paper.value(name, column)
            out[column] = beside(estimate, value)
        return out

    def label(name: str) -> str:
        return experiment.runs[name].label or name

    def printed(name: str, base: str) -> bool:
        """Whether the paper has a difference for this pair in some column."""
        return paper is not None and any(
            paper.difference(name, base, c) is not None for c in columns
        )

    return {
        "title": table.title,
        "metric": table.metric,
        "columns": columns,
        "note": table.note,
        "paper": _paper_json(paper),
        "rows": [
            {
                "run": n,
                "label": label(n),
                "seeds": _seeds(scores[n]),
                "evaluates": evaluates(experiment, n),
                "checkpoints": chosen_checkpoints(experiment, n, units),
                "paper_row": paper.rows[n].row if paper and n in paper.rows else None,
                "cells": cells(n),
            }
            for n in table.rows
        ],
        "deltas": {
            base: [
                {"run": n, "label": label(n), "cells": cells(n, base)}
                for n in table.rows
                if n != base and ((scores[n] and scores[base]) or printed(n, base))
            ]
            for base in table.deltas
        },
        "compare": [
            {"a": a, "b": b, "label": f"{label(a)} − {label(b)}", "cells": cells(a, b)}
            for a, b in table.compare
        ],
    }


def _counted(estimate: dict, metric: str) -> dict:
    """A `valid` cell as a count of responses (the mean of 0/1 scores times the items)."""
    if metric != "valid":
        return estimate
    n = estimate["items"]
    return {**estimate, **{k: estimate[k] * n for k in ("mean", "low", "high")}}


def beside(estimate: dict | None, paper: float | None) -> dict:
    """psyrl's estimate and the paper's value side by side: the difference and whether the paper's
    value lies inside psyrl's interval (None where either is missing)."""
    both = estimate is not None and paper is not None
    return {
        "psyrl": estimate,
        "paper": paper,
        "difference": round(estimate["mean"] - paper, 6) if both else None,
        "inside": estimate["low"] <= paper <= estimate["high"] if both else None,
    }


def _paper_json(paper: PaperValues | None) -> dict | None:
    if paper is None:
        return None
    return {
        "table": paper.table,
        "columns": list(paper.columns),
        "rows": {r: {"row": e.row, "block": e.block} for r, e in paper.rows.items()},
        "differences": {
            r: {"minus": e.minus, "row": e.row, "block": e.block}
            for r, e in paper.differences.items()
        },
    }


def evaluates(experiment: Experiment, name: str) -> str:
    """What a row's evaluation scored: which checkpoint of which run, or which model."""
    run = experiment.runs[name]
    if run.kind == "join":
        return "one model per benchmark: " + "; ".join(
            f"{', '.join(experiment.runs[p].benchmarks)}: {evaluates(experiment, p)}"
            + (
                f" (runs with --opt-in {experiment.runs[p].opt_in})"
                if experiment.runs[p].opt_in
                else ""
            )
            for p in run.parts
        )
    if run.kind in ("sft", "tgrpo"):
        return "this run's final export (hf/)"
    if not run.model:  # --engine openai: the endpoint's model
        model = run.args[run.args.index("--api-model") + 1] if "--api-model" in run.args else "?"
        return f"{model} through --engine openai"
    target, _, rule = run.model.partition("@")
    if target not in experiment.runs:
        return run.model
    of = f"{KIND_NAMES.get(experiment.runs[target].kind, 'run')} {target}"
    return f"the {RULE_NAMES[rule]} of {of}" if rule else f"the final export (hf/) of {of}"


def chosen_checkpoints(experiment: Experiment, name: str, units: Sequence[Unit]) -> list[dict]:
    """For a row of `run@rule`: the checkpoint the rule chose for each seed that has one on disk
    ({seed, step, valid_f1}), or why it chose none where a checkpoint is damaged ({seed,
    damaged})."""
    from psyrl.core.checkpoints import DamagedCheckpoint, select_checkpoint

    run = experiment.runs[name]
    target, _, rule = run.model.partition("@")
    if run.kind != "evaluate" or not rule or target not in experiment.runs:
        return []  # a trainer's row is its final export, whatever it started from
    chosen = []
    for unit in (u for u in units if u.run.name == name):
        origin = experiment.runs[target]
        directory = unit_dir(experiment, origin, partner_seed(origin, unit.seed))
        try:
            step, score, _ = select_checkpoint(directory, rule)
        except DamagedCheckpoint as e:  # a damaged score chooses nothing, and says so
            chosen.append({"seed": unit.seed, "damaged": str(e)})
            continue
        except (FileNotFoundError, OSError, ValueError, KeyError):
            continue  # not trained yet
        chosen.append({"seed": unit.seed, "step": step, "valid_f1": score})
    return chosen


def _first_seen(groups) -> list[str]:
    seen: dict[str, None] = {}
    for group in groups:
        seen.update(dict.fromkeys(group))
    return list(seen)


def _seeds(columns: dict[str, Scores]) -> list[int]:
    return sorted(s for s in columns.get(ALL, {}) if s >= 0)


# ---------------------------------------------------------------- markdown


def _cell(cell: dict, metric: str, signed: bool, with_paper: bool) -> str:
    """psyrl's value [interval] · the paper's value · the difference (inside or outside)."""
    sign = "+" if signed else ""
    estimate, paper = cell["psyrl"], cell["paper"]
    own = (
        "–"
        if estimate is None
        else f"{estimate['mean']:{sign}.1f} [{estimate['low']:{sign}.1f}, "
        f"{estimate['high']:{sign}.1f}]"
    )
    if not with_paper:
        return own
    if paper is None:
        return own if estimate is None else f"{own} · no paper value"
    text = f"{own} · paper {paper:{sign}.{PAPER_DIGITS[metric]}f}"
    if estimate is not None:
        where = "inside" if cell["inside"] else "outside"
        text += f" · {cell['difference']:+.1f} ({where})"
    return text


def _grid(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "| --- |" + " ---: |" * (len(header) - 1)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _source(paper: dict) -> str:
    """Where the paper prints a table's values: "Table 2: the Qwen2.5-3B-Instruct block"."""
    blocks = sorted({e["block"] for e in (*paper["rows"].values(), *paper["differences"].values())})
    parts = ["the rows above its blocks"] if "" in blocks and len(blocks) > 1 else []
    parts += [f"the {b} block" for b in blocks if b]
    return paper["table"] + (": " + " and ".join(parts) if parts else "")


def table_markdown(table: dict) -> str:
    metric, columns, paper = table["metric"], table["columns"], table["paper"]
    with_paper = paper is not None
    parts = [f"## {table['title']}", ""]
    if table["note"]:
        parts += [table["note"], ""]
    if with_paper:
        parts += [
            f"{METRIC_NAMES[metric]}. A cell: psyrl's mean over seeds [95 % bootstrap interval "
            f"over seeds and items] · the paper's value ({_source(paper)}) · psyrl − paper "
            "(inside or outside: whether the paper's value lies inside psyrl's interval).",
            "",
        ]
    else:
        parts += [
            f"{METRIC_NAMES[metric]}: mean over seeds [95 % bootstrap interval over seeds and "
            "items]. The file gives no paper values for this table.",
            "",
        ]
    rows = []
    for row in table["rows"]:
        seeds = row["seeds"]
        runs = (
            f"{len(seeds)} seeds"
            if len(seeds) > 1
            else f"seed {seeds[0]}"
            if seeds
            else ("1 run" if row["cells"][ALL]["psyrl"] else "not run yet")
        )
        if with_paper:
            runs += f"; paper: {row['paper_row']}" if row["paper_row"] else "; not in the paper"
        rows.append(
            [f"{row['label']} ({runs})"]
            + [_cell(row["cells"][c], metric, False, with_paper) for c in columns]
        )
    parts += [_grid(["run"] + columns, rows), ""]
    parts += ["What each row evaluates:", ""]
    parts += [f"- {row['label']}: {row['evaluates']}{_steps(row)}" for row in table["rows"]]
    parts += [""]
    derived = (
        "; the paper's Δ: its printed difference where it prints one, else the difference of its "
        "two values"
        if with_paper
        else ""
    )
    for base, delta_rows in table["deltas"].items():
        label = next((r["label"] for r in table["rows"] if r["run"] == base), base)
        parts += [f"Δ vs {label} (paired by seed and item{derived}):", ""]
        parts += [
            _grid(
                ["run"] + columns,
                [
                    [r["label"]] + [_cell(r["cells"][c], metric, True, with_paper) for c in columns]
                    for r in delta_rows
                ],
            ),
            "",
        ]
    if table["compare"]:
        parts += [
            "Paired comparisons (a difference whose interval excludes 0 is one the seeds "
            f"and items support{derived}):",
            "",
        ]
        parts += [
            _grid(
                ["A − B"] + columns,
                [
                    [c["label"]]
                    + [_cell(c["cells"][col], metric, True, with_paper) for col in columns]
                    for c in table["compare"]
                ],
            ),
            "",
        ]
    return "\n".join(parts)


def _steps(row: dict) -> str:
    """The checkpoints a rule chose, as read from the run directories."""
    if not row["checkpoints"]:
        return ""
    chosen = [
        ("" if c["seed"] is None else f"seed {c['seed']}: ")
        + (
            f"none, {c['damaged']}"
            if "damaged" in c
            else f"step {c['step']}, valid F1 {c['valid_f1']:.4f}"
        )
        for c in row["checkpoints"]
    ]
    return " (" + "; ".join(chosen) + ")"


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
    figures = [r for r in runs if r.get("writes", "").endswith(".png")]
    if figures:
        parts += ["## Figures", ""]
        parts += [
            f"- {r['title']}: {r['writes']}" + ("" if r["status"] == "done" else " (not yet)")
            for r in figures
        ]
        parts += [""]
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
