"""Preemption (run.preempt_signals): a real SIGTERM, sent by a rank to itself at a chosen moment
(during the sampling, an update or a checkpoint write), stops both gloo ranks after the same step
with a checkpoint and exit status 75, and the resumed run ends bit-identical to one never
interrupted."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_evaluate import tiny_model  # noqa: F401
from test_train_tgrpo import TORCHRUN, rows_without_timing, tgrpo_sets

from psyrl.core.config import ConfigError, load_config
from psyrl.core.errors import EXIT_PREEMPTED
from psyrl.runtime.distributed import ONE_PROCESS
from psyrl.runtime.preemption import Preemption

# PSYRL_TEST_PREEMPT = "PHASE:N:RANK": that rank sends itself SIGTERM inside the N-th call (in this
# process) of the phase's function, then lets the call finish.
DRIVER = """
import os, signal, sys
import psyrl.run.directory as run_module
program_name = sys.argv.pop(1)
if program_name == "tgrpo":
    import psyrl.recipes.tgrpo as program
    from psyrl.cli.train import train_tgrpo as command
    update_name = "update"
else:
    import psyrl.recipes.sft as program
    from psyrl.cli.train import train_sft as command
    update_name = "clipped_step"
phase, at, rank = os.environ.get("PSYRL_TEST_PREEMPT", "none:0:0").split(":")
calls = [0]

def signalling(fn):
    def call(*args, **kwargs):
        calls[0] += 1
        if calls[0] == int(at) and int(os.environ.get("RANK", "0")) == int(rank):
            os.kill(os.getpid(), signal.SIGTERM)
        return fn(*args, **kwargs)
    return call

if phase == "sample":
    build_sampler = program.build_sampler
    def build(*args, **kwargs):
        sampler = build_sampler(*args, **kwargs)
        sampler.generate = signalling(sampler.generate)
        return sampler
    program.build_sampler = build
elif phase == "update":
    setattr(program, update_name, signalling(getattr(program, update_name)))
elif phase == "save":
    run_module.save_checkpoint = signalling(run_module.save_checkpoint)
