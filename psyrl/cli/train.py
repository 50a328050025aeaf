"""The trainers' command line: `train_sft.py` / `psyrl train-sft` and `train_tgrpo.py` / `psyrl
train-tgrpo` (--config, --set, --overwrite, --resume, --extend), around
`psyrl.run.launch.launch` of the recipe's loop.

An entry script hands its command the function that imports its loop (`train_tgrpo(obj=loop)`), so
a reader goes from the script to the loop in one step; `psyrl train-tgrpo` uses the same import.
The loop (torch, transformers) is imported when the command runs: --help answers at once.
"""

from __future__ import annotations

import click

from psyrl.cli.errors import reported
from psyrl.cli.options import trainer_options
from psyrl.core.presets import resolve_config

HELP = {"help_option_names": ["-h", "--help"]}
TGRPO_STATE = "model, optimiser, trajectory cache, data position, RNG"


def extended(overrides: tuple[str, ...], extend: bool) -> tuple[str, ...]:
    """--extend is run.extend = true, set last."""
    return (*overrides, "run.extend=true") if extend else overrides


def sft_loop():
    """The SFT loop, `train` in psyrl/recipes/sft.py."""
    from psyrl.recipes.sft import train

    return train


def tgrpo_loop():
    """The T-GRPO loop, `train` in psyrl/recipes/tgrpo.py."""
    from psyrl.recipes.tgrpo import train

    return train


@click.command("train-sft", context_settings=HELP)
@trainer_options("sft", "model, optimiser, data position, RNG")
@click.pass_obj
def train_sft(loop, config_path, overrides, overwrite, resume, extend):
    """Supervised fine-tuning on StimuliQA-format records (SFT target:
    <think>reasoning</think><answer>…). Run it with python (one process) or under torchrun (FSDP2
    over all ranks)."""
    from psyrl.run.launch import launch

    with reported("train-sft"):
        config = resolve_config(config_path, "sft")
        launch((loop or sft_loop)(), config, extended(overrides, extend), overwrite, resume)


@click.command("train-tgrpo", context_settings=HELP)
@trainer_options("tgrpo", TGRPO_STATE)
@click.pass_obj
def train_tgrpo(loop, config_path, overrides, overwrite, resume, extend):
    """T-GRPO on StimuliQA-format records: the trajectory cache and the bilateral reward of "From
    Stimuli to Minds". Starts from model.path (appendix B: the median-F1 SFT checkpoint). Run it
    with python (one process) or under torchrun (FSDP2 over all ranks)."""
    from psyrl.run.launch import launch

    with reported("train-tgrpo"):
        config = resolve_config(config_path, "tgrpo")
        launch((loop or tgrpo_loop)(), config, extended(overrides, extend), overwrite, resume)
