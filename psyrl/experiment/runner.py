"""`psyrl experiment FILE`: run an experiment file's units in dependency order, each a psyrl program
in its own process (torchrun when `nproc` > 1), skip the finished ones, resume the interrupted ones,
then write experiments/<name>/results.{md,json}.

A unit is finished when its outputs are: a trainer's `hf/config.json` (and its evaluation's
results.json), an evaluation's results.json, a psyrl command's `creates` file. A trainer run that
was cut off resumes from its newest complete checkpoint (`--resume`); one cut off before its first
checkpoint starts over (`--overwrite`: nothing of it could be kept). An evaluation resumes by itself
from its predictions.jsonl. So after a crash, a kill or a preemption the same command continues.
"""

from __future__ import annotations

import fcntl
import json
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

from psyrl.core.errors import EXIT_PREEMPTED
from psyrl.experiment.spec import (
    PLACEHOLDER,
    Experiment,
    Unit,
    partner_seed,
    plan,
    select,
    unit_dir,
)

FORWARDED = (signal.SIGTERM, signal.SIGUSR1)


class Pending(Exception):
    """A model reference whose run has not finished yet (a dry run prints the command instead)."""


def launcher(experiment: Experiment, nproc: int | None = None) -> list[str]:
    count = nproc or experiment.nproc
    if count == 1:
        return [sys.executable, "-m", "psyrl"]
    torchrun = Path(sys.executable).with_name("torchrun")
    return [
        str(torchrun) if torchrun.exists() else "torchrun",
        "--standalone",
        "--nproc_per_node",
        str(count),
        *experiment.torchrun_args,
        "-m",
        "psyrl",
    ]


def resolve(experiment: Experiment, reference: str, seed: int | None, dry: bool) -> str:
    """A model reference as a path: a run's hf/, its selected checkpoint's hf/, or the path."""
    name, _, rule = reference.partition("@")
    run = experiment.runs.get(name)
    if run is None:
        return reference
    directory = unit_dir(experiment, run, partner_seed(run, seed))
    if not rule:
        return str(directory / "hf")
    if dry and not (directory / "hf" / "config.json").is_file():
        raise Pending(f"$(psyrl select-checkpoint {directory} --rule {rule})")
    from psyrl.core.checkpoints import select_checkpoint, verify_before_load

    try:
        chosen = select_checkpoint(directory, rule)[2] / "hf"
        if not dry:  # handed on to a trainer or evaluate.py, which verify it again as they load
            verify_before_load(chosen)
        return str(chosen)
    except (FileNotFoundError, ValueError) as e:
        raise SystemExit(f"psyrl experiment: {experiment.path}: run {name!r}: {e}") from None


def substitute(experiment: Experiment, unit: Unit, text: str, dry: bool) -> str:
    def one(match) -> str:
        kind, target = match.groups()
        if kind == "model":
            try:
                return resolve(experiment, target, unit.seed, dry)
            except Pending as e:
                return str(e)
        run = experiment.runs[target]
        seed = partner_seed(run, unit.seed)
        other = Unit(run, seed, unit_dir(experiment, run, seed))
        return str(other.dir if kind == "run" else other.eval_dir)

    return PLACEHOLDER.sub(one, text).replace("{dir}", str(unit.dir))


