"""`psyrl config show|reference` (the resolved config, the generated reference of every key) and
`psyrl plan` (the memory a run needs, phase by phase, before it starts)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from psyrl.cli.errors import reported
from psyrl.core.config import config_reference, dump_config, load_config

README_START, README_END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


@click.group("config")
def config_group():
    """Check, print and document run configurations."""


@config_group.command("show")
@click.option(
    "--config",
    "path",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML config file (default: all defaults).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="TABLE.KEY=VALUE",
    help="Override one key; repeatable.",
)
def show(path, overrides):
    """Validate a config and print it resolved (defaults and overrides applied), as TOML."""
    with reported("psyrl config show"):
        click.echo(dump_config(load_config(path, overrides)), nl=False)


@config_group.command("reference")
@click.option(
    "--write-readme",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help=f"Replace the text between {README_START} and {README_END} in this file instead of "
    "printing.",
)
def reference(write_readme):
    """Print the Markdown reference of every config table and key (generated from the code)."""
    text = config_reference()
    if write_readme is None:
        click.echo(text)
        return
    path = Path(write_readme)
    readme = path.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(README_START) + ".*?" + re.escape(README_END), re.DOTALL)
    if not pattern.search(readme):
        raise click.ClickException(f"{path}: markers {README_START} ... {README_END} not found")
    path.write_text(
        pattern.sub(lambda _: f"{README_START}\n{text}\n{README_END}", readme), encoding="utf-8"
    )
    click.echo(f"wrote the config reference into {path}", err=True)


@click.command("plan")
@click.option(
    "--config",
    "path",
    type=click.Path(dir_okay=False),
    required=True,
    help="TOML run config, e.g. configs/tgrpo/qwen2.5-3b.toml.",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="TABLE.KEY=VALUE",
    help="Override one key; repeatable.",
)
@click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="GPUs of the run (torchrun ranks), all on one node.",
)
@click.option(
    "--gpu-memory-gib",
    type=click.FloatRange(min=0, min_open=True),
    default=48.0,
    show_default=True,
    help="Memory of one GPU in GiB (48: RTX A6000).",
)
@click.option(
    "--host-memory-gib",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Host RAM of the node in GiB; without it the need is printed but not judged.",
)
@click.option(
    "--trainer",
    type=click.Choice(["auto", "tgrpo", "sft"]),
    default="auto",
    show_default=True,
    help="Which entry script runs the config: auto = sft when the config's path has a folder named "
    "`sft` (configs/sft/...), else tgrpo. SFT has no rollout, experience or weight sync.",
)
def plan_command(path, overrides, gpus, gpu_memory_gib, host_memory_gib, trainer):
    """The memory a run needs, before it starts: one table of GiB per GPU by part (FSDP2 shards,
    AdamW, gathered layers, gradient buffers, activations, log-probs, reference, sampler, transfers,
    CUDA context) for each phase of a step (rollout, experience log-probs, update, weight sync,
    validation, checkpoint), whether it fits, host RAM per node, and for a phase that does not fit
    the setting that makes it fit (planned again with it, not guessed). Also the suggested
    sampler.gpu_memory_utilization and what fsdp.defer_grad_sync costs.

    The architecture comes from model.path's config.json, else psyrl's copy for a path naming
    Qwen2.5-0.5B/1.5B/3B-Instruct, else (empty path) the tiny model of [model]. Every sequence is
    taken at its maximum length. Exit status: 0 when everything fits, 3 when something does not, 1
    on an error."""
    from psyrl.plan.architecture import load_architecture
    from psyrl.plan.planner import plan
    from psyrl.plan.table import format_plan

    if trainer == "auto":
        trainer = "sft" if "sft" in Path(path).parts else "tgrpo"
    with reported("psyrl plan", also=(ValueError, OSError)):
        cfg = load_config(path, overrides)
        architecture, source = load_architecture(cfg.model)
        result = plan(cfg, architecture, gpus, gpu_memory_gib, host_memory_gib, trainer=trainer)
    click.echo(f"psyrl plan: {path} ({trainer}); architecture from {source}")
    click.echo(format_plan(result))
    if not result.fits:
        sys.exit(3)
