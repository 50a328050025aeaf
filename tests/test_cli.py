"""The `psyrl` command group: the three programs are the same commands as the top-level scripts,
every --help answers without importing torch or transformers (what keeps it instant:
bench/cli_startup.py has the times), the lazily listed short help is each command's own, and the
installed console script runs a trainer end to end."""

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

import evaluate
import train_sft
import train_tgrpo
from psyrl.cli import COMMANDS, DATA_COMMANDS, LazyGroup, main
from psyrl.core.runlog import read_metrics

# Walks the whole command tree, asking each command for --help in one fresh interpreter, then
# reports which heavy libraries got imported.
WALK = """
import json, sys
import click
from click.testing import CliRunner
from psyrl.cli import main

def paths(command, prefix):
    yield prefix
    if isinstance(command, click.Group):
        ctx = click.Context(command)
        for name in command.list_commands(ctx):
            yield from paths(command.get_command(ctx, name), prefix + [name])

runner, seen = CliRunner(), []
for path in paths(main, []):
    result = runner.invoke(main, [*path, "--help"], prog_name="psyrl")
    assert result.exit_code == 0, (path, result.output)
    assert "Usage: psyrl" in result.output, (path, result.output)
    seen.append(" ".join(path))
heavy = [m for m in ("torch", "transformers", "vllm", "pyarrow", "datasets", "matplotlib")
         if m in sys.modules]
print(json.dumps({"commands": seen, "heavy": heavy}))
"""


def test_every_help_answers_without_torch():
    out = subprocess.run([sys.executable, "-c", WALK], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    walked = json.loads(out.stdout.splitlines()[-1])
    assert walked["heavy"] == []
    for command in (
        "",
        "train-sft",
        "train-tgrpo",
        "evaluate",
        "evaluate compare",
        "build qa",
        "build reasoning",
        "data convert",
        "data check",
        "report",
        "plan",
        "demo-data",
    ):
        assert command in walked["commands"]


def test_programs_are_the_scripts_commands():
    ctx = click.Context(main)
    assert main.get_command(ctx, "train-sft") is train_sft.main
    assert main.get_command(ctx, "train-tgrpo") is train_tgrpo.main
    assert main.get_command(ctx, "evaluate") is evaluate.main


@pytest.mark.parametrize(
    "group,table", [(main, COMMANDS), (main.get_command(None, "data"), DATA_COMMANDS)]
)
def test_listed_short_help_is_the_commands_own(group, table):
    assert isinstance(group, LazyGroup)
    for name, (_, listed) in table.items():
        command = group.get_command(click.Context(group), name)
        assert command.get_short_help_str(limit=10**6) == listed, name


def test_listed_short_help_is_cut_to_the_terminal():
    group = LazyGroup("g", lazy={"long": ("json:dumps", "word " * 40 + "end.")})
    formatter = click.HelpFormatter(width=60)
    group.format_commands(click.Context(group), formatter)
    line = formatter.getvalue().splitlines()[1]
    assert line.endswith("...") and len(line) <= 60, line


@pytest.mark.slow
def test_installed_console_script_trains(tmp_path):
    psyrl = Path(sys.executable).with_name("psyrl")  # the console script pip installed
    sets = [
        f"run.output_dir={json.dumps(str(tmp_path))}",
        "run.steps=2",
        "checkpoint.every=0",
        "data.valid_file=''",
        "log.progress=false",
    ]
    args = [str(psyrl), "train-sft", "--config", "configs/sft/tiny.toml"]
    out = subprocess.run(
        args + [a for s in sets for a in ("--set", s)], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    rows = read_metrics(tmp_path / "tiny-sft" / "metrics.jsonl")
    assert [r["step"] for r in rows] == [1, 2]
    assert (tmp_path / "tiny-sft" / "hf" / "model.safetensors").is_file()