def steps(
    experiment: Experiment,
    unit: Unit,
    extra_sets: tuple[str, ...],
    extra_eval: tuple[str, ...],
    dry: bool,
) -> list[tuple[str, list[str]]]:
    """The unit's (what, argv) still to run; [] when it is finished (a join runs nothing)."""
    run, seed, out = unit.run, unit.seed, []
    if run.kind == "join":
        return out
    seeded = ["--seed", str(seed)] if seed is not None else []
    try:
        model = resolve(experiment, run.model, seed, dry) if run.model else ""
    except Pending as e:
        model = str(e)
    evaluate = [
        *launcher(experiment, run.nproc),
        "evaluate",
        "--benchmarks",
        ",".join(run.benchmarks or experiment.eval_benchmarks),
        *experiment.eval_args,
        *seeded,
    ]
    if run.kind in ("sft", "tgrpo"):
        if not (unit.dir / "hf" / "config.json").is_file():
            argv = [
                *launcher(experiment, run.nproc),
                f"train-{run.kind}",
                "--config",
                run.config,
                "--set",
                f"run.output_dir={unit.dir.parent}",
                "--set",
                f"run.name={unit.dir.name}",
            ]
            argv += ["--set", f"run.seed={seed}"] if seed is not None else []
            argv += ["--set", f"model.path={model}"] if model else []
            for override in (*run.overrides, *extra_sets):
                argv += ["--set", substitute(experiment, unit, override, dry)]
            argv += restart_flag(unit.dir)
            out.append(("train", argv))
        if run.evaluate and not (unit.eval_dir / "results.json").is_file():
            out.append(
                (
                    "evaluate",
                    [
                        *evaluate,
                        "--model",
                        str(unit.dir / "hf"),
                        *extra_eval,
                        "--out",
                        str(unit.eval_dir),
                    ],
                )
            )
    elif run.kind == "evaluate":
        if not (unit.dir / "results.json").is_file():
            args = [substitute(experiment, unit, a, dry) for a in run.args]
            chosen = ["--model", model] if model else []
            out.append(
                ("evaluate", [*evaluate, *chosen, *args, *extra_eval, "--out", str(unit.dir)])
            )
    elif not (unit.dir / run.creates).is_file():
        out.append(
            (
                "psyrl",
                [
                    *launcher(experiment, run.nproc or 1),
                    *(substitute(experiment, unit, a, dry) for a in run.args),
                ],
            )
        )
    return out


def shell_line(argv: list[str]) -> str:
    """A command to paste into a shell: a pending `$(psyrl select-checkpoint ...)` is left to
    expand, inside double quotes."""
    return " ".join(f'"{a}"' if "$(" in a else shlex.quote(a) for a in argv)


def restart_flag(run_dir: Path) -> list[str]:
    """--resume auto on a run that was started (it holds metrics.jsonl, checkpoints or an export):
    the trainer continues from the newest checkpoint that passes its checks (the one before a
    damaged newest), starts over only a run of the same config with nothing in checkpoints/ and no
    export, and refuses the rest (one without metrics.jsonl too). Never --overwrite: deleting a run
    is the user's decision."""
    from psyrl.core.checkpoints import run_results

    started = (run_dir / "metrics.jsonl").exists() or run_results(run_dir)
    return ["--resume", "auto"] if started else []


class Runner:
    """Runs one command at a time, its output shown and kept in a log; forwards SIGTERM/SIGUSR1 to
    it (a cluster's warning signal stops the trainer at its next step boundary, exit 75)."""

    def __init__(self, log_dir: Path):
        self.log_dir = log_dir
        self.child: subprocess.Popen | None = None
        self.signalled: int | None = None

    def __enter__(self) -> Runner:
        self.previous = {s: signal.signal(s, self._forward) for s in FORWARDED}
        return self

    def __exit__(self, *exc) -> None:
        for s, handler in self.previous.items():
            signal.signal(s, handler)

    def _forward(self, signum, frame) -> None:
        self.signalled = signum
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signum)

    def run(self, argv: list[str], log_name: str) -> int:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_dir / f"{log_name}.log", "a", encoding="utf-8") as log:
            log.write(f"$ {shlex.join(argv)}\n")
            log.flush()
            self.child = subprocess.Popen(
                argv,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                errors="replace",
                bufsize=1,
            )
            for line in self.child.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                log.write(line)
            code = self.child.wait()
            self.child = None
            log.write(f"[exit {code}]\n")
        return code


def left_out(unit: Unit, opted: tuple[str, ...]) -> bool:
    """An opt-in unit whose word was not given: not run, not waited for."""
    return bool(unit.run.opt_in) and unit.run.opt_in not in opted


