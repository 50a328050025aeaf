"""The demo, start to end, from an installed psyrl or a checkout: `psyrl demo` (and `make demo`).

    psyrl demo [--out runs] [--ranks 2] [--reward bilateral|base] [--quick]

Stages, each the command a user could type (printed before it runs), in the working directory:
  1. the synthetic demo set in data/demo/ (`psyrl demo-data`; kept when its three files exist),
  2. SFT of the tiny model (the `sft/tiny` preset),
  3. appendix B's start: the median-F1 SFT checkpoint (`psyrl select-checkpoint`),
  4. T-GRPO from it with the bilateral (or base) reward (the `tgrpo/tiny` preset),
  5. the T-GRPO run's summary and curves (`psyrl summary`, `psyrl plot`),
  6. the multiple-choice evaluation of its export on data/demo/mc.jsonl,
  7. the HTML report.
A stage whose output is complete is skipped, an interrupted training run resumes from its newest
complete checkpoint, and an interrupted evaluation continues where it stopped: running the same
command again finishes the demo. `--quick` runs the same stages shortened to a few minutes, under
run names ending in `-quick`: a smoke run, its figures say nothing about learning.
"""

from __future__ import annotations

import importlib.util
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from psyrl.core.errors import RunError

DEMO_FILES = ("train.jsonl", "test.jsonl", "mc.jsonl")
# --quick: every stage, shortened; checkpoints every 10 SFT steps give select-checkpoint 3 to choose
QUICK_SFT = ("run.steps=30", "checkpoint.every=10", "data.valid_items=12")
QUICK_TGRPO = ("run.steps=2", "checkpoint.every=2", "rollout.prompts=8", "optim.global_batch=8")
QUICK_TGRPO += ("optim.micro_batch=8", "optim.logprob_micro_batch=8", "data.valid_items=12")
QUICK_EVAL_LIMIT = 2


@dataclass
class Demo:
    """What `psyrl demo` runs: where, on how many ranks, with which reward, how long."""

    out: Path = Path("runs")
    ranks: int = 2
    reward: str = "bilateral"
    quick: bool = False
    data: Path = Path("data/demo")
    sft_sets: tuple[str, ...] = field(default_factory=tuple)
    tgrpo_sets: tuple[str, ...] = field(default_factory=tuple)
    eval_limit: int = 0  # items per subdimension of mc.jsonl; 0: all (--quick: QUICK_EVAL_LIMIT)

    @property
    def suffix(self) -> str:
        return "-quick" if self.quick else ""

    @property
    def sft_name(self) -> str:
        return "tiny-sft" + self.suffix

    @property
    def tgrpo_name(self) -> str:
        base = "tiny-tgrpo" if self.reward == "bilateral" else "tiny-tgrpo-base"
        return base + self.suffix


def psyrl_command(demo: Demo, *args: str, ranks: int = 1) -> list[str]:
    """`psyrl ARGS` in this interpreter; under torchrun (`-m psyrl`) when more than one rank."""
    if ranks == 1:
        return [sys.executable, "-m", "psyrl", *args]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    return [*torchrun, "--nproc_per_node", str(ranks), "-m", "psyrl", *args]


def run_stage(command: list[str], capture: bool = False) -> str:
    """Print the command as a shell line, run it, fail with its exit status named."""
    shown = ["python" if c == sys.executable else c for c in command]
    print("+ " + shlex.join(shown), flush=True)
    start = time.monotonic()
    result = subprocess.run(command, stdout=subprocess.PIPE if capture else None, text=True)
    if result.returncode != 0:
        raise RunError(f"demo: `{shlex.join(shown)}` exited with status {result.returncode}")
    if not capture:
        print(f"demo: {command[command.index('psyrl') + 1]} took {time.monotonic() - start:.0f} s")
    return result.stdout.strip() if capture else ""


def finished(run_dir: Path) -> bool:
    """A training run whose final export is written (`hf/config.json` comes last)."""
    return (run_dir / "hf" / "config.json").is_file()


def train_flags(run_dir: Path) -> list[str]:
    """--resume auto on an interrupted run: continue from its newest checkpoint that passes its
    checks, start over one cut short before its first, refuse one whose checkpoints all fail
    (never deleted here)."""
    return ["--resume", "auto"] if run_dir.is_dir() else []


