"""Experiment files (issue 22): a TOML file names runs (a trainer, an evaluation, or any psyrl
command), what each starts from, its seeds, and the tables to print; `plan` turns it into units, one
per run and seed, in dependency order. Reads files only: nothing here runs or imports torch.

    [experiment]                 description, output_dir, nproc, torchrun_args, bootstrap
    [evaluate]                   benchmarks and args of every evaluation (a trained run's included)
    [runs.NAME]                  kind = "sft" | "tgrpo" | "evaluate" | "psyrl" | "join", its keys
    [[tables]]                   rows (run names), columns, metric, deltas, compare
    [tables.paper]               the paper's values for the table, typed in from it (issue 31)

A model reference (`model`, and `{model:...}` in `args` or `set`) is a run name (its final `hf/`),
`NAME@median|best|last` (`psyrl select-checkpoint`'s choice, appendix B), or a path. `{run:NAME}` is
a run's directory, `{eval:NAME}` its evaluation's, `{dir}` the run's own. A `join` runs nothing: it
is a table row made of several evaluate runs, each of its own benchmarks (the paper's
dataset-specific Psy-Interpreter-SFT models). A run with `opt_in = "WORD"` runs only under
`--opt-in WORD`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from psyrl.core.errors import PsyrlError
from psyrl.core.presets import PresetError, config_presets, is_preset, resolve_config
from psyrl.core.tomlconf import find_line, read_toml

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
METRICS = ("f1", "accuracy", "valid")
PAPER_KEYS = {"table", "block", "columns", "rows", "differences"}
PAPER_ROW_KEYS = {"row", "block", "values"}
PAPER_DIFFERENCE_KEYS = {"minus", "row", "block", "values"}
PLACEHOLDER = re.compile(r"\{(run|eval|model):([^{}]+)\}")
OPT_IN = re.compile(r"[a-z0-9][a-z0-9-]*")


class ExperimentError(PsyrlError, ValueError):
    """An experiment file psyrl cannot run; the message names the file, its line and the key."""


@dataclass(frozen=True)
class RunSpec:
    name: str
    kind: str
    config: str = ""
    overrides: tuple[str, ...] = ()
    model: str = ""  # a model reference (module docstring)
    args: tuple[str, ...] = ()
    seeds: tuple[int, ...] = ()  # () = one run, without a seed of its own
    evaluate: bool = True  # a trained run is evaluated with [evaluate]
    benchmarks: tuple[str, ...] = ()  # an evaluate run's own, else [evaluate]'s
    creates: str = ""  # a psyrl run is done when this file exists (relative to its directory)
    label: str = ""
    nproc: int = 0  # ranks of this run; 0: [experiment] nproc (an API evaluation: 1)
    parts: tuple[str, ...] = ()  # a join's evaluate runs, one per benchmark or group of them
    opt_in: str = ""  # runs only under `psyrl experiment --opt-in WORD` ("": always)


@dataclass(frozen=True)
class PaperRow:
    """Numbers typed in from the paper: one row of one of its tables, or a sentence of its text."""

    row: str  # the row's label as the paper prints it; for a section: the sentence that holds them
    block: str  # the table's block it is in (a model's name); "" = above every block
    values: tuple[float, ...]  # one per PaperValues.columns, in the paper's order
    minus: str = ""  # a printed difference: the run it is taken against


@dataclass(frozen=True)
class PaperValues:
    """The paper's values for one table of an experiment file (`[tables.paper]`)."""

    table: str  # where they are printed: "Table 2", or a section ("§4.6")
    columns: tuple[str, ...]  # psyrl's column of each printed value, in the paper's order
    rows: dict[str, PaperRow]  # run -> its row in the paper
    differences: dict[str, PaperRow]  # run -> a difference the paper prints (against `minus`)

    def value(self, run: str, column: str) -> float | None:
        entry = self.rows.get(run)
        return _at(self, entry, column) if entry else None

    def difference(self, a: str, b: str, column: str) -> float | None:
        """A - B: the paper's printed difference where it prints one (Table 2's parentheses), else
        the difference of its two values, else None."""
        printed = self.differences.get(a)
        if printed and printed.minus == b:
            return _at(self, printed, column)
        x, y = self.value(a, column), self.value(b, column)
        return None if x is None or y is None else round(x - y, 6)


def _at(paper: PaperValues, entry: PaperRow, column: str) -> float | None:
    return entry.values[paper.columns.index(column)] if column in paper.columns else None


