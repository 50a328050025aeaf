"""`psyrl plan --device cpu`'s step-time model against a measured T-GRPO run, phase by phase.

    .venv/bin/python bench/plan_calibration.py                # tiny config, 3 steps, all cores
    .venv/bin/python bench/plan_calibration.py --cores 1 --json  # tests/plan/test_speed.py's run

Measures this machine (`psyrl.plan.devices.measure_cpu`) before and after a run of
configs/tgrpo/tiny.toml (random-init tiny model, no validation, no checkpoint) in this process, and
prints the model's seconds per phase (from the run's own mean response length, the data's prompt
lengths and the mean of the two measurements) beside the median of the run's `time/*` of every step
after the first (the first warms up). `score` (the reward) is not modelled.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# the trainer's time/<name> for each phase of the model
PHASES = {"rollout": "sample", "experience": "logprobs", "update": "update", "sync": "sync"}
OVERRIDES = [
    'model.path=""',
    'data.valid_file=""',
    "checkpoint.every=1000",
    "log.samples_every=0",
    "log.progress=false",
]


def _mean_device(a, b):
    from dataclasses import replace

    fields = ("flops", "memory_bw", "host_link", "peer", "layer_overhead", "call_overhead")
    return replace(a, **{f: (getattr(a, f) + getattr(b, f)) / 2 for f in fields})


def calibrate(config: str, steps: int, extra: list[str]) -> dict:
    """Measure, run, measure; the model's prediction and the run's medians, per phase."""
    sys.path.insert(0, str(ROOT))
    import train_tgrpo
    from psyrl.core.config import load_config
    from psyrl.core.runlog import read_metrics
    from psyrl.plan import devices, speed
    from psyrl.plan.architecture import load_architecture, shapes
    from psyrl.runtime.model import load_tokenizer

    overrides = [*OVERRIDES, f"run.steps={steps}", *extra]
    arch, _ = load_architecture(load_config(config, overrides).model)
    before = devices.measure_cpu(sh=shapes(arch))
    with tempfile.TemporaryDirectory(prefix="psyrl-calibration-") as tmp:
        args = ["--config", config, "--set", f"run.output_dir={json.dumps(tmp)}"]
        for o in overrides:
            args += ["--set", o]
        train_tgrpo.main(args)
        cfg = load_config(config, [*overrides, f"run.output_dir={json.dumps(tmp)}"])
        rows = [r for r in read_metrics(Path(tmp) / cfg.run.name / "metrics.jsonl") if "step" in r]
    after = devices.measure_cpu(sh=shapes(arch))
    dev = _mean_device(before, after)
    timed = [r for r in rows if r["step"] > 1] or rows
    response = statistics.mean(r["response/length"] for r in timed)
    wl = speed.workload(cfg, response, load_tokenizer(cfg.model))
    predicted = speed.step_times(cfg, shapes(arch), 1, dev, wl).step
    measured = {p: statistics.median(r[f"time/{k}"] for r in timed) for p, k in PHASES.items()}
    return {
        "config": config,
        "steps": steps,
        "threads": _threads(),
        "device": dev.assumptions(),
        "devices": [before.assumptions(), after.assumptions()],
        "workload": f"{wl.source}, mean prompt {wl.prompt_mean:.0f} tokens, mean response "
        f"{response:.1f} tokens (the run's)",
        "predicted": {p: predicted[p] for p in PHASES},
        "measured": measured,
        "measured_score": statistics.median(r["time/score"] for r in timed),
        "measured_step": statistics.median(r["time/step"] for r in timed),
    }


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(ROOT / "configs/tgrpo/tiny.toml"))
    parser.add_argument("--steps", type=int, default=3, help="steps to run (the first warms up)")
    parser.add_argument("--cores", type=int, default=0, help="pin to this many cores (0: all)")
    parser.add_argument("--set", dest="extra", action="append", default=[], help="more overrides")
    parser.add_argument("--json", action="store_true", help="print one JSON line")
    parser.add_argument(
        "--check",
        type=float,
        default=0.0,
        help="exit 1 unless predicted/measured lies within [1/R, R] for rollout, experience and "
        "update (run it on an idle machine: a benchmark, not a test)",
    )
    a = parser.parse_args()
    if a.cores and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[-a.cores :])
    result = calibrate(a.config, a.steps, a.extra)
    if a.json:
        print("RESULT " + json.dumps(result), flush=True)
    else:
        report(result)
    outside = (
        [
            p
            for p in ("rollout", "experience", "update")
            if not 1 / a.check <= result["predicted"][p] / result["measured"][p] <= a.check
        ]
        if a.check
        else []
    )
    if outside:
        sys.exit(f"predicted/measured outside [1/{a.check}, {a.check}] for {', '.join(outside)}")


def report(result: dict) -> None:
    print(f"\n{result['config']}, {result['steps']} steps, {result['threads']} thread(s)")
    print(f"device: {result['device']}")
    print(f"workload: {result['workload']}\n")
    print("| phase (trainer's time/*) | predicted | measured (median) | predicted / measured |")
    print("| --- | ---: | ---: | ---: |")
    for p, k in PHASES.items():
        pred, meas = result["predicted"][p], result["measured"][p]
        print(f"| {p} ({k}) | {pred:.3f} s | {meas:.3f} s | {pred / meas:.2f} |")
    print(f"| score (not modelled) | - | {result['measured_score']:.3f} s | - |")
    total = sum(result["predicted"].values())
    print(f"| step | {total:.3f} s | {result['measured_step']:.3f} s | - |")


if __name__ == "__main__":
    main()
