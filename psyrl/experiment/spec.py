"""An experiment (issue 22): the runs it names (a trainer, an evaluation, or any psyrl command),
what each starts from, its seeds, and the tables to print with the paper's values for them, as
psyrl/experiment/read.py reads them from an experiment file; `plan` turns it into units, one per
run and seed, in dependency order. Nothing here runs or imports torch.

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
from psyrl.core.presets import is_preset

PLACEHOLDER = re.compile(r"\{(run|eval|model):([^{}]+)\}")


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
    # f1 (x100) | accuracy (%) | valid (count of non-zero-F1 responses) | tokens (response length)
    metric: str = "f1"
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


def references(run: RunSpec) -> list[str]:
    """The model references and placeholders of a run: what it reads from other runs."""
    found = [run.model] if run.model else []
    for arg in (*run.args, *run.overrides):
        for kind, target in PLACEHOLDER.findall(arg):
            found.append(target if kind == "model" else target.partition("@")[0])
    return found


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
            for reference in references(run):
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
