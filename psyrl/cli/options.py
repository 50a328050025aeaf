"""The options the command line shares: the generating tools' generation options (evaluate.py,
`psyrl build`), whose type and default come from the config keys they stand for and whose help is
written beside them (`psyrl.core.generation_options.OPTION_KEYS`), and the trainers' --config,
--set, --overwrite, --resume."""

from __future__ import annotations

import dataclasses
import functools
import typing
from collections.abc import Callable

import click

from psyrl.core.generation_options import OPTION_KEYS, TOOL_DEFAULTS, GenerationOptions, flag


def _option(name: str, default, note: str, required: bool, engines: tuple[str, ...] = ()):
    spec = OPTION_KEYS[name]
    help_text = " ".join(text for text in (spec.help, note) if text)
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


def trainer_options(kind: str, state: str) -> Callable[[Callable], Callable]:
    """The options of both trainers, in --help's order: --config, --set, --overwrite, --resume,
    --extend (`kind`: sft or tgrpo, the trainer's presets; `state`: what a checkpoint restores, for
    --resume's help)."""
    options = [
        click.option(
            "--config",
            "config_path",
            type=click.Path(dir_okay=False),
            required=True,
            help=f"TOML run config: a file, or a preset shipped with psyrl ({kind}/tiny, or just "
            "tiny; `psyrl config list`). Its paths are relative to the working directory.",
        ),
        click.option(
            "--set",
            "overrides",
            multiple=True,
            metavar="TABLE.KEY=VALUE",
            help="Override one key; repeatable.",
        ),
        click.option(
            "--overwrite", is_flag=True, help="Delete an existing runs/<name>/ and start over."
        ),
        # an optional value: --resume alone is `on`
        click.option(
            "--resume",
            type=click.Choice(["on", "auto"]),
            is_flag=False,
            flag_value="on",
            default=None,
            help=f"Continue runs/<name>/ from its newest complete checkpoint ({state}); the config "
            "may differ only in run.name, run.output_dir and the log, checkpoint and fsdp tables. "
            "--resume auto (run.resume): continue from the newest checkpoint that passes its "
            "checks, start afresh when there is no run, start over when the run stopped before "
            "its first checkpoint (no checkpoint directory), refuse, deleting nothing, when every "
            "checkpoint is damaged; for torchrun --max-restarts, whose restarts run the same "
            "command.",
        ),
        click.option(
            "--extend",
            is_flag=True,
            help="With --resume: let run.steps grow beyond the steps the run was planned for "
            "(--set run.steps=N), and nothing else change (run.extend).",
        ),
    ]

    def decorate(command: Callable) -> Callable:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate
