"""The `psyrl` command group: the three programs are the same commands as the top-level scripts,
each script names its loop itself, every --help answers without importing torch or transformers
(what keeps it instant: bench/cli_startup.py has the times), and the installed console script runs
a trainer end to end."""

import inspect
import json
import socket
import subprocess
import sys
from pathlib import Path

import click
import pytest

import evaluate
import psyrl.cli.train
import train_sft
import train_tgrpo
from psyrl.cli.main import main
from psyrl.core.records import DataError
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
    assert main.get_command(ctx, "train-sft") is psyrl.cli.train.train_sft
    assert main.get_command(ctx, "train-tgrpo") is psyrl.cli.train.train_tgrpo
    assert main.get_command(ctx, "evaluate") is evaluate.evaluate


@pytest.mark.parametrize("script, recipe", [(train_sft, "sft"), (train_tgrpo, "tgrpo")])
def test_each_script_names_its_loop_and_launcher(script, recipe, capsys):
    # one step from the entry script to the loop: its main imports the recipe's train and the
    # launcher itself, as torchtune's recipe_main does
    body = inspect.getsource(script.main)
    assert f"from psyrl.recipes.{recipe} import train" in body
    assert "from psyrl.run.launch import launch" in body
    assert "launch(train, " in body
    with pytest.raises(SystemExit) as exit_:
        script.main(["--help"])
    assert exit_.value.code == 0 and "--config" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exit_:
        script.main(["--config"])
    assert exit_.value.code == 2 and "requires an argument" in capsys.readouterr().err


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


# A rank other than 0 failing on an input error, with a preemption handler that would ignore
# SIGTERM: it must keep quiet and wait until torchrun, having seen rank 0 fail, terminates it.
OTHER_RANK = """
import os, signal
os.environ["RANK"] = "1"
signal.signal(signal.SIGTERM, lambda *_: None)
from psyrl.cli.errors import fail
from psyrl.core.errors import RunError
print("waiting", flush=True)
fail(RunError("optim.lr: expected > 0, got -1"), "train_sft.py")
"""


def test_another_rank_waits_quietly_for_rank_0_until_terminated():
    child = subprocess.Popen(
        [sys.executable, "-c", OTHER_RANK],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout.readline() == "waiting\n"
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=1.0)  # still waiting for rank 0 to say the error
    child.terminate()
    assert child.wait(timeout=10) == -15
    assert child.stderr.read() == ""


def test_another_rank_names_itself_on_its_own_error(monkeypatch, capsys):
    from psyrl.cli import errors

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(errors, "wait_for_rank0", lambda: pytest.fail("must not wait"))
    with pytest.raises(SystemExit) as stopped:
        errors.fail(OSError(28, "No space left on device"), "train_sft.py")
    assert stopped.value.code == 1
    assert capsys.readouterr().err == (
        f"train_sft.py: rank 1 on {socket.gethostname()}: [Errno 28] No space left on device\n"
    )


def test_another_rank_says_a_node_local_input_error_after_the_wait(monkeypatch, capsys):
    """A train file missing on one node only: rank 0 does not fail, torchrun does not end this
    rank, so when the wait is over it says the error itself, with its rank and host."""
    from psyrl.cli import errors

    monkeypatch.setenv("RANK", "5")
    waited = []
    monkeypatch.setattr(errors, "wait_for_rank0", lambda: waited.append(True))
    with pytest.raises(SystemExit) as stopped:
        errors.fail(DataError("data/train.jsonl: no such file"), "train_tgrpo.py")
    assert waited == [True] and stopped.value.code == DataError.exit_code
    assert capsys.readouterr().err == (
        f"train_tgrpo.py: rank 5 on {socket.gethostname()}: data/train.jsonl: no such file\n"
    )