command(prog_name=program_name)
"""


def launch(tmp_path, program, launcher, sets, signal_at, resume):
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    config = "configs/tgrpo/tiny.toml" if program == "tgrpo" else "configs/sft/tiny.toml"
    args = [*launcher, str(driver), program, "--config", config]
    args += [a for s in sets for a in ("--set", s)] + (["--resume"] if resume else [])
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PSYRL_TEST_PREEMPT": signal_at}
    return subprocess.run(args, capture_output=True, text=True, timeout=600, env=env)


def steps_of(run: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]


def same_run(whole: Path, cut: Path, last: int) -> None:
    a, b = (load_file(r / "hf" / "model.safetensors") for r in (whole, cut))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for name in ("trajectory_cache.json", "trainer.json"):
        path = Path("checkpoints") / f"step-{last}" / name
        if (whole / path).exists():
            assert (whole / path).read_text() == (cut / path).read_text(), name
    assert rows_without_timing(whole) == rows_without_timing(cut)


@pytest.mark.slow
def test_sigterm_on_one_rank_stops_both_and_the_resume_is_bitwise_identical(start, tmp_path):
    # 5 steps of 2 updates, checkpoints at 3 and 5: a SIGTERM to rank 1 while step 1 samples, to
    # rank 0 in step 2's second update, to rank 1 while step 3's checkpoint is written; then
    # run.preempt_now with a SIGTERM while step 4 samples (step 3 is already saved)
    extra = ["run.steps=5", "checkpoint.every=3", "checkpoint.keep_state=0"]
    whole = launch(
        tmp_path, "tgrpo", TORCHRUN, tgrpo_sets(start, tmp_path / "a", *extra), "none:0:0", False
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    cut, sets = tmp_path / "b" / "rl", tgrpo_sets(start, tmp_path / "b", *extra)
    plan = [
        ("sample:1:1", [], 1),
        ("update:2:0", [], 2),
        ("save:1:1", [], 3),
        ("sample:1:0", ["run.preempt_now=true"], 3),
    ]
    for i, (signal_at, more, kept) in enumerate(plan):
        result = launch(tmp_path, "tgrpo", TORCHRUN, sets + more, signal_at, resume=i > 0)
        assert result.returncode != 0, result.stdout[-2000:]
        # torchrun reports its workers' own status
        assert f"exitcode: {EXIT_PREEMPTED}" in result.stderr, result.stderr[-3000:]
        said = [line for line in result.stdout.splitlines() if "preempted by SIGTERM" in line]
        assert said == [
            f"tgrpo: preempted by SIGTERM; checkpoint of step {kept} in "
            f"{cut / 'checkpoints' / f'step-{kept}'}; run the same command with "
            "--resume to continue"
        ], result.stdout[-2000:]
        # torchrun's own traceback (ChildFailedError) only: none from psyrl's code
        assert "/psyrl/" not in result.stderr and result.stderr.count("Traceback") == 1
        assert steps_of(cut)[-1] == ({1: 1, 2: 2, 3: 3, 4: 3}[i + 1])
        assert (cut / "checkpoints" / f"step-{kept}" / "trainer.json").is_file()
        assert not (cut / "hf").exists()  # no final export before the last step
    finished = launch(tmp_path, "tgrpo", TORCHRUN, sets, "none:0:0", resume=True)
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert "resuming after step 3" in finished.stdout
    same_run(tmp_path / "a" / "rl", cut, 5)


@pytest.mark.slow
def test_sft_preempted_in_one_process_resumes_bitwise(tmp_path):
    sets = [
        f"run.output_dir={json.dumps(str(tmp_path / 'x'))}",
        "run.steps=4",
        'data.valid_file=""',
        "checkpoint.every=0",
        "log.progress=false",
        "optim.global_batch=8",
        "optim.micro_batch=4",
    ]
    whole = launch(tmp_path, "sft", [sys.executable], sets, "none:0:0", False)
    assert whole.returncode == 0, whole.stderr[-3000:]
    cut_sets = [s.replace(str(tmp_path / "x"), str(tmp_path / "y")) for s in sets]
    # checkpoint.every = 0 saves nothing, but a preemption still keeps its step
    stopped = launch(tmp_path, "sft", [sys.executable], cut_sets, "update:2:0", False)
    assert stopped.returncode == EXIT_PREEMPTED, stopped.stderr[-3000:]
    assert "sft: preempted by SIGTERM; checkpoint of step 2 in" in stopped.stdout
    resumed = launch(tmp_path, "sft", [sys.executable], cut_sets, "none:0:0", True)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    same_run(tmp_path / "x" / "tiny-sft", tmp_path / "y" / "tiny-sft", 4)


def test_a_recorded_signal_is_the_runs_answer_and_the_handlers_come_back():
    import signal

    before = signal.getsignal(signal.SIGUSR1)
    with Preemption(["SIGTERM", "SIGUSR1"]) as preemption:
        assert preemption.requested(ONE_PROCESS) is None
        os.kill(os.getpid(), signal.SIGUSR1)  # would end the process without the handler
        assert preemption.requested(ONE_PROCESS) == "SIGUSR1"
    assert signal.getsignal(signal.SIGUSR1) is before


def test_uncatchable_or_unknown_signals_are_refused():
    with pytest.raises(ConfigError, match="preempt_signals.*'SIGKILL'"):
        load_config(None, ['run.preempt_signals=["SIGKILL"]'])
    assert load_config(None, ["run.preempt_signals=[]"]).run.preempt_signals == []


EVAL_DRIVER = """
import os, signal
from psyrl.runtime import generation
make_sampler = generation.Generation.make_sampler

def signalling_sampler(self):
    sampler, calls = make_sampler(self), [0]
    generate = sampler.generate
    def call(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 2:  # while the second round generates
            os.kill(os.getpid(), signal.SIGTERM)
        return generate(*args, **kwargs)
    sampler.generate = call
    return sampler

generation.Generation.make_sampler = signalling_sampler
from psyrl.cli.evaluate import evaluate
evaluate(prog_name="evaluate.py")
"""


@pytest.mark.slow
def test_evaluate_stops_after_the_round_and_resumes_to_the_same_predictions(tiny_model, tmp_path):  # noqa: F811
    args = [
        "--model",
        str(tiny_model),
        "--benchmarks",
        "data/demo/mc.jsonl",
        "--limit",
        "2",
        "--batch",
        "2",
        "--max-new-tokens",
        "6",
        "--no-progress",
    ]
    whole = subprocess.run(
        [sys.executable, "evaluate.py", *args, "--out", str(tmp_path / "a")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert whole.returncode == 0, whole.stderr[-3000:]
    out = tmp_path / "b"
    stopped = subprocess.run(
        [sys.executable, "-c", EVAL_DRIVER, *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert stopped.returncode == EXIT_PREEMPTED, stopped.stderr[-3000:]
    total = len((tmp_path / "a" / "predictions.jsonl").read_text().splitlines())
    assert (
        f"evaluate: preempted by SIGTERM after 4 of {total} items, all in "
        f"{out / 'predictions.jsonl'}; run the same command to resume"
    ) in stopped.stdout
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 4
    assert not (out / "results.json").exists()
    resumed = subprocess.run(
        [sys.executable, "evaluate.py", *args, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "4 already in" in resumed.stdout
    assert (out / "predictions.jsonl").read_text() == (
        tmp_path / "a" / "predictions.jsonl"
    ).read_text()
