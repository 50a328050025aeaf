"""A finished run extended on purpose (--extend, run.extend): with a constant learning rate, N
steps extended to N + M end where a run planned for N + M from the start ends: the same weights,
metrics rows, data position and (T-GRPO) trajectory cache. A cosine run extended decays on from its
last rate with no jump (the rule by hand: tests/runtime/test_schedule_extension.py)."""

import json
import math
import subprocess
import sys

import pytest
import torch
from test_restarts import rows_without_timing, weights
from test_train_tgrpo import run_cli

from psyrl.core.runlog import read_metrics

SFT = [
    "run.name=sft",
    'data.valid_file=""',
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.intermediate_size=128",
    "optim.global_batch=8",
    "optim.micro_batch=4",
    'optim.schedule="constant"',
    "optim.warmup_ratio=0.0",
    "checkpoint.every=2",
    "log.progress=false",
]


def sft(out, steps, *args, extra=()):
    sets = [f"run.output_dir={json.dumps(str(out))}", *SFT, f"run.steps={steps}", *extra]
    command = [sys.executable, "train_sft.py", "--config", "configs/sft/tiny.toml"]
    command += [a for s in sets for a in ("--set", s)] + list(args)
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result.stdout


def assert_same_end(planned, extended, last, extension):
    a, b = weights(planned), weights(extended)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # the rows' planned total ("steps") differs by design; every other value is the same
    rows = [
        [{k: v for k, v in r.items() if k != "steps"} for r in rows_without_timing(run)]
        for run in (planned, extended)
    ]
    assert rows[0] == rows[1]
    checkpoint = f"checkpoints/step-{last}"
    trainer = [
        json.loads((run / checkpoint / "trainer.json").read_text()) for run in (planned, extended)
    ]
    assert trainer[1].pop("lr_extensions") == [extension]
    assert trainer[0] == trainer[1]  # the data position included


@pytest.mark.slow
def test_sft_of_4_steps_extended_to_6_equals_6_planned(tmp_path):
    planned, extended = tmp_path / "planned", tmp_path / "extended"
    sft(planned, 6)
    sft(extended, 4)
    said = sft(extended, 6, "--resume", "--extend")
    assert "resuming after step 4" in said
    assert "extended from 4 to 6 steps (--extend): the learning rate stays constant" in said
    assert_same_end(planned / "sft", extended / "sft", 6, [4, 4])


@pytest.mark.slow
def test_tgrpo_of_2_steps_extended_to_3_equals_3_planned_cache_included(start, tmp_path):
    # tgrpo/tiny.toml: constant, no warm-up (A.3)
    planned, extended = tmp_path / "planned", tmp_path / "extended"
    run_cli(start, planned, "run.steps=3", "checkpoint.every=1")
    run_cli(start, extended, "run.steps=2", "checkpoint.every=1")
    said = run_cli(
        start, extended, "run.steps=3", "checkpoint.every=1", "run.extend=true", resume=True
    )
    assert "extended from 2 to 3 steps" in said.stdout
    assert_same_end(planned / "rl", extended / "rl", 3, [2, 2])
    cache = "checkpoints/step-3/trajectory_cache.json"
    assert (planned / "rl" / cache).read_text() == (extended / "rl" / cache).read_text()


@pytest.mark.slow
def test_a_finished_cosine_sft_extended_decays_on_without_a_jump(tmp_path):
    cosine = ('optim.schedule="cosine"',)
    sft(tmp_path, 4, extra=cosine)
    said = sft(tmp_path, 6, "--resume", "--extend", extra=cosine)
    assert "the learning rate decays on from its last rate to 0 at the new end" in said
    lr = [r["train/lr"] for r in read_metrics(tmp_path / "sft" / "metrics.jsonl")]
    # 4 planned steps, no warm-up: 0.5 * (1 + cos(pi * k / 4)) at k = 0..3, last 0.14645; then
    # 0.14645 * 0.5 * (1 + cos(pi * j / 3)) at j = 1, 2: 0.10984, 0.03661 (no jump back up)
    last = 0.5 * (1 + math.cos(3 * math.pi / 4))
    factors = [0.5 * (1 + math.cos(math.pi * k / 4)) for k in range(4)]
    factors += [last * 0.5 * (1 + math.cos(math.pi * j / 3)) for j in (1, 2)]
    assert lr == pytest.approx([1e-3 * f for f in factors], rel=1e-12)  # tiny.toml's lr