@dataclass(frozen=True)
class TableSpec:
    title: str
    rows: tuple[str, ...]
    columns: str = "tasks"  # "tasks" of `benchmark`, "benchmarks", or "index" (Figure 6)
    benchmark: str = ""
    metric: str = "f1"  # f1 (x100) | accuracy (%) | valid (count of non-zero-F1 responses)
    deltas: tuple[str, ...] = ()
    compare: tuple[tuple[str, str], ...] = ()
    note: str = ""
    paper: PaperValues | None = None


@dataclass(frozen=True)
class Experiment:
    path: Path
    name: str
    description: str
    output_dir: Path
    nproc: int
    torchrun_args: tuple[str, ...]
    resamples: int
    eval_benchmarks: tuple[str, ...]
    eval_args: tuple[str, ...]
    runs: dict[str, RunSpec]
    tables: tuple[TableSpec, ...]

    @property
    def run_root(self) -> Path:
        return self.output_dir / self.name

    @property
    def results_dir(self) -> Path:
        """experiments/<name>/ beside the file: results.md and results.json; for a file shipped in
        the package (read-only where psyrl is installed), experiments/<name>/ of the working
        directory (in a checkout, experiments/ links to the package's folder: the same place)."""
        if is_preset(self.path):
            return Path("experiments") / self.name
        return self.path.parent / self.name


@dataclass
class Unit:
    """One run at one seed (seed None: a run without seeds)."""

    run: RunSpec
    seed: int | None
    dir: Path
    needs: list[tuple[str, int | None]] = field(default_factory=list)  # (run, seed) it reads

    @property
    def key(self) -> tuple[str, int | None]:
        return (self.run.name, self.seed)

    @property
    def title(self) -> str:
        return self.run.name if self.seed is None else f"{self.run.name} (seed {self.seed})"

    @property
    def eval_dir(self) -> Path:
        return self.dir if self.run.kind == "evaluate" else self.dir / "eval"


# ---------------------------------------------------------------- reading


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
        for reference in _references(run):
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


def _references(run: RunSpec) -> list[str]:
    """The model references and placeholders of a run: what it reads from other runs."""
    found = [run.model] if run.model else []
    for arg in (*run.args, *run.overrides):
        for kind, target in PLACEHOLDER.findall(arg):
            found.append(target if kind == "model" else target.partition("@")[0])
    return found


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


# ---------------------------------------------------------------- planning


def with_seeds(experiment: Experiment, seeds: tuple[int, ...] | None) -> Experiment:
    """Every seeded run with `seeds` instead (e.g. `--seeds 0` for a quick check)."""
    if seeds is None:
        return experiment
    runs = {
        name: RunSpec(**{**run.__dict__, "seeds": seeds if run.seeds else ()})
        for name, run in experiment.runs.items()
    }
    return Experiment(**{**experiment.__dict__, "runs": runs})


def partner_seed(run: RunSpec, seed: int | None) -> int | None:
    """The seed of `run` that a unit of `seed` reads: the same one, or None for an unseeded run."""
    return seed if run.seeds else None


def unit_dir(experiment: Experiment, run: RunSpec, seed: int | None) -> Path:
    return experiment.run_root / (run.name if seed is None else f"{run.name}-seed{seed}")


def plan(experiment: Experiment) -> list[Unit]:
    """Every (run, seed) in an order where a unit comes after the units it reads (ties keep the
    file's order); a cycle is an ExperimentError."""
    units = {}
    for run in experiment.runs.values():
        for seed in run.seeds or (None,):
            unit = Unit(run, seed, unit_dir(experiment, run, seed))
            for part in run.parts:  # a join waits for every unit of its runs
                unit.needs += [(part, s) for s in experiment.runs[part].seeds or (None,)]
            for reference in _references(run):
                target = experiment.runs.get(reference.partition("@")[0])
                if target is not None:
                    unit.needs.append((target.name, partner_seed(target, seed)))
            units[unit.key] = unit
    ordered, state = [], {}

    def visit(unit: Unit, chain: list[str]) -> None:
        if state.get(unit.key) == "done":
            return
        if state.get(unit.key) == "open":
            raise ExperimentError(
                f"{experiment.path}: the runs read each other in a cycle: "
                f"{' -> '.join(chain + [unit.run.name])}"
            )
        state[unit.key] = "open"
        for need in unit.needs:
            visit(units[need], chain + [unit.run.name])
        state[unit.key] = "done"
        ordered.append(unit)

    for unit in units.values():
        visit(unit, [])
    return ordered


def select(units: list[Unit], only: tuple[str, ...]) -> list[Unit]:
    """The units of the runs in `only` and the units they read, transitively (all when empty)."""
    if not only:
        return units
    wanted = {u.key for u in units if u.run.name in only}
    for unit in reversed(units):  # dependents come after what they read
        if unit.key in wanted:
            wanted.update(unit.needs)
    return [u for u in units if u.key in wanted]
