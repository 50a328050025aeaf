"""The generating tools' command line (evaluate.py, `psyrl build`): one set of generation options,
named, helped and checked by the config keys they stand for ([model], [run], [sampler], [rollout],
[log]), so the tools and the trainers share one configuration vocabulary. Imports no torch: a tool's
--help stays instant (the start-up that uses them is psyrl.runtime.generation)."""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import typing
from dataclasses import dataclass
from typing import NoReturn

import click

from psyrl.core.config import LogConfig, ModelConfig, RolloutConfig, RunConfig, SamplerConfig
from psyrl.core.tomlconf import FieldError, field_docs


@dataclass(frozen=True)
class GenerationOptions:
    """A generating tool's command line: one field per option (`--top-p`: top_p), --help's order."""

    model: str | None
    temperature: float
    top_p: float
    max_new_tokens: int
    samples: int
    seed: int
    batch: int
    tokenizer: str
    dtype: str
    """auto, float32 or bfloat16."""
    device: str
    engine: str
    tensor_parallel: int
    gpu_memory_utilization: float
    progress: bool


@dataclass(frozen=True)
class OptionKey:
    """The config key an option stands for: its type, default and --help come from the key, and the
    tool refuses what the key's table refuses."""

    table: type
    key: str
    cut: str | None = None
    """Where the key's docstring stops holding for a tool that only generates."""
    note: str = ""
    """What holds instead, for both tools."""

    def default(self):
        return getattr(self.table(), self.key)


OPTION_KEYS = {
    "model": OptionKey(ModelConfig, "path", cut="; empty"),
    "temperature": OptionKey(
        RolloutConfig, "valid_temperature", cut=" of validation", note="0 = greedy."
    ),
    "top_p": OptionKey(RolloutConfig, "top_p", cut=", for training"),
    "max_new_tokens": OptionKey(RolloutConfig, "max_new_tokens"),
    "samples": OptionKey(RolloutConfig, "samples"),
    "seed": OptionKey(RunConfig, "seed"),
    "batch": OptionKey(
        SamplerConfig,
        "batch",
        note="Also the prompts each rank generates per round, with either engine.",
    ),
    "tokenizer": OptionKey(ModelConfig, "tokenizer", cut=", or `tiny` when"),
    "dtype": OptionKey(
        ModelConfig,
        "dtype",
        cut="; master",
        note="bfloat16: autocast with torch, the engine dtype with vllm; "
        "auto = bfloat16 on CUDA, float32 on a CPU.",
    ),
    "device": OptionKey(RunConfig, "device", note="Under torchrun, rank r takes GPU r."),
    "engine": OptionKey(SamplerConfig, "engine", cut=" Both take"),
    "tensor_parallel": OptionKey(SamplerConfig, "tensor_parallel"),
    "gpu_memory_utilization": OptionKey(SamplerConfig, "gpu_memory_utilization"),
    "progress": OptionKey(LogConfig, "progress"),
}
# where both tools differ from the trainers' config: --model has no default, one generation per
# prompt, smaller batches, and --dtype auto
TOOL_DEFAULTS = {"model": None, "samples": 1, "batch": 16, "dtype": "auto"}
CHECKED = (
    "temperature",
    "top_p",
    "max_new_tokens",
    "samples",
    "batch",
    "tensor_parallel",
    "gpu_memory_utilization",
)  # not --seed: the tools take any int, run.seed only >= 0


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


@functools.cache
def _docs(table: type) -> dict[str, str]:
    return field_docs(table)  # parses config.py: once per table, not once per option


def _option(name: str, default, note: str, required: bool, engines: tuple[str, ...] = ()):
    spec = OPTION_KEYS[name]
    doc = _docs(spec.table)[spec.key]
    if spec.cut:  # a ValueError at import if the docstring changed
        doc = doc[: doc.index(spec.cut)].removesuffix(".") + "."
    help_text = " ".join(text for text in (doc, spec.note, note) if text)
    hint = typing.get_type_hints(spec.table)[spec.key]
    if hint is bool:
        return click.option(
            f"{flag(name)}/--no-{flag(name)[2:]}",
            default=default,
            show_default=True,
            help=help_text,
        )
    if name == "model":
        kind = click.Path(file_okay=False)
    elif typing.get_origin(hint) is typing.Literal:  # --dtype adds auto
        kind = click.Choice(
            [
                *(["auto"] if name == "dtype" else []),
                *typing.get_args(hint),
                *(engines if name == "engine" else ()),
            ]
        )
    else:
        kind = hint
    if required:
        return click.option(flag(name), type=kind, required=True, help=help_text)
    shown = {} if name in ("model", "tokenizer") else {"show_default": True}  # no default to show
    return click.option(flag(name), type=kind, default=default, help=help_text, **shown)


def generation_options(
    omit=(),
    notes: dict[str, str] | None = None,
    model_required: bool = True,
    engines: tuple[str, ...] = (),
    **defaults,
):
    """The click options of the GenerationOptions fields but `omit`, defaulting to `defaults`, else
    TOOL_DEFAULTS, else the config's; `notes[name]` ends an option's help where the tool means more;
    `engines`: --engine choices of this tool only, beyond the trainers' (evaluate.py: openai). The
    command receives them as one GenerationOptions, `gen`."""
    notes = notes or {}

    def default(name: str):
        return defaults.get(name, TOOL_DEFAULTS.get(name, OPTION_KEYS[name].default()))

    names = [f.name for f in dataclasses.fields(GenerationOptions) if f.name not in omit]
    fixed = {name: default(name) for name in omit}

    def decorate(command):
        @functools.wraps(command)
        def with_options(*args, **kwargs):
            values = {name: kwargs.pop(name) for name in names}
            return command(*args, gen=GenerationOptions(**values, **fixed), **kwargs)

        for name in reversed(names):
            required = name == "model" and model_required
            option = _option(name, default(name), notes.get(name, ""), required, engines)
            with_options = option(with_options)
        return with_options

    return decorate


def option_problems(gen: GenerationOptions) -> list[str]:
    """`--top-p must be in (0, 1]`, ... for each option whose config key refuses its value."""
    problems = []
    for name in CHECKED:
        spec = OPTION_KEYS[name]
        try:
            spec.table(**{spec.key: getattr(gen, name)})
        except FieldError as e:
            problems.append(f"{flag(name)} must be {_bound(e)}")
    return problems


def _bound(error: FieldError) -> str:
    """The tools' words for a table's bound: `expected >= 1, got 0` -> `>= 1`, `expected 0 < top_p
    <= 1, got 0` -> `in (0, 1]`."""
    wanted = error.message.split(", got ")[0].removeprefix("expected ")
    interval = re.fullmatch(rf"(\S+) (<=?) {error.key} (<=?) (\S+)", wanted)
    if interval:
        low, low_op, high_op, high = interval.groups()
        opening, closing = "[" if low_op == "<=" else "(", "]" if high_op == "<=" else ")"
        return f"in {opening}{low}, {high}{closing}"
    return wanted


def fail_once(error: Exception, prog: str, shared: tuple[type, ...]) -> NoReturn:
    """End a tool's run on `error` as one click message from rank 0. Another rank exits quietly when
    the error is of a `shared` type (input and settings errors, every rank's alike) and says it
    otherwise: it may be its alone."""
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        if not isinstance(error, shared):
            click.echo(f"{prog}: rank {rank}: {error}", err=True)
        raise SystemExit(1) from None
    raise click.ClickException(str(error)) from None
