"""`make demo` and `make demo-base` in a shortened form: the Makefile's own recipe (SFT, then T-GRPO
from the median-F1 checkpoint on 2 torchrun ranks, then `psyrl summary` and `psyrl plot`), with a
few steps of each."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from psyrl.core.checkpoints import select_checkpoint
from psyrl.core.runlog import read_metrics

VENV = Path(sys.executable).parent.parent
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
    sets = lambda keys: " ".join(f"--set {k}" for k in keys)
    args = [
        "make",
        "--no-print-directory",
        target,
        f"VENV={VENV}",
        f"DEMO_OUT={out}",
        f"DEMO_SFT_SET={sets(SHORT_SFT)}",
        f"DEMO_TGRPO_SET={sets(SHORT_TGRPO)}",
        "DEMO_EVAL_SET=--limit 2 --max-new-tokens 8",
    ]
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
    # demo-base reuses the finished SFT run and trains the base reward beside it
    result = make("demo-base", tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "reusing the finished SFT run" in result.stdout
    assert "| tiny-tgrpo-base | base | 2 |" in result.stdout
    assert 'variant = "base"' in (tmp_path / "tiny-tgrpo-base" / "config.resolved.toml").read_text()


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
