"""`make demo` and `make demo-base` in a shortened form: the Makefile's recipe, `psyrl demo` (the
demo set, SFT, then T-GRPO from the median-F1 checkpoint on 2 torchrun ranks, `psyrl summary`,
`psyrl plot`, the multiple-choice evaluation, the report), with a few steps of each."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from psyrl.core.checkpoints import select_checkpoint
from psyrl.core.runlog import read_metrics

VENV = Path(sys.executable).parent.parent
ROOT = Path(__file__).resolve().parent.parent
SHORT_SFT = [
    "run.steps=6",
    "checkpoint.every=2",
    "data.valid_items=8",
    "optim.lr=3e-3",
    "log.progress=false",
]
SHORT_TGRPO = [
    "run.steps=2",
    "checkpoint.every=1",
    "data.valid_items=8",
    "rollout.prompts=4",
    "optim.global_batch=4",
    "rollout.max_new_tokens=16",
    "log.samples_every=1",
    "log.progress=false",
]


def make(target: str, out: Path) -> subprocess.CompletedProcess:
    if shutil.which("make") is None or not (VENV / ".psyrl-installed").exists():
        pytest.skip("needs make and the environment `make test` builds")
    sets = lambda option, keys: " ".join(f"{option} {k}" for k in keys)
    demo_args = f"{sets('--sft-set', SHORT_SFT)} {sets('--tgrpo-set', SHORT_TGRPO)} --eval-limit 2"
    args = ["make", "--no-print-directory", target, f"VENV={VENV}", f"DEMO_OUT={out}"]
    args.append(f"DEMO_ARGS={demo_args}")
    return subprocess.run(args, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_demo_and_demo_base_run_end_to_end(tmp_path):
    result = make("demo", tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    sft, rl = tmp_path / "tiny-sft", tmp_path / "tiny-tgrpo"
    assert [r["step"] for r in read_metrics(sft / "metrics.jsonl") if "valid/f1" in r] == [
        0,
        2,
        4,
        6,
    ]
    chosen = json.loads(
        (rl / "config.resolved.toml").read_text().split("path = ")[1].split("\n")[0]
    )
    # appendix B: the median-F1 SFT checkpoint
    assert Path(chosen) == select_checkpoint(sft, "median")[2] / "hf"
    rows = read_metrics(rl / "metrics.jsonl")
    assert (
        [r["step"] for r in rows] == [0, 1, 2] and "valid/f1" in rows[0] and "valid/f1" in rows[-1]
    )
    assert 'variant = "bilateral"' in (rl / "config.resolved.toml").read_text()
    assert (
        (rl / "curves.png").exists()
        and (rl / "samples" / "step-2.md").exists()
        and (rl / "hf").is_dir()
    )
    assert "| tiny-tgrpo | bilateral | 2 |" in result.stdout and f"results: {rl}/" in result.stdout
    # ... and ends with evaluate.py on the multiple-choice split: 2 items per subdimension
    assert (
        json.loads((rl / "eval-mc" / "results.json").read_text())["results"]["demo"]["count"] == 12
    )
    assert "| run | demo F1 | demo Acc |" in result.stdout
    # ... then `psyrl report`: the page holds the run's samples and its evaluation
    report = (rl / "report.html").read_text(encoding="utf-8")
    assert 'id="samples-0-2"' in report and "eval-mc" in report and "<svg" in report
    # the base reward from an installed-style empty directory, one process: `psyrl demo` writes
    # the demo set there (the checkout's bytes), reuses the finished SFT run, trains beside it
    empty = tmp_path / "empty"
    empty.mkdir()
    args = [str(VENV / "bin" / "psyrl"), "demo", "--out", str(tmp_path), "--reward", "base"]
    args += ["--ranks", "1", "--eval-limit", "1"]
    args += [a for k in SHORT_TGRPO for a in ("--tgrpo-set", k)]
    result = subprocess.run(args, cwd=empty, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "+ python -m psyrl demo-data --out data/demo --seed 0" in result.stdout
    for name in ("train.jsonl", "test.jsonl", "mc.jsonl"):
        assert (empty / "data/demo" / name).read_bytes() == (ROOT / "data/demo" / name).read_bytes()
    assert "reusing the finished SFT run" in result.stdout
    assert "| tiny-tgrpo-base | base | 2 |" in result.stdout
    assert 'variant = "base"' in (tmp_path / "tiny-tgrpo-base" / "config.resolved.toml").read_text()
    # the same command again: every stage is done, nothing is trained or evaluated twice
    before = (rl / "metrics.jsonl").read_text()
    result = make("demo", tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "reusing the finished T-GRPO run" in result.stdout
    assert "reusing the evaluation" in result.stdout and "train-tgrpo" not in result.stdout
    assert (rl / "metrics.jsonl").read_text() == before


def test_self_train_round_recipe():
    # the round's order (a tiny test model keeps nothing at tau 0.4, so the pieces run in
    # tests/test_evaluate.py)
    if shutil.which("make") is None:
        pytest.skip("needs make")
    result = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "-n",
            "self-train",
            "MODEL=m",
            "SELF_OUT=o",
            f"VENV={VENV}",
        ],
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.replace("\\\n", "").splitlines()  # the recipe's continued lines joined
    steps = [
        line
        for line in lines
        if "evaluate.py" in line or "self-label" in line or "train_sft.py" in line
    ]
    assert [
        (
            "--split selftrain" in s,
            "self-label o/label-half" in s,
            "train_sft.py" in s,
            "--split eval" in s,
        )
        for s in steps
    ] == [
        (True, False, False, False),
        (False, True, False, False),
        (False, False, True, False),
        (False, False, False, True),
        (False, False, False, True),
    ]
    assert "--model m " in steps[0] and "--model o/tiny-self-train/hf" in steps[4]
    assert "data.train_file=o/self-labelled.jsonl" in steps[2] and "model.path=m" in steps[2]


def test_demo_skips_finished_stages_and_resumes_an_interrupted_run(tmp_path, monkeypatch):
    from psyrl.core.checkpoints import write_manifest
    from psyrl.recipes import demo as demo_module

    commands = []

    def record(command, capture=False):
        commands.append(command[command.index("psyrl") + 1 :])
        return "runs/tiny-sft/checkpoints/step-200/hf" if capture else ""

    monkeypatch.setattr(demo_module, "run_stage", record)
    demo = demo_module.Demo(out=tmp_path / "runs", data=tmp_path / "data")
    for name in demo_module.DEMO_FILES:  # the demo set is there: kept
        (tmp_path / "data").mkdir(exist_ok=True)
        (tmp_path / "data" / name).write_text("{}\n")
    (tmp_path / "runs/tiny-sft/hf").mkdir(parents=True)  # SFT finished: reused
    (tmp_path / "runs/tiny-sft/hf/config.json").write_text("{}")
    checkpoint = tmp_path / "runs/tiny-tgrpo/checkpoints/step-10"  # T-GRPO interrupted at 10
    (checkpoint / "state").mkdir(parents=True)
    (checkpoint / "state" / "model.pt").write_bytes(b"x")
    write_manifest(checkpoint)
    demo_module.run_demo(demo)
    assert [c[0] for c in commands] == [
        "select-checkpoint",
        "train-tgrpo",
        "summary",
        "plot",
        "evaluate",
        "report",
    ]
    tgrpo = commands[1]
    assert tgrpo[-2:] == ["--resume", "auto"] and tgrpo[tgrpo.index("--config") + 1] == "tgrpo/tiny"
    assert "model.path=runs/tiny-sft/checkpoints/step-200/hf" in tgrpo
    # a checkpoint cut short: the trainer's --resume auto skips it or refuses; never --overwrite
    (checkpoint / "state" / "model.pt").write_bytes(b"xy")
    commands.clear()
    demo_module.run_demo(demo)
    assert commands[1][-2:] == ["--resume", "auto"] and "--overwrite" not in commands[1]
    # --quick: its own run names and shortened stages
    commands.clear()
    demo_module.run_demo(
        demo_module.Demo(out=tmp_path / "runs", data=tmp_path / "data", quick=True)
    )
    assert [c[0] for c in commands][:2] == ["train-sft", "select-checkpoint"]
    assert "run.name=tiny-sft-quick" in commands[0] and "run.steps=30" in commands[0]
    assert commands[-2][-2:] == ["--limit", "2"]


def test_demo_commands_run_psyrl_in_this_interpreter():
    from psyrl.recipes.demo import Demo, psyrl_command

    assert psyrl_command(Demo(), "summary", "r") == [sys.executable, "-m", "psyrl", "summary", "r"]
    torchrun = psyrl_command(Demo(), "train-sft", ranks=2)
    assert torchrun[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert torchrun[-4:] == ["2", "-m", "psyrl", "train-sft"]
