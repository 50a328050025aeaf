"""`psyrl plan` end to end (psyrl.plan.table's text through the command line): every phase, a named
fix, SFT and host RAM, one error for a bad model path, the help, and the installed command."""

import subprocess
import sys

from click.testing import CliRunner

from psyrl.cli.main import main


def test_cli_plans_every_phase():
    result = CliRunner().invoke(main, ["plan", "--config", "configs/tgrpo/qwen2.5-3b.toml"])
    assert result.exit_code == 0, result.output
    rows = [line.split()[0] for line in result.output.splitlines() if line[:1].isalpha()]
    for phase in ("rollout", "experience", "update", "sync", "validation", "checkpoint"):
        assert phase in rows, phase
    assert "memory plan: fits 4 x 48 GiB" in result.output
    assert "suggested sampler.gpu_memory_utilization" in result.output
    assert "fsdp.defer_grad_sync = true: +11.50 GiB" in result.output  # 4 B x 3.0859B parameters
    assert "host RAM per node" in result.output
    # the time model: seconds beside the memory, the step, the run, the alternatives, the sources
    assert "/step" in result.output and "predicted step on 4 x a6000" in result.output
    assert "predicted run: 315 steps" in result.output
    assert "sampler.tensor_parallel = 1" in result.output
    assert "optim.micro_batch_tokens = 32768" in result.output
    assert "RTX A6000 datasheet" in result.output and "not modelled: score" in result.output


def test_cli_small_gpus_name_a_fix():
    result = CliRunner().invoke(
        main, ["plan", "--config", "configs/tgrpo/qwen2.5-3b.toml", "--gpu-memory-gib", "8"]
    )
    assert result.exit_code == 3, result.output
    assert " NO " in result.output
    assert "update: needs" in result.output and "set fsdp.offload" in result.output
    assert "memory plan: experience needs" in result.output


def test_cli_sft_and_host_memory():
    result = CliRunner().invoke(
        main, ["plan", "--config", "configs/sft/qwen2.5-0.5b.toml", "--host-memory-gib", "1"]
    )
    assert result.exit_code == 3, result.output
    assert "(sft)" in result.output and "rollout" not in result.output
    assert "does NOT fit 1 GiB" in result.output


def test_cli_bad_model_path_is_one_error():
    result = CliRunner().invoke(
        main,
        [
            "plan",
            "--config",
            "configs/tgrpo/qwen2.5-3b.toml",
            "--set",
            'model.path="/nowhere/Mistral-7B"',
        ],
    )
    assert result.exit_code == 1
    assert result.output.count("Error:") == 1 and "/nowhere/Mistral-7B" in result.output
    assert "Traceback" not in result.output


def test_cli_help():
    result = CliRunner().invoke(main, ["plan", "--help"])
    assert result.exit_code == 0
    for text in (
        "--gpus",
        "--gpu-memory-gib",
        "--host-memory-gib",
        "--trainer",
        "--device",
        "a6000|a100-40|a100-80|h100|h200|l20|cpu",
        "--response-tokens",
        "half of rollout.max_new_tokens",
        "--prompt-tokens",
        "rollout",
        "Exit status",
    ):
        assert text in result.output, text


def test_installed_command_runs():
    result = subprocess.run(
        [sys.executable, "-m", "psyrl", "plan", "--config", "configs/tgrpo/qwen2.5-0.5b.toml"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert "memory plan: fits" in result.stdout