def run_experiment(
    experiment: Experiment,
    only: tuple[str, ...] = (),
    dry_run: bool = False,
    extra_sets: tuple[str, ...] = (),
    extra_eval: tuple[str, ...] = (),
    opted: tuple[str, ...] = (),
) -> int:
    """Run the units still to run; returns the exit status (0, or 75 when preempted)."""
    units = plan(experiment)
    chosen = [u for u in select(units, only) if u.run.kind != "join"]  # a join runs nothing
    for unit in chosen:
        if left_out(unit, opted) and unit.run.name in only:
            raise SystemExit(
                f"psyrl experiment: run {unit.run.name!r} runs only with --opt-in "
                f"{unit.run.opt_in} (see its comment in {experiment.path})"
            )
    record_path = experiment.run_root / "experiment.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    if dry_run:
        for unit in chosen:
            if left_out(unit, opted):
                print(f"# {unit.title}: left out (runs with --opt-in {unit.run.opt_in})")
                continue
            todo = steps(experiment, unit, extra_sets, extra_eval, dry=True)
            print(f"# {unit.title}: " + ("done" if not todo else ", ".join(w for w, _ in todo)))
            for _, argv in todo:
                print(shell_line(argv))
        return 0
    started = time.monotonic()
    experiment.run_root.mkdir(parents=True, exist_ok=True)
    with open(experiment.run_root / "experiment.lock", "w") as lock:  # closing it unlocks
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise SystemExit(
                f"psyrl experiment: another psyrl experiment is running the runs "
                f"in {experiment.run_root} (it holds experiment.lock)"
            ) from None
        chosen = [u for u in chosen if not left_out(u, opted)]
        return _run_units(experiment, chosen, record, record_path, extra_sets, extra_eval, started)


def _run_units(
    experiment: Experiment,
    chosen: list[Unit],
    record: dict,
    record_path: Path,
    extra_sets: tuple[str, ...],
    extra_eval: tuple[str, ...],
    started: float,
) -> int:
    settings = record.setdefault("_settings", {})  # the --set/--eval-args each unit ran with
    wanted = {"set": list(extra_sets), "eval": list(extra_eval)}
    with Runner(experiment.run_root / "logs") as runner:
        for number, unit in enumerate(chosen, 1):
            todo = steps(experiment, unit, extra_sets, extra_eval, dry=False)
            ran_with = settings.get(unit.dir.name, wanted)
            if ran_with != wanted:  # e.g. a 1-step check's run would stand in a full table
                raise SystemExit(
                    f"psyrl experiment: {unit.title} in {unit.dir} ran with --set "
                    f"{ran_with['set']} and evaluation options {ran_with['eval']}, not "
                    f"{wanted['set']} and {wanted['eval']}: use another --output-dir, or delete "
                    "that run directory to run it again"
                )
            if not todo:
                print(
                    f"psyrl experiment: [{number}/{len(chosen)}] {unit.title}: done, skipped",
                    flush=True,
                )
                continue
            settings[unit.dir.name] = wanted
            for what, argv in todo:
                if runner.signalled:  # a signal between two commands: start no other
                    return _preempted(unit, what)
                print(
                    f"psyrl experiment: [{number}/{len(chosen)}] {unit.title}: {what}\n$ "
                    f"{shlex.join(argv)}",
                    flush=True,
                )
                begin = time.monotonic()
                code = runner.run(argv, unit.dir.name)
                key = f"{unit.dir.name}/{what}"
                record[key] = record.get(key, 0) + time.monotonic() - begin
                _save_record(record_path, record)
                if code == EXIT_PREEMPTED or runner.signalled:
                    return _preempted(unit, what)
                if code != 0:
                    raise SystemExit(
                        f"psyrl experiment: {unit.title} ({what}) failed with exit status {code}; "
                        f"its output is in {runner.log_dir / (unit.dir.name + '.log')}. Fix it "
                        "and run the same command: finished runs are skipped"
                    )
                if what == "psyrl" and not (unit.dir / unit.run.creates).is_file():
                    raise SystemExit(
                        f"psyrl experiment: {unit.title} exited 0 but wrote no "
                        f"{unit.dir / unit.run.creates} (its `creates`); its output is in "
                        f"{runner.log_dir / (unit.dir.name + '.log')}"
                    )
    print(
        f"psyrl experiment: {len(chosen)} units in {time.monotonic() - started:.0f} s", flush=True
    )
    return 0


