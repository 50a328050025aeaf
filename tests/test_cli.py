"""The `psyrl` command group: the three programs are the same commands as the top-level scripts,
each script names its loop itself, every --help answers without importing torch or transformers
(what keeps it instant: bench/cli_startup.py has the times), and the installed console script runs
a trainer end to end."""

import json
import subprocess
import sys
from pathlib import Path

import click
import pytest

import evaluate
import psyrl.recipes.sft
import psyrl.recipes.tgrpo
import train_sft
import train_tgrpo
from psyrl.cli.main import main
from psyrl.core.runlog import read_metrics

# Walks the whole command tree, asking each command for --help in one fresh interpreter, then
# reports which heavy libraries got imported.
WALK = """
import json, sys
import click
from click.testing import CliRunner
from psyrl.cli.main import main

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
    assert main.get_command(ctx, "train-sft") is train_sft.train_sft
    assert main.get_command(ctx, "train-tgrpo") is train_tgrpo.train_tgrpo
    assert main.get_command(ctx, "evaluate") is evaluate.evaluate


def test_each_script_names_its_loop():
    # one step from the entry script to the loop: the script's `loop` imports it, and the
    # command the script runs is the psyrl command's
    assert train_sft.loop() is psyrl.recipes.sft.train
    assert train_tgrpo.loop() is psyrl.recipes.tgrpo.train


def test_every_command_is_registered_once():
    def commands(group):
        for name, command in group.commands.items():
            yield name, command
            if isinstance(command, click.Group):
                yield from commands(command)

    seen = [command for _, command in commands(main)]
    assert len(seen) == len({id(c) for c in seen})


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
