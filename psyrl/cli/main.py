"""The `psyrl` command group: every command of psyrl, each registered once.

    psyrl --help                                   (the commands, each with its short help)
    torchrun --nproc_per_node 4 -m psyrl train-tgrpo --config ...   (any command under torchrun)

The modules of this package import click and psyrl's configuration and data layers only; each
command imports the model code (torch, transformers) when it runs, so `psyrl --help` and every
`psyrl CMD --help` answer at once (bench/cli_startup.py).
"""

from __future__ import annotations

import click

from psyrl.cli.build import build_group
from psyrl.cli.checkpoint import checkpoint_group
from psyrl.cli.config import config_group, plan_command
from psyrl.cli.data import data_group, demo_data_command, tiny_tokenizer_command
from psyrl.cli.demo import demo_command
from psyrl.cli.evaluate import evaluate, self_label_command
from psyrl.cli.experiment import experiment_command
from psyrl.cli.reward import reward_group
from psyrl.cli.runs import plot_command, report_command, select_checkpoint_command, summary_command
from psyrl.cli.train import train_sft, train_tgrpo


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """psyrl: T-GRPO with the bilateral reward ("From Stimuli to Minds"), in pure PyTorch."""


for command in (
    train_sft,
    train_tgrpo,
    evaluate,
    select_checkpoint_command,
    checkpoint_group,
    self_label_command,
    build_group,
    data_group,
    demo_command,
    demo_data_command,
    experiment_command,
    plan_command,
    config_group,
    reward_group,
    plot_command,
    summary_command,
    report_command,
    tiny_tokenizer_command,
):
    main.add_command(command)
