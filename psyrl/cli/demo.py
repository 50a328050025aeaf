"""`psyrl demo`: the whole CPU demo, from an installed package or a checkout (`make demo`)."""

from __future__ import annotations

from pathlib import Path

import click

from psyrl.cli.errors import reported


@click.command("demo", context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("runs"),
    show_default=True,
    help="Where the runs go: OUT/tiny-sft, OUT/tiny-tgrpo (or tiny-tgrpo-base).",
)
@click.option(
    "--ranks",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="Processes per training and evaluation stage (torchrun ranks; 1: no torchrun).",
)
@click.option(
    "--reward",
    type=click.Choice(["bilateral", "base"]),
    default="bilateral",
    show_default=True,
    help="T-GRPO's reward: the bilateral reward (eq. 3, 8) or the base one (the RQ2 comparison).",
)
@click.option(
    "--quick",
    is_flag=True,
    help="Every stage shortened to a few minutes (run names end in -quick): a smoke run whose "
    "figures say nothing about learning.",
)
@click.option(
    "--data",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("data/demo"),
    show_default=True,
    help="The synthetic demo set; written there (psyrl demo-data) unless its three files exist.",
)
@click.option("--sft-set", multiple=True, metavar="KEY=VALUE", help="A --set for the SFT stage.")
@click.option(
    "--tgrpo-set", multiple=True, metavar="KEY=VALUE", help="A --set for the T-GRPO stage."
)
@click.option(
    "--eval-limit",
    type=click.IntRange(min=0),
    default=0,
    help="Items per subdimension in the multiple-choice evaluation (default: all; --quick: 2).",
)
def demo_command(out, ranks, reward, quick, data, sft_set, tgrpo_set, eval_limit):
    """The demo from an empty directory: write the SYNTHETIC demo set, SFT the tiny model, start
    T-GRPO from its median-F1 checkpoint (appendix B), then the summary, the curves, the
    multiple-choice evaluation and the HTML report. Each stage prints the command it runs. Run it
    again after an interruption: finished stages are skipped, an interrupted training run resumes
    from its newest checkpoint. About 17 minutes on 2 CPU cores (--quick: a few)."""
    from psyrl.recipes.demo import Demo, run_demo

    with reported("psyrl demo"):
        run_demo(Demo(out, ranks, reward, quick, data, sft_set, tgrpo_set, eval_limit))
