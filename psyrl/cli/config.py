"""`psyrl config show|list|reference` (the resolved config, the presets shipped with psyrl, the
generated reference of every key) and `psyrl plan` (the memory a run needs, phase by phase, before
it starts)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from psyrl.cli.errors import reported
from psyrl.core.config import config_reference, dump_config, load_config
from psyrl.core.presets import config_presets, experiment_presets, first_comment, resolve_config

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
    help="TOML config: a file or a preset (`psyrl config list`); default: all defaults.",
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
        config = None if path is None else resolve_config(path)
        click.echo(dump_config(load_config(config, overrides)), nl=False)


@config_group.command("list")
def list_presets():
    """The presets shipped with psyrl, each with the first line of its comment: run configs
    (`--config NAME` of the trainers, `psyrl config show` and `psyrl plan`) and experiment files
    (`psyrl experiment NAME`). A file of the same path in the working directory wins over a
    preset."""
    for title, presets in (
        ("run configs (--config NAME)", config_presets()),
        ("experiments (psyrl experiment NAME)", experiment_presets()),
    ):
        click.echo(f"{title}:")
        width = max(map(len, presets))
        for name, path in presets.items():
            click.echo(f"  {name:<{width}}  {first_comment(path)}")


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
    help="TOML run config: a file or a preset (`psyrl config list`), e.g. tgrpo/qwen2.5-3b.",
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
    help="GPUs of the run (torchrun ranks), on all nodes together.",
)
@click.option(
    "--nodes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Nodes the GPUs are spread over, --gpus / --nodes each (torchrun --nnodes): host RAM is "
    "planned per node, a vLLM tensor-parallel group must fit in one, and the collectives that "
    "cross the network are listed by phase with their bytes per step.",
)
@click.option(
    "--network-gbps",
    type=click.FloatRange(min=0, min_open=True, max=float("inf"), max_open=True),
    default=25.0,
    show_default=True,
    help="With --nodes above 1: each node's network link in Gbit/s per direction (25: 25 GbE, an "
    "assumption when not given). The bytes each node sends become seconds at this line rate (a "
    "lower bound), the time model runs the collectives at the slower of it and the GPU-to-GPU "
    "link, and the plan says whether the network or the compute bounds the step.",
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
    help="Host RAM of one node in GiB; without it the need is printed but not judged.",
)
@click.option(
    "--trainer",
    type=click.Choice(["auto", "tgrpo", "sft"]),
    default="auto",
    show_default=True,
    help="Which entry script runs the config: auto = sft when the config's path has a folder named "
    "`sft` (configs/sft/...), else tgrpo. SFT has no rollout, experience or weight sync.",
)
@click.option(
    "--device",
    "device_name",
    type=click.Choice(["a6000", "a100-40", "a100-80", "h100", "h200", "l20", "cpu"]),
    default="a6000",
    show_default=True,
    help="The GPU whose spec-sheet figures (dense bf16 FLOP/s, memory bandwidth, PCIe host link, "
    "GPU-to-GPU link; the sources are printed) predict the time of each phase; cpu measures this "
    "machine (float32 matmul, copy bandwidth, eager overhead) for a few seconds and takes "
    "those. The utilisation assumed of each figure is printed with the plan. Does not change "
    "--gpu-memory-gib.",
)
@click.option(
    "--response-tokens",
    type=click.FloatRange(min=1),
    default=None,
    help="Mean tokens of a response, for the time model [default: half of "
    "rollout.max_new_tokens]. Prompt lengths come from data.train_file when it exists (rendered "
    "with the model's tokenizer), else rollout.max_prompt_tokens.",
)
@click.option(
    "--prompt-tokens",
    type=click.FloatRange(min=1),
    default=None,
    help="Mean tokens of a prompt, for the time model, in place of data.train_file's (e.g. when "
    "the data is not on this machine).",
)
def plan_command(
    path,
    overrides,
    gpus,
    nodes,
    network_gbps,
    gpu_memory_gib,
    host_memory_gib,
    trainer,
    device_name,
    response_tokens,
    prompt_tokens,
):
    """The memory a run needs, before it starts: one table of GiB per GPU by part (FSDP2 shards,
    AdamW, gathered layers, gradient buffers, activations, log-probs, reference, sampler, transfers,
    CUDA context) for each phase of a step (rollout, experience log-probs, update, weight sync,
    validation, checkpoint), whether it fits, host RAM per node, and for a phase that does not fit
    the setting that makes it fit (planned again with it, not guessed). Also the suggested
    sampler.gpu_memory_utilization (the smallest that holds sampler.max_num_seqs full-length
    sequences) and what fsdp.defer_grad_sync costs. With --nodes N: host RAM per node, and each
    phase's collectives over every rank (FSDP2's all-gathers and reduce-scatters, the weight sync's
    all-gathers, the checkpoint's gather) with the bytes each node sends over the network and their
    seconds at --network-gbps, and whether the network or the compute bounds the step.

    T-GRPO: the predicted seconds of each phase per step on --device (rollout, experience, update,
    offload moves, weight sync; validation and checkpoint each), the step and the run's total, and
    the alternatives sampler.tensor_parallel 1 vs 2 and optim.micro_batch_tokens as set vs 32768,
    with their memory and time. The reward (score) is not modelled.

    The architecture comes from model.path's config.json, else psyrl's copy for a path naming
    Qwen2.5-0.5B/1.5B/3B-Instruct, else (empty path) the tiny model of [model]. Every sequence is
    taken at its maximum length. Exit status: 0 when everything fits, 3 when something does not, 1
    on an error."""
    from psyrl.plan.architecture import load_architecture, shapes
    from psyrl.plan.planner import plan
    from psyrl.plan.speed import device, workload
    from psyrl.plan.table import format_plan

    with reported("psyrl plan", also=(ValueError, OSError)):
        path = resolve_config(path, None if trainer == "auto" else trainer)
        if trainer == "auto":
            trainer = "sft" if "sft" in path.parts else "tgrpo"
        cfg = load_config(path, overrides)
        architecture, source = load_architecture(cfg.model)
        dev, wl = None, None
        if trainer == "tgrpo":
            dev = device(device_name, shapes(architecture))
            wl = workload(cfg, response_tokens, _plan_tokenizer(cfg, source), prompt_tokens)
        result = plan(
            cfg,
            architecture,
            gpus,
            gpu_memory_gib,
            host_memory_gib,
            trainer,
            dev=dev,
            wl=wl,
            nodes=nodes,
            network_gbps=network_gbps,
        )
    click.echo(f"psyrl plan: {path} ({trainer}); architecture from {source}")
    click.echo(format_plan(result))
    if not result.fits:
        sys.exit(3)


def _plan_tokenizer(cfg, source: str):
    """The tokenizer that renders the training prompts for the time model: the run's own, else
    psyrl's shipped Qwen2.5 tokenizer when the architecture is a shipped Qwen2.5 copy (the model is
    not downloaded yet), else None (the prompts are taken at rollout.max_prompt_tokens)."""
    from psyrl.runtime.model import load_tokenizer

    try:
        return load_tokenizer(cfg.model)
    except (OSError, ValueError):
        pass
    if source.startswith("psyrl's copy of qwen2.5"):
        from dataclasses import replace

        return load_tokenizer(replace(cfg.model, tokenizer="qwen2.5"))
    return None
