"""`psyrl experiment FILE|NAME`: the paper's experiments as files (psyrl.experiment), or by the name
of one shipped in the package: their runs in dependency order, finished ones skipped, interrupted
ones resumed, then the tables with their bootstrap intervals."""

from __future__ import annotations

import shlex

import click

from psyrl.cli.errors import fail
from psyrl.core.presets import PresetError, resolve_experiment


@click.command("experiment")
@click.argument("path", metavar="FILE|NAME", type=click.Path(dir_okay=False))
@click.option(
    "--only",
    multiple=True,
    metavar="RUN",
    help="Run only this run (repeatable), and what it reads that is not finished.",
)
@click.option(
    "--dry-run", is_flag=True, help="Print the commands still to run, in order, and run nothing."
)
@click.option(
    "--seeds",
    default=None,
    metavar="S[,S...]",
    help="Every seeded run with these seeds instead of the file's (e.g. 0 for a check).",
)
@click.option(
    "--set",
    "extra_sets",
    multiple=True,
    metavar="TABLE.KEY=VALUE",
    help="Add this override to every trainer run (e.g. run.steps=1); repeatable.",
)
@click.option(
    "--limit",
    type=int,
    default=None,
    help="At most N items per task in every evaluation (evaluate's --limit).",
)
@click.option(
    "--eval-args",
    default="",
    metavar="'ARGS'",
    help="Append these options to every evaluation (one string, shell-quoted; e.g. "
    "'--max-new-tokens 8'): the last value of an option wins.",
)
@click.option(
    "--nproc",
    type=int,
    default=None,
    help="Ranks per run instead of the file's [experiment] nproc.",
)
@click.option(
    "--output-dir",
    default=None,
    type=click.Path(file_okay=False),
    help="Where the runs go instead of the file's output_dir.",
)
@click.option(
    "--plan",
    "plan_only",
    is_flag=True,
    help="`psyrl plan` for every trainer run on [experiment] nproc GPUs; run nothing "
    "(exit status 3 when one does not fit).",
)
@click.option(
    "--gpu-memory-gib",
    type=float,
    default=48.0,
    show_default=True,
    help="With --plan: the memory of one GPU (48: RTX A6000).",
)
@click.option(
    "--opt-in",
    "opted",
    multiple=True,
    metavar="WORD",
    help="Also run the runs marked opt_in = WORD (repeatable; e.g. training on ToMbench, whose "
    "licence says evaluation only).",
)
@click.option(
    "--tables-only", is_flag=True, help="Write results.md/.json from what is on disk; run nothing."
)
def experiment_command(
    path,
    only,
    dry_run,
    seeds,
    extra_sets,
    limit,
    eval_args,
    nproc,
    output_dir,
    plan_only,
    gpu_memory_gib,
    opted,
    tables_only,
):
    """Run an experiment file, or a shipped one by name (`table2-tiny`; `psyrl config list` names
    them): its runs in dependency order, finished ones skipped, interrupted ones resumed; then its
    tables with 95 % bootstrap intervals over seeds and items, in results.md and results.json of
    <name>/ beside the file (a shipped file: ./experiments/<name>/).

    The paths inside the file (data, runs) are relative to the working directory; its configs are
    files or presets (configs/sft/tiny.toml). After a crash, a kill or a preemption
    (SIGTERM/SIGUSR1: forwarded; exit status 75), run the same command again.
    """
    # the tables' bootstrap needs numpy: imported when the command runs, not for --help
    from psyrl.experiment.read import load_experiment
    from psyrl.experiment.runner import collect, plan_memory, run_experiment
    from psyrl.experiment.spec import Experiment, ExperimentError, with_seeds
    from psyrl.experiment.tables import table_markdown, write_results

    try:
        experiment = load_experiment(resolve_experiment(path), output_dir)
        if seeds is not None:
            try:
                chosen = tuple(int(s) for s in seeds.split(","))
                if any(s < 0 for s in chosen) or len(set(chosen)) != len(chosen):
                    raise ValueError
            except ValueError:
                raise click.BadParameter(
                    f"{seeds!r}: expected S[,S...], distinct integers >= 0", param_hint="--seeds"
                ) from None
            experiment = with_seeds(experiment, chosen)
        if nproc is not None:
            if nproc < 1:
                raise click.BadParameter("must be >= 1", param_hint="--nproc")
            experiment = Experiment(**{**experiment.__dict__, "nproc": nproc})
        unknown = [name for name in only if name not in experiment.runs]
        if unknown:
            raise click.BadParameter(
                f"no run {unknown[0]!r} in {path} (runs: {', '.join(experiment.runs)})",
                param_hint="--only",
            )
        words = {run.opt_in for run in experiment.runs.values() if run.opt_in}
        for word in opted:
            if word not in words:
                raise click.BadParameter(
                    f"{word!r}: no run of {path} has opt_in = {word!r} "
                    f"({', '.join(sorted(words)) or 'none has one'})",
                    param_hint="--opt-in",
                )
        for override in extra_sets:
            if "=" not in override or "." not in override.partition("=")[0]:
                raise click.BadParameter(f"{override!r} is not TABLE.KEY=VALUE", param_hint="--set")
        if limit is not None and limit < 1:
            raise click.BadParameter("must be >= 1", param_hint="--limit")
        try:
            extra_eval = tuple(shlex.split(eval_args))
        except ValueError as e:
            raise click.BadParameter(str(e), param_hint="--eval-args") from None
        if limit is not None:
            extra_eval += ("--limit", str(limit))
    except (ExperimentError, PresetError) as e:
        fail(e, "psyrl experiment")
    if plan_only:
        raise SystemExit(plan_memory(experiment, extra_sets, gpu_memory_gib))
    if not tables_only:
        code = run_experiment(experiment, only, dry_run, extra_sets, extra_eval, opted)
        if code or dry_run:
            raise SystemExit(code)
    tables, runs = collect(experiment)
    out = write_results(experiment, tables, runs)
    for table in tables:
        click.echo(table_markdown(table))
    click.echo(f"psyrl experiment: {out / 'results.md'}, {out / 'results.json'}")