def sets(values) -> list[str]:
    return [a for v in values for a in ("--set", v)]


def write_demo_data(demo: Demo) -> None:
    """Stage 1: the synthetic set, deterministic (seed 0): the same bytes as the checkout's."""
    if all((demo.data / name).is_file() for name in DEMO_FILES):
        print(f"demo: using the demo set in {demo.data}/ ({', '.join(DEMO_FILES)})")
        return
    run_stage(psyrl_command(demo, "demo-data", "--out", str(demo.data), "--seed", "0"))


def train(demo: Demo, kind: str, name: str, label: str, overrides: list[str]) -> Path:
    """Stages 2 and 4: `psyrl train-KIND --config KIND/tiny` on the demo set as run `name`, unless
    it is finished; an interrupted run resumes."""
    run_dir = demo.out / name
    if finished(run_dir):
        print(f"demo: reusing the finished {label} run {run_dir} (delete it to train it again)")
        return run_dir
    overrides = [
        f"run.output_dir={demo.out}",
        f"run.name={name}",
        *overrides,
        f"data.train_file={demo.data / 'train.jsonl'}",
        f"data.valid_file={demo.data / 'test.jsonl'}",
    ]
    quick, extra = (QUICK_SFT, demo.sft_sets) if kind == "sft" else (QUICK_TGRPO, demo.tgrpo_sets)
    overrides += [*(quick if demo.quick else ()), *extra]
    args = [f"train-{kind}", "--config", f"{kind}/tiny", *sets(overrides), *train_flags(run_dir)]
    run_stage(psyrl_command(demo, *args, ranks=demo.ranks))
    return run_dir


def evaluate_mc(demo: Demo, run_dir: Path) -> Path:
    """Stage 6: multiple choice on data/demo/mc.jsonl; a finished evaluation is kept, an
    interrupted one continues (evaluate resumes by itself without --overwrite)."""
    out = run_dir / "eval-mc"
    if (out / "results.json").is_file():
        print(f"demo: reusing the evaluation in {out}")
        return out
    args = ["evaluate", "--model", str(run_dir / "hf"), "--benchmarks", str(demo.data / "mc.jsonl")]
    args += ["--out", str(out), "--max-new-tokens", "64", "--no-progress"]
    limit = demo.eval_limit or (QUICK_EVAL_LIMIT if demo.quick else 0)
    args += ["--limit", str(limit)] if limit else []
    run_stage(psyrl_command(demo, *args, ranks=demo.ranks))
    return out


def run_demo(demo: Demo) -> Path:
    """Every stage in order; returns the T-GRPO run directory."""
    if demo.reward not in ("bilateral", "base"):
        raise RunError(f"demo: --reward {demo.reward!r}: expected bilateral or base")
    if demo.ranks < 1:
        raise RunError(f"demo: --ranks {demo.ranks}: expected 1 or more")
    if demo.quick:
        print("demo --quick: every stage, shortened: a smoke run, not the demo's figures")
    write_demo_data(demo)
    sft = train(demo, "sft", demo.sft_name, "SFT", [])
    start = run_stage(psyrl_command(demo, "select-checkpoint", str(sft)), capture=True)
    print(f"demo: T-GRPO starts from {start} (appendix B: the median-F1 SFT checkpoint)")
    rl = [f"reward.variant={demo.reward}", f"model.path={start}"]
    run_dir = train(demo, "tgrpo", demo.tgrpo_name, "T-GRPO", rl)
    print()
    run_stage(psyrl_command(demo, "summary", str(run_dir)))
    curves = importlib.util.find_spec("matplotlib") is not None
    if curves:
        run_stage(psyrl_command(demo, "plot", str(run_dir)))
    else:
        print("demo: no matplotlib, so no curves.png (pip install 'psyrl[plot]' draws them)")
    evaluate_mc(demo, run_dir)
    run_stage(psyrl_command(demo, "report", str(run_dir)))
    print(
        f"results: {run_dir}/ (report.html, metrics.jsonl, samples/step-N.md, "
        f"{'curves.png, ' if curves else ''}eval-mc/, hf/); SFT: {sft}/"
    )
    return run_dir
