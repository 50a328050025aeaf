"""The commands that read finished or running training runs: `psyrl select-checkpoint` (appendix
B's median-F1 SFT checkpoint), `psyrl plot` (curves), `psyrl summary` (the start -> end table) and
`psyrl report` (one self-contained HTML page)."""

from __future__ import annotations

from pathlib import Path

import click

from psyrl.cli.errors import reported

# options of more than one command: plot and report, summary and report
smooth_option = click.option(
    "--smooth",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Trailing mean over this many steps for the per-step curves (1 = raw only).",
)
window_option = click.option(
    "--window",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Steps averaged at the start and at the end of the per-step metrics (the summary table).",
)


@click.command("select-checkpoint")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--rule",
    type=click.Choice(["median", "best", "last"]),
    default="median",
    show_default=True,
    help="median = appendix B's choice for the GRPO start: the checkpoint with the median valid "
    "F1.",
)
def select_checkpoint_command(run_dir, rule):
    """Print the HF directory of the chosen SFT checkpoint (by validation F1) of a train_sft.py
    run, once its files match its manifest (PSYRL_NO_VERIFY=1 skips that check, saying so on
    stderr); a damaged one is refused with exit status 1."""
    from psyrl.core.checkpoints import select_checkpoint, verify_before_load

    with reported("psyrl select-checkpoint", also=(FileNotFoundError, ValueError)):
        step, score, path = select_checkpoint(run_dir, rule)
        verify_before_load(path / "hf", note=lambda line: click.echo(line, err=True))
    click.echo(f"step {step}: valid F1 {score:.4f}", err=True)
    click.echo(path / "hf")


@click.command("plot")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="PNG to write (default: RUN_DIR/curves.png for one run, curves.png here for several).",
)
@smooth_option
def plot_command(run_dirs, out, smooth):
    """Training curves of one or several runs overlaid, as one PNG: reward components, held-out F1,
    response length and KL over steps (the paper's Fig. 5 compares the base and bilateral rewards
    this way). Needs matplotlib: pip install 'psyrl[plot]'."""
    from psyrl.report.plot import plot_runs

    out = out or (Path(run_dirs[0]) / "curves.png" if len(run_dirs) == 1 else Path("curves.png"))
    try:
        with reported("psyrl plot", also=(OSError, ValueError)):
            panels = plot_runs(run_dirs, out, smooth)
    except ModuleNotFoundError as e:
        if e.name != "matplotlib":
            raise
        raise click.ClickException(
            "psyrl plot needs matplotlib: pip install 'psyrl[plot]'"
        ) from None
    click.echo(f"wrote {out} ({len(panels)} panels: {', '.join(panels)})")


@click.command("summary")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@window_option
def summary_command(run_dirs, window):
    """A Markdown table comparing the start and the end of T-GRPO runs: held-out F1 and final reward
    at the first and the last validation, and the mean training reward, F1 and response length over
    the first and the last WINDOW steps."""
    from psyrl.report.summary import summary_table

    with reported("psyrl summary", also=(OSError, ValueError)):
        click.echo(summary_table(run_dirs, window))


@click.command("report")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="HTML file to write (default: RUN_DIR/report.html for one run, report.html here for "
    "several).",
)
@smooth_option
@window_option
@click.option(
    "--sample-steps",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Embed at most this many sample steps per run, evenly spaced, first and last included "
    "(0 = all): bounds the file size of a long run.",
)
def report_command(run_dirs, out, smooth, window, sample_steps):
    """One self-contained HTML page (no network: open it anywhere) on one or several train_sft.py /
    train_tgrpo.py runs: each resolved config, the start -> end table of `psyrl summary`, the curves
    of `psyrl plot` overlaid, held-out scores per checkpoint, the tables of every evaluate.py output
    inside the run directory (RUN_DIR/*/results.json), and a browser over the T-GRPO rollout samples
    (samples/step-N.jsonl) with their stories and gold answers, filtered by step, reward, F1,
    format, finish reason and text. The filters can be given in the URL, e.g.
    report.html#step=20&min_reward=0.5&finish=length&q=angry."""
    from psyrl.report.page import write_report

    out = out or (Path(run_dirs[0]) / "report.html" if len(run_dirs) == 1 else Path("report.html"))
    with reported("psyrl report", also=(OSError, ValueError)):
        path = write_report(run_dirs, out, smooth, window, sample_steps)
    size = path.stat().st_size / 2**20
    click.echo(f"wrote {path} ({size:.1f} MiB)")
