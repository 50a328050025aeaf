"""The trainers' command line: `train_sft.py` / `psyrl train-sft` and `train_tgrpo.py` / `psyrl
train-tgrpo` (--config, --set, --overwrite, --resume, --extend).

An entry script parses its arguments here (`parse_trainer_args`), then names its loop and the
launcher itself (`psyrl.run.launch.launch(train, ...)`), as torchtune's `recipe_main` does; the
psyrl commands below run the same two lines. The loop (torch, transformers) is imported after the
arguments are parsed: --help and a bad option answer at once.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import click

from psyrl.cli.errors import reported, script_errors
from psyrl.cli.options import trainer_options
from psyrl.core.presets import resolve_config

HELP = {"help_option_names": ["-h", "--help"]}
TGRPO_STATE = "model, optimiser, trajectory cache, data position, RNG"


def extended(overrides: tuple[str, ...], extend: bool) -> tuple[str, ...]:
    """--extend is run.extend = true, set last."""
    return (*overrides, "run.extend=true") if extend else overrides


@dataclass(frozen=True)
class TrainerArgs:
    """A trainer's command line, parsed: what `launch` takes."""

    config: str
    """The TOML config: the file given, or the shipped preset it names."""
    overrides: tuple[str, ...]
    """--set table.key=value, in order (--extend adds run.extend=true last)."""
    overwrite: bool
    resume: str | None
    """--resume: "on" or "auto"; None when not given (the config's run.resume holds)."""


def parse_trainer_args(prog: str, argv: list[str] | None = None) -> TrainerArgs:
    """An entry script's arguments (`prog`: train-sft or train-tgrpo), parsed by the psyrl
    command's own options: --help prints and exits 0, a bad option exits 2 with click's message."""
    command = {"train-sft": train_sft, "train-tgrpo": train_tgrpo}[prog]
    argv = sys.argv[1:] if argv is None else argv
    try:
        params = command.make_context(os.path.basename(sys.argv[0]), list(argv)).params
    except click.exceptions.Exit as e:  # --help
        raise SystemExit(e.exit_code) from None
    except click.ClickException as e:
        e.show()
        raise SystemExit(e.exit_code) from None
    with script_errors(prog):
        config = resolve_config(params["config_path"], prog.removeprefix("train-"))
    overrides = extended(params["overrides"], params["extend"])
    return TrainerArgs(config, overrides, params["overwrite"], params["resume"])


@click.command("train-sft", context_settings=HELP)
@trainer_options("sft", "model, optimiser, data position, RNG")
def train_sft(config_path, overrides, overwrite, resume, extend):
    """Supervised fine-tuning on StimuliQA-format records (SFT target:
    <think>reasoning</think><answer>…). Run it with python (one process) or under torchrun (FSDP2
    over all ranks)."""
    with reported("train-sft"):
        config = resolve_config(config_path, "sft")
        from psyrl.recipes.sft import train  # the loop
        from psyrl.run.launch import launch

        launch(train, config, extended(overrides, extend), overwrite, resume)


@click.command("train-tgrpo", context_settings=HELP)
@trainer_options("tgrpo", TGRPO_STATE)
def train_tgrpo(config_path, overrides, overwrite, resume, extend):
    """T-GRPO on StimuliQA-format records: the trajectory cache and the bilateral reward of "From
    Stimuli to Minds". Starts from model.path (appendix B: the median-F1 SFT checkpoint). Run it
    with python (one process) or under torchrun (FSDP2 over all ranks)."""
    with reported("train-tgrpo"):
        config = resolve_config(config_path, "tgrpo")
        from psyrl.recipes.tgrpo import train  # the loop
        from psyrl.run.launch import launch

        launch(train, config, extended(overrides, extend), overwrite, resume)
