"""The `psyrl` command group (SPEC §9): tools beside the three flat entry scripts."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import click

from psyrl.config import ConfigError, config_reference, dump_config, load_config

README_START, README_END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """psyrl: T-GRPO with the bilateral reward ("From Stimuli to Minds"), in pure PyTorch."""


@main.group()
def config():
    """Check, print and document run configurations."""


@config.command("show")
@click.option(
    "--config", "path", type=click.Path(dir_okay=False), default=None, help="TOML config file (default: all defaults)."
)
@click.option("--set", "overrides", multiple=True, metavar="TABLE.KEY=VALUE", help="Override one key; repeatable.")
def show(path, overrides):
    """Validate a config and print it resolved (defaults and overrides applied), as TOML."""
    try:
        click.echo(dump_config(load_config(path, overrides)), nl=False)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


@config.command("reference")
@click.option(
    "--write-readme",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help=f"Replace the text between {README_START} and {README_END} in this file instead of printing.",
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
    path.write_text(pattern.sub(lambda _: f"{README_START}\n{text}\n{README_END}", readme), encoding="utf-8")
    click.echo(f"wrote the config reference into {path}", err=True)


if __name__ == "__main__":
    sys.exit(main())
