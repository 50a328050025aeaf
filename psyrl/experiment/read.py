"""Reading an experiment file (issue 22): every table and key checked, every problem one
ExperimentError naming the file, its line and the key; the result is a psyrl/experiment/spec.py
`Experiment`. Reads files only: nothing here runs or imports torch.

    [experiment]                 description, output_dir, nproc, torchrun_args, bootstrap
    [evaluate]                   benchmarks and args of every evaluation (a trained run's included)
    [runs.NAME]                  kind = "sft" | "tgrpo" | "evaluate" | "psyrl" | "join", its keys
    [[tables]]                   rows (run names), columns, metric, deltas, compare
    [tables.paper]               the paper's values for the table, typed in from it (issue 31)

What a model reference, a placeholder, a join and `opt_in` mean: psyrl/experiment/spec.py.
"""

from __future__ import annotations

import re
from pathlib import Path

from psyrl.core.presets import PresetError, config_presets, resolve_config
from psyrl.core.tomlconf import find_line, read_toml
from psyrl.experiment.spec import (
    PLACEHOLDER,
    Experiment,
    ExperimentError,
    PaperRow,
    PaperValues,
    RunSpec,
    TableSpec,
    plan,
    references,
)

KINDS = ("sft", "tgrpo", "evaluate", "psyrl", "join")
RULES = ("median", "best", "last")
RUN_KEYS = {
    "sft": {"kind", "config", "set", "model", "seeds", "evaluate", "label", "nproc", "opt_in"},
    "tgrpo": {"kind", "config", "set", "model", "seeds", "evaluate", "label", "nproc", "opt_in"},
    "evaluate": {"kind", "model", "args", "seeds", "benchmarks", "label", "nproc", "opt_in"},
    "psyrl": {"kind", "args", "creates", "seeds", "label", "nproc", "opt_in"},
    "join": {"kind", "runs", "label"},
}
EXPERIMENT_KEYS = {"description", "output_dir", "nproc", "torchrun_args", "bootstrap"}
EVALUATE_KEYS = {"benchmarks", "args"}
TABLE_KEYS = {
    "title",
    "rows",
    "columns",
    "benchmark",
    "metric",
    "deltas",
    "compare",
    "note",
    "paper",
}
COLUMNS = ("tasks", "benchmarks", "index")
METRICS = ("f1", "accuracy", "valid", "tokens")
PAPER_KEYS = {"table", "block", "columns", "rows", "differences"}
PAPER_ROW_KEYS = {"row", "block", "values"}
PAPER_DIFFERENCE_KEYS = {"minus", "row", "block", "values"}
OPT_IN = re.compile(r"[a-z0-9][a-z0-9-]*")