def _preempted(unit: Unit, what: str) -> int:
    print(
        f"psyrl experiment: preempted during {unit.title} ({what}); finished runs are kept: run "
        "the same command to continue",
        flush=True,
    )
    return EXIT_PREEMPTED


def root_model(experiment: Experiment, reference: str) -> str:
    """The model a chain of run references starts from: a path, or "" for the first run's config's
    own model.path (what `--plan` plans with: a run's outputs do not exist before it runs)."""
    run = experiment.runs.get(reference.partition("@")[0])
    if run is None:
        return reference
    return root_model(experiment, run.model) if run.model else ""


def plan_memory(experiment: Experiment, extra_sets: tuple[str, ...], gpu_memory_gib: float) -> int:
    """`psyrl plan` for every trainer run (model.path: the model its chain starts from) on `nproc`
    GPUs; returns 3 when one does not fit, as `psyrl plan` does."""
    from psyrl.core.config import load_config
    from psyrl.core.presets import resolve_config
    from psyrl.plan.architecture import load_architecture
    from psyrl.plan.planner import plan as memory_plan
    from psyrl.plan.table import format_plan

    worst = 0
    for unit in plan(experiment):
        run = unit.run
        if run.kind not in ("sft", "tgrpo") or unit.seed not in (None, *run.seeds[:1]):
            continue
        sets = [substitute(experiment, unit, o, dry=True) for o in (*run.overrides, *extra_sets)]
        start = root_model(experiment, run.model) if run.model else ""
        sets += [f"model.path={start}"] if start else []
        try:
            cfg = load_config(resolve_config(run.config, run.kind), sets)
            architecture, source = load_architecture(cfg.model)
            result = memory_plan(
                cfg, architecture, experiment.nproc, gpu_memory_gib, None, trainer=run.kind
            )
        except (ValueError, OSError) as e:
            raise SystemExit(f"psyrl experiment --plan: run {run.name!r}: {e}") from None
        verdict = "fits" if result.fits else "DOES NOT FIT"
        print(f"# {run.name} ({run.kind}, {run.config}; architecture from {source}): {verdict}")
        if not result.fits:
            print(format_plan(result))
            worst = 3
    return worst


def _save_record(path: Path, record: dict) -> None:
    from psyrl.core.atomic import write_text

    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(record, indent=1) + "\n")


def collect(experiment: Experiment) -> tuple[list[dict], list[dict]]:
    """(tables, runs) from what is on disk now."""
    from psyrl.experiment.tables import build_table

    units = plan(experiment)
    record_path = experiment.run_root / "experiment.json"
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    runs = []
    for unit in units:
        if unit.run.kind == "join":  # a table row, not a run
            continue
        finished = not steps(experiment, unit, (), (), dry=True)
        wall = sum(
            v
            for k, v in record.items()
            if not k.startswith("_") and k.split("/")[0] == unit.dir.name
        )
        runs.append(
            {
                "run": unit.run.name,
                "seed": unit.seed,
                "title": unit.title,
                "dir": str(unit.dir),
                "status": "done"
                if finished
                else f"opt-in (--opt-in {unit.run.opt_in})"
                if unit.run.opt_in
                else "not finished",
                "wall_s": round(wall, 1) if wall else None,
                **({"writes": str(unit.dir / unit.run.creates)} if unit.run.creates else {}),
            }
        )
    tables = [build_table(experiment, table, units) for table in experiment.tables]
    return tables, runs
