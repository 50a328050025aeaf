"""`psyrl plot` and `psyrl summary` on metrics files written here: the panels, the PNG, the
start/end table, and the errors on bad input."""

import json

import pytest
from click.testing import CliRunner

from psyrl.cli.main import main
from psyrl.report.plot import moving_average

# the `plot` extra; `make test` installs it with `dev`
matplotlib = pytest.importorskip("matplotlib")


def write_run(directory, variant, slope):
    """A T-GRPO-like run: steps 0..20, per-step rewards rising by `slope`, validation at 0, 10 and
    20."""
    directory.mkdir(parents=True)
    rows = [{"step": 0, "steps": 20, "valid/f1": 0.5, "valid/reward": 0.6}]
    for step in range(1, 21):
        row = {
            "step": step,
            "steps": 20,
            "reward/final": 0.5 + slope * step,
            "reward/f1": 0.4 + slope * step,
            "reward/format": 0.9,
            "reward/repetition_penalty": 0.01,
            "response/length": 30.0 + step,
            "actor/kl": 0.001 * step,
        }
        if variant == "bilateral":
            row["reward/br"] = 0.02
        if step % 10 == 0:
            row["valid/f1"], row["valid/reward"] = 0.5 + slope * step, 0.6 + slope * step
        rows.append(row)
    (directory / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (directory / "config.resolved.toml").write_text(f'[reward]\nvariant = "{variant}"\n')


def test_plot_overlays_runs_in_one_png(tmp_path):
    write_run(tmp_path / "br", "bilateral", 0.01)
    write_run(tmp_path / "base", "base", 0.005)
    out = tmp_path / "both.png"
    result = CliRunner().invoke(
        main, ["plot", str(tmp_path / "br"), str(tmp_path / "base"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert (
        "9 panels: reward/final, reward/f1, reward/format, reward/repetition_penalty, "
        "reward/br, valid/f1, valid/reward, response/length, actor/kl"
    ) in result.output
    image = matplotlib.image.imread(out)
    # 3 x 4 panels, 100 dpi
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and image.shape[:2] == (960, 1680)
    # one run, default output next to it; a run without BR gets no BR panel
    result = CliRunner().invoke(main, ["plot", str(tmp_path / "base"), "--smooth", "1"])
    assert result.exit_code == 0 and (tmp_path / "base" / "curves.png").exists()
    assert "8 panels" in result.output and "reward/br" not in result.output


def test_plot_and_summary_refuse_bad_input_with_the_file_and_line(tmp_path):
    runner = CliRunner()
    (tmp_path / "empty").mkdir()
    result = runner.invoke(main, ["plot", str(tmp_path / "empty")])
    assert result.exit_code != 0
    assert f"{tmp_path / 'empty' / 'metrics.jsonl'}: not found" in result.output
    bad = tmp_path / "bad"
    write_run(bad, "base", 0.0)
    with (bad / "metrics.jsonl").open("a") as f:
        f.write('{"step": 21, "reward/final": 0.5\n')  # a line cut short by a crash
    for command in ("plot", "summary"):
        result = runner.invoke(main, [command, str(bad)])
        assert result.exit_code != 0, command
        assert f"{bad / 'metrics.jsonl'}:22: invalid JSON" in result.output, command
    sft = tmp_path / "sft"
    sft.mkdir()
    (sft / "metrics.jsonl").write_text('{"step": 1, "train/loss": 2.0}\n')
    result = runner.invoke(main, ["plot", str(sft)])
    assert result.exit_code != 0 and "none of the runs logged a metric psyrl plots" in result.output


def test_summary_compares_the_first_and_last_steps(tmp_path):
    write_run(tmp_path / "br", "bilateral", 0.01)
    result = CliRunner().invoke(main, ["summary", str(tmp_path / "br"), "--window", "5"])
    assert result.exit_code == 0, result.output
    row = result.output.strip().splitlines()[-1]
    # held-out F1 0.5 -> 0.7; final reward: mean of steps 1-5 = 0.53, of steps 16-20 = 0.68
    assert row.startswith(
        "| br | bilateral | 20 | 0.500 → 0.700 (+0.200) (step 0 → 20) | 0.600 → 0.800 (+0.200) | "
        "0.530 → 0.680 (+0.150) |"
    )
    assert "| 33.0 → 48.0 (+15.0) |" in row


def test_moving_average_is_a_trailing_mean():
    assert moving_average([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
    assert moving_average([5.0], 3) == [5.0]