def load_experiment(path: str | Path, output_dir: str | None = None) -> Experiment:
    """Read and check an experiment file; every problem is one ExperimentError with file:line."""
    path = Path(path)
    raw, text = read_toml(path, "the experiment file", ExperimentError)

    def fail(where: tuple, message: str):
        line = find_line(text, where)
        raise ExperimentError(f"{path}:{line}: {message}" if line else f"{path}: {message}")

    unknown = set(raw) - {"experiment", "evaluate", "runs", "tables"}
    if unknown:
        name = sorted(unknown)[0]
        fail((name,), f"unknown table [{name}] (valid: experiment, evaluate, runs, tables)")
    head = _table(raw, ("experiment",), EXPERIMENT_KEYS, fail)
    evaluation = _table(raw, ("evaluate",), EVALUATE_KEYS, fail)
    nproc = _get(head, ("experiment", "nproc"), int, 1, fail)
    if nproc < 1:
        fail(("experiment", "nproc"), f"nproc must be >= 1, got {nproc}")
    resamples = _get(head, ("experiment", "bootstrap"), int, 2000, fail)
    if resamples < 100:
        fail(("experiment", "bootstrap"), f"bootstrap must be >= 100 resamples, got {resamples}")
    runs_raw = raw.get("runs", {})
    if not isinstance(runs_raw, dict) or not runs_raw:
        fail(("runs",), "no runs: add at least one [runs.NAME] table")
    runs = {name: _run(name, value, fail) for name, value in runs_raw.items()}
    tables_raw = raw.get("tables", [])
    if not isinstance(tables_raw, list):
        fail(("tables",), "tables must be an array of tables: [[tables]]")
    tables = tuple(_table_spec(i, t, runs, fail) for i, t in enumerate(tables_raw))
    experiment = Experiment(
        path=path,
        name=path.stem,
        description=_get(head, ("experiment", "description"), str, "", fail),
        output_dir=Path(
            output_dir or _get(head, ("experiment", "output_dir"), str, "runs/experiments", fail)
        ),
        nproc=nproc,
        torchrun_args=tuple(_strings(head, ("experiment", "torchrun_args"), fail)),
        resamples=resamples,
        eval_benchmarks=tuple(_strings(evaluation, ("evaluate", "benchmarks"), fail)),
        eval_args=tuple(_strings(evaluation, ("evaluate", "args"), fail)),
        runs=runs,
        tables=tables,
    )
    for run in runs.values():
        if run.kind == "join":
            _check_join(run, runs, fail)
            continue
        for arg in (*run.args, *run.overrides):
            for _, target in PLACEHOLDER.findall(arg):
                if target.partition("@")[0] not in runs:
                    fail(
                        ("runs", run.name, "args" if arg in run.args else "set"),
                        f"{arg!r}: no run named {target.partition('@')[0]!r} (runs: "
                        f"{', '.join(runs)})",
                    )
        for reference in references(run):
            target = reference.partition("@")[0]
            where = (
                "runs",
                run.name,
                "model" if reference == run.model else "args" if run.args else "set",
            )
            if target == run.name:
                fail(where, f"run {run.name!r} starts from itself")
            if target in runs and runs[target].kind == "join":
                fail(where, f"run {target!r} is a join (a table row): it has no model or directory")
            if target in runs:
                _check_seeds(run, runs[target], where, fail)
                if runs[target].opt_in and runs[target].opt_in != run.opt_in:
                    fail(
                        where,
                        f"run {run.name!r} reads {target!r}, which runs only with --opt-in "
                        f"{runs[target].opt_in}: give it opt_in = {runs[target].opt_in!r} too",
                    )
            elif "@" in reference or reference.startswith("{"):
                fail(where, f"{reference!r}: no run named {target!r} (runs: {', '.join(runs)})")
        needs_eval = run.kind == "evaluate" or (run.kind in ("sft", "tgrpo") and run.evaluate)
        if needs_eval and not (run.benchmarks or experiment.eval_benchmarks):
            fail(
                ("runs", run.name),
                f"run {run.name!r} is evaluated, but no benchmarks are named "
                "(set [evaluate] benchmarks or the run's own)",
            )
    plan(experiment)  # a dependency cycle is an error of the file
    return experiment


def _table(raw: dict, where: tuple, keys: set, fail) -> dict:
    value = raw.get(where[0], {})
    if not isinstance(value, dict):
        fail(where, f"[{where[0]}] must be a table")
    for key in value:
        if key not in keys:
            fail(
                where + (key,),
                f"unknown key {key!r} in [{where[0]}] (valid: {', '.join(sorted(keys))})",
            )
    return value


def _get(table: dict, where: tuple, kind: type, default, fail):
    value = table.get(where[-1], default)
    if kind is int and (isinstance(value, bool) or not isinstance(value, int)):
        fail(where, f"{where[-1]} must be an integer, got {value!r}")
    if kind is not int and not isinstance(value, kind):
        fail(where, f"{where[-1]} must be a {kind.__name__}, got {value!r}")
    return value


def _strings(table: dict, where: tuple, fail) -> list[str]:
    value = table.get(where[-1], [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        fail(where, f"{where[-1]} must be a list of strings, got {value!r}")
    return value


def _run(name: str, value, fail) -> RunSpec:
    where = ("runs", name)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        fail(where, f"run name {name!r}: letters, digits, '-', '_' and '.' only")
    if not isinstance(value, dict):
        fail(where, f"[runs.{name}] must be a table")
    kind = value.get("kind")
    if kind is None and value and all(isinstance(v, dict) for v in value.values()):
        fail(
            where,
            f"[runs.{name}.{next(iter(value))}] is a table inside run {name!r}: a run "
            f"name with a '.' is quoted in TOML ([runs.\"{name}.{next(iter(value))}\"])",
        )
    if kind not in KINDS:
        fail(
            where + (("kind",) if "kind" in value else ()),
            f"run {name!r}: kind must be one of {', '.join(KINDS)}, got {kind!r}",
        )
    for key in value:
        if key not in RUN_KEYS[kind]:
            fail(
                where + (key,),
                f"run {name!r}: unknown key {key!r} for kind {kind!r} (valid: "
                f"{', '.join(sorted(RUN_KEYS[kind]))})",
            )
    if kind == "join":
        parts = _strings(value, where + ("runs",), fail)
        if not parts or len(set(parts)) != len(parts):
            fail(
                where + (("runs",) if "runs" in value else ()),
                f"run {name!r}: a join needs runs = [distinct evaluate runs], got {parts!r}",
            )
        return RunSpec(
            name=name,
            kind=kind,
            label=_get(value, where + ("label",), str, "", fail),
            parts=tuple(parts),
        )
    opt_in = _get(value, where + ("opt_in",), str, "", fail)
    if "opt_in" in value and not OPT_IN.fullmatch(opt_in):
        fail(
            where + ("opt_in",),
            f"run {name!r}: opt_in must be a word of lowercase letters, digits and '-' (the "
            f"argument of --opt-in), got {opt_in!r}",
        )
    seeds = value.get("seeds", [])
    if (
        not isinstance(seeds, list)
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        fail(
            where + ("seeds",), f"run {name!r}: seeds must be distinct integers >= 0, got {seeds!r}"
        )
    config = _get(value, where + ("config",), str, "", fail)
    if kind in ("sft", "tgrpo") and not config:
        fail(where, f'run {name!r}: a {kind} run needs config = "configs/...toml"')
    if config and not _resolves(config, kind):
        fail(
            where + ("config",),
            f"run {name!r}: no config file {config} (paths are relative to the directory "
            f"psyrl experiment runs in) and no preset of that name "
            f"({', '.join(config_presets())})",
        )
    model = _get(value, where + ("model",), str, "", fail)
    api = "openai" in value.get("args", [])  # evaluate.py --engine openai: the endpoint's model
    if kind == "evaluate" and not model and not api:
        fail(
            where,
            f"run {name!r}: an evaluate run needs model = a run name or a path (or "
            "args with --engine openai)",
        )
    if api and model:
        fail(
            where + ("model",),
            f"run {name!r}: --engine openai evaluates --api-model at "
            "--base-url, not a model directory: leave model out",
        )
    nproc = _get(value, where + ("nproc",), int, 0, fail)
    if nproc < 0 or (api and nproc > 1):
        fail(
            where + ("nproc",),
            f"run {name!r}: nproc must be >= 1 (1 with --engine openai: "
            f"one process sends the requests), got {nproc}",
        )
    if "@" in model and model.partition("@")[2] not in RULES:
        fail(
            where + ("model",),
            f"run {name!r}: {model!r}: after '@' comes one of {', '.join(RULES)}",
        )
    creates = _get(value, where + ("creates",), str, "", fail)
    if kind == "psyrl" and not creates:
        fail(
            where,
            f"run {name!r}: a psyrl run needs creates = the file it writes (so a "
            "finished run is skipped)",
        )
    overrides = tuple(_strings(value, where + ("set",), fail))
    for override in overrides:
        if "=" not in override or "." not in override.partition("=")[0]:
            fail(where + ("set",), f"run {name!r}: {override!r} is not TABLE.KEY=VALUE")
    return RunSpec(
        name=name,
        kind=kind,
        config=config,
        overrides=overrides,
        model=model,
        args=tuple(_strings(value, where + ("args",), fail)),
        seeds=tuple(seeds),
        evaluate=_get(value, where + ("evaluate",), bool, True, fail),
        benchmarks=tuple(_strings(value, where + ("benchmarks",), fail)),
        creates=creates,
        label=_get(value, where + ("label",), str, "", fail),
        nproc=1 if api else nproc,
        opt_in=opt_in,
    )


def _check_join(run: RunSpec, runs: dict, fail) -> None:
    """A join's parts: evaluate runs with benchmarks of their own, none shared (each column of the
    row comes from one of them), the same seeds."""
    where = ("runs", run.name, "runs")
    taken: dict[str, str] = {}
    for part in run.parts:
        target = runs.get(part)
        if target is None:
            fail(where, f"run {run.name!r}: no run named {part!r} (runs: {', '.join(runs)})")
        if target.kind != "evaluate" or not target.benchmarks:
            fail(
                where,
                f"run {run.name!r}: {part!r} is not an evaluate run with benchmarks of its own "
                "(a join takes each column from one of them)",
            )
        for benchmark in target.benchmarks:
            if benchmark in taken:
                fail(
                    where,
                    f"run {run.name!r}: {part!r} and {taken[benchmark]!r} both evaluate "
                    f"{benchmark}",
                )
            taken[benchmark] = part
        if target.seeds != runs[run.parts[0]].seeds:
            fail(where, f"run {run.name!r}: its runs must have the same seeds")


def _resolves(config: str, kind: str) -> bool:
    """Whether the trainer will find `config`: a file, else a preset (configs/sft/tiny.toml)."""
    try:
        resolve_config(config, kind)
    except PresetError:
        return False
    return True


def _check_seeds(run: RunSpec, target: RunSpec, where: tuple, fail) -> None:
    if target.seeds and not run.seeds:
        fail(
            where,
            f"run {run.name!r} has no seeds but reads {target.name!r}, which has "
            f"seeds {list(target.seeds)}: give it seeds too",
        )
    missing = set(run.seeds) - set(target.seeds) if target.seeds else set()
    if missing:
        fail(
            where,
            f"run {run.name!r}: seeds {sorted(missing)} are not seeds of "
            f"{target.name!r} ({list(target.seeds)})",
        )


def _table_spec(index: int, value, runs: dict, fail) -> TableSpec:
    where = ("tables", index)
    if not isinstance(value, dict):
        fail(where, "each [[tables]] entry must be a table")
    for key in value:
        if key not in TABLE_KEYS:
            fail(
                where + (key,),
                f"tables: unknown key {key!r} (valid: {', '.join(sorted(TABLE_KEYS))})",
            )
    rows = tuple(_strings(value, where + ("rows",), fail))
    deltas = tuple(_strings(value, where + ("deltas",), fail))
    compare = value.get("compare", [])
    if not isinstance(compare, list) or not all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in compare
    ):
        fail(where + ("compare",), "compare must be a list of [row, row] pairs")
    if not rows:
        fail(where, "a table needs rows = [run names]")
    for name in {*rows, *deltas, *(x for p in compare for x in p)}:
        if name not in runs:
            fail(where, f"tables: no run named {name!r} (runs: {', '.join(runs)})")
        if runs[name].kind == "psyrl" or (
            runs[name].kind != "evaluate" and not runs[name].evaluate
        ):
            fail(where, f"tables: run {name!r} has no evaluation to put in a table")
    columns = value.get("columns", "tasks")
    if columns not in COLUMNS:
        fail(
            where + ("columns",),
            f"columns must be one of {', '.join(map(repr, COLUMNS))}, got {columns!r}",
        )
    metric = value.get("metric", "f1")
    if metric not in METRICS:
        fail(
            where + ("metric",),
            f"metric must be one of {', '.join(map(repr, METRICS))}, got {metric!r}",
        )
    return TableSpec(
        title=_get(value, where + ("title",), str, f"table {index + 1}", fail),
        rows=rows,
        columns=columns,
        benchmark=_get(value, where + ("benchmark",), str, "", fail),
        metric=metric,
        deltas=deltas,
        compare=tuple(tuple(p) for p in compare),
        note=_get(value, where + ("note",), str, "", fail),
        paper=_paper(value["paper"], where + ("paper",), rows, fail) if "paper" in value else None,
    )


def _paper(value, where: tuple, rows: tuple[str, ...], fail) -> PaperValues:
    """[tables.paper]: where the paper prints the table's numbers, and each row's values."""
    if not isinstance(value, dict):
        fail(where, "paper must be a table ([tables.paper])")
    for key in value:
        if key not in PAPER_KEYS:
            fail(
                where + (key,),
                f"paper: unknown key {key!r} (valid: {', '.join(sorted(PAPER_KEYS))})",
            )
    table = _get(value, where + ("table",), str, "", fail)
    if not table:
        fail(where, 'paper needs table = where the values are printed (e.g. "Table 2", "§4.6")')
    block = _get(value, where + ("block",), str, "", fail)
    columns = tuple(_strings(value, where + ("columns",), fail))
    if not columns or len(set(columns)) != len(columns):
        fail(
            where + (("columns",) if "columns" in value else ()),
            "paper needs columns = [distinct column names]: psyrl's column of each printed "
            "value, in the paper's order",
        )
    entries = {}
    for part, keys in (("rows", PAPER_ROW_KEYS), ("differences", PAPER_DIFFERENCE_KEYS)):
        found = value.get(part, {})
        if not isinstance(found, dict):
            fail(where + (part,), f"paper: {part} must be a table of run = {{...}}")
        entries[part] = {}
        for run, entry in found.items():
            at = where + (part, run)
            if run not in rows:
                fail(at, f"paper: {run!r} is not a row of this table (rows: {', '.join(rows)})")
            if not isinstance(entry, dict):
                fail(at, f"paper: {part}.{run} must be a table: {{ row = ..., values = [...] }}")
            for key in entry:
                if key not in keys:
                    fail(
                        at + (key,),
                        f"paper: {part}.{run}: unknown key {key!r} (valid: "
                        f"{', '.join(sorted(keys))})",
                    )
            minus = _get(entry, at + ("minus",), str, "", fail)
            if part == "differences" and minus not in rows:
                fail(
                    at + (("minus",) if "minus" in entry else ()),
                    f"paper: differences.{run} needs minus = the row it is taken against "
                    f"(rows: {', '.join(rows)}), got {minus!r}",
                )
            inherited = entries["rows"].get(run) if part == "differences" else None
            label = _get(entry, at + ("row",), str, inherited.row if inherited else "", fail)
            if not label:
                fail(at, f"paper: {part}.{run} needs row = the paper's row label (or sentence)")
            numbers = entry.get("values")
            if (
                not isinstance(numbers, list)
                or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in numbers)
                or len(numbers) != len(columns)
            ):
                fail(
                    at + (("values",) if "values" in entry else ()),
                    f"paper: {part}.{run} needs values = {len(columns)} numbers (one per column: "
                    f"{', '.join(columns)}), got {numbers!r}",
                )
            entries[part][run] = PaperRow(
                row=label,
                block=_get(
                    entry, at + ("block",), str, inherited.block if inherited else block, fail
                ),
                values=tuple(float(v) for v in numbers),
                minus=minus,
            )
    if not entries["rows"] and not entries["differences"]:
        fail(
            where, "paper has no rows: add [tables.paper.rows] run = { row = ..., values = [...] }"
        )
    return PaperValues(table, columns, entries["rows"], entries["differences"])
