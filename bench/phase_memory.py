"""Step time and peak GPU memory per phase of `train_tgrpo.py`, packed and padded, next to `psyrl
plan`'s prediction (memory, and seconds on the matching device table) for the same config on the
same GPUs: the check that puts the memory and time models against a GPU (issue 29's GPU script).
Run it on a GPU node:

    python bench/phase_memory.py [--gpus N] [--modes phase,always] [--packing both] [--predict h200]
                                 [--engine vllm]

The model is a random Qwen2 shaped like Qwen2.5-0.5B-Instruct (896 wide, 24 layers, 14 heads, 2 KV
heads, MLP 4864, tied head) with the shipped Qwen2.5 tokenizer: nothing is downloaded. Each mode
runs 2 T-GRPO steps in bf16 with the torch engine (what needs no vLLM; `--engine vllm` for the
colocated engine) on the demo set, then the table compares `metrics.jsonl`'s
`perf/trainer_alloc_peak_gib/<phase>` (the trainer's CUDA allocator, reset at each phase, vLLM's
pool excluded) and `perf/device_used_gib/<phase>` (the device's memory in use) and `time/<phase>`
with the plan's phase totals; with vLLM also the device's memory in use inside the sample and sync
phases, which their ends miss (`perf/device_used_gib/sample_before_sleep`, `.../sync_before_free`:
psyrl/runtime/vllm_sampler.py `memory_row`). `fsdp.offload = "always"` needs 2 GPUs or more (one
process keeps the model in place); on 1 GPU the modes compared are `phase` and `none`. After the
runs it names the attention kernel the update's packed (and padded) micro-batches took, measured
on this device in the runs' dtypes (bench/attention_kernel.py).
`--device cpu --small` runs the same plumbing on a CPU (no memory figures).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attention_kernel import attention_kernel  # noqa: E402  (bench/, the script's directory)

from psyrl.core.config import load_config  # noqa: E402
from psyrl.core.runlog import read_metrics  # noqa: E402
from psyrl.plan import devices, speed  # noqa: E402
from psyrl.plan.architecture import load_architecture, shapes  # noqa: E402
from psyrl.plan.phases import GIB  # noqa: E402
from psyrl.plan.planner import plan  # noqa: E402
from psyrl.runtime.model import load_tokenizer  # noqa: E402

SHAPE_05B = [
    "model.tokenizer=qwen2.5",
    "model.hidden_size=896",
    "model.num_layers=24",
    "model.num_heads=14",
    "model.num_kv_heads=2",
    "model.intermediate_size=4864",
    "model.max_position_embeddings=4096",
]
SMALL = [
    "model.tokenizer=qwen2.5",
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=128",
]
# psyrl plan's phase -> the trainer's time/ key
PHASES = {"rollout": "sample", "experience": "logprobs", "update": "update", "sync": "sync"}
# the vLLM sampler's readings inside a phase (its memory_row), beside that phase's plan row
INSIDE = {"rollout": "sample_before_sleep", "sync": "sync_before_free"}


def settings(
    mode: str,
    out: Path,
    device: str,
    shape: list[str],
    tokens: int,
    packing: bool,
    engine: str = "torch",
    memory: float = 0.5,
) -> list[str]:
    vllm = [f"sampler.gpu_memory_utilization={memory}", "sampler.max_num_seqs=80"]
    return [
        *shape,
        "model.path=",
        f"model.packing={str(packing).lower()}",
        "model.dtype=" + ("bfloat16" if device == "cuda" else "float32"),
        "model.gradient_checkpointing=true",
        f"fsdp.offload={mode}",
        f"sampler.engine={engine}",
        *(vllm if engine == "vllm" else []),
        "sampler.batch=40",
        "run.steps=2",
        "rollout.prompts=16",
        "rollout.samples=5",
        "optim.global_batch=8",
        f"rollout.max_new_tokens={tokens}",
        "rollout.max_prompt_tokens=448",
        "optim.micro_batch=4",
        "optim.logprob_micro_batch=16",
        "advantage.scope=cache",
        "rollout.temperature=1.0",
        'data.valid_file=""',
        "checkpoint.every=0",
        "log.progress=false",
        "log.samples_every=0",
        "run.memory_check=false",
        f"run.device={device}",
        f"run.output_dir={json.dumps(str(out))}",
        f"run.name={mode}-{'packed' if packing else 'padded'}",
    ]


def device_table(name: str) -> str:
    """psyrl plan's device for this GPU's name (H200 -> h200, ...), else a6000."""
    lowered = name.lower().replace(" ", "")
    for key in ("h200", "h100", "a6000", "l20"):
        if key in lowered:
            return key
    if "a100" in lowered:
        return "a100-80" if "80" in lowered else "a100-40"
    return "a6000"


@click.command()
@click.option(
    "--gpus", type=int, default=None, help="Ranks (default: every visible GPU; 1 on a CPU)."
)
@click.option(
    "--modes",
    default=None,
    help="Comma-separated fsdp.offload modes (default phase,always; 1 GPU: phase,none).",
)
@click.option(
    "--out", default="runs/phase-memory", show_default=True, type=click.Path(file_okay=False)
)
@click.option("--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True)
@click.option(
    "--small", is_flag=True, help="A 2-layer 64-wide model (plumbing check, e.g. on a CPU)."
)
@click.option("--tokens", default=256, show_default=True, help="Response tokens per sample.")
@click.option(
    "--packing",
    type=click.Choice(["both", "on", "off"]),
    default="both",
    show_default=True,
    help="model.packing of each run: both runs every mode packed, then padded.",
)
@click.option(
    "--predict",
    type=click.Choice(devices.DEVICE_NAMES),
    default=None,
    help="psyrl plan's device table for the predicted seconds (default: from the GPU's name; cpu "
    "measures this machine).",
)
@click.option(
    "--engine",
    type=click.Choice(["torch", "vllm"]),
    default="torch",
    show_default=True,
    help="sampler.engine: vllm (pip install -e '.[vllm]') also logs the device memory in use "
    "inside the sample and sync phases.",
)
@click.option(
    "--memory",
    default=0.5,
    show_default=True,
    help="sampler.gpu_memory_utilization with --engine vllm.",
)
def main(gpus, modes, out, device, small, tokens, packing, predict, engine, memory):
    """Step time and peak memory per phase of 2 T-GRPO steps per offload mode, packed and padded,
    against psyrl plan's memory and predicted seconds."""
    gpus = gpus or (torch.cuda.device_count() if device == "cuda" else 1)
    modes = (modes or ("phase,always" if gpus > 1 else "phase,none")).split(",")
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / GIB if device == "cuda" else 48.0
    shape = SMALL if small else SHAPE_05B
    launcher = [sys.executable]
    if gpus > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(gpus)]
    lines = [
        f"psyrl phase memory: {gpus} x {device} ({gpu_gib:.1f} GiB each), torch "
        f"{torch.__version__}, {'small' if small else '0.5B-shaped'} random Qwen2, {tokens} new "
        f"tokens, {engine} engine"
    ]
    if predict is None:
        predict = device_table(torch.cuda.get_device_name(0)) if device == "cuda" else "cpu"
    kernels = {}  # packing -> the model config whose attention kernel is probed after the runs
    runs = [
        (m, p)
        for m in modes
        for p in {"both": (True, False), "on": (True,), "off": (False,)}[packing]
    ]
    for mode, packed in runs:
        sets = settings(mode, Path(out), device, shape, tokens, packed, engine, memory)
        kernels.setdefault(packed, load_config(ROOT / "configs/tgrpo/tiny.toml", sets).model)
        args = [
            *launcher,
            str(ROOT / "train_tgrpo.py"),
            "--config",
            str(ROOT / "configs/tgrpo/tiny.toml"),
            "--overwrite",
            *[a for s in sets for a in ("--set", s)],
        ]
        result = subprocess.run(args, cwd=ROOT, capture_output=True, text=True)
        name = sets[-1].split("=", 1)[1]
        if result.returncode:
            lines.append(f"{name}: failed (exit {result.returncode}): {result.stderr[-2000:]}")
            continue
        cfg = load_config(ROOT / "configs/tgrpo/tiny.toml", sets)
        architecture, _ = load_architecture(cfg.model)
        predicted = {p.name: p.total / GIB for p in plan(cfg, architecture, gpus, gpu_gib).phases}
        sh = shapes(architecture)
        row = read_metrics(Path(out) / name / "metrics.jsonl")[-1]  # step 2: caches warm
        # the workload the run saw: the demo's prompts, its mean response length
        wl = speed.workload(cfg, row["response/length"], load_tokenizer(cfg.model))
        seconds = speed.step_times(cfg, sh, gpus, devices.device(predict, sh), wl).step
        lines.append(
            f"fsdp.offload = {mode}, {'packed' if packed else 'padded'}: step "
            f"{row['time/step']:.2f} s, offload moves {row.get('time/offload', 0):.2f} s "
            f"(predicted {seconds['offload']:.2f} s on {predict}), padding "
            f"{row['actor/padding_fraction']:.1%} of the update's padded micro-batches"
        )
        for phase, lap in PHASES.items():
            peak = row.get(f"perf/trainer_alloc_peak_gib/{lap}")
            used = row.get(f"perf/device_used_gib/{lap}")
            lines.append(
                f"  {phase:<10} {row[f'time/{lap}']:7.2f} s   trainer peak "
                f"{'n/a' if peak is None else f'{peak:6.2f} GiB'}   device in use "
                f"{'n/a' if used is None else f'{used:6.2f} GiB'}   plan "
                f"{predicted[phase]:6.2f} GiB, {seconds[phase]:7.2f} s"
            )
            if phase in INSIDE:
                lines.append(f"  {'':<10} {inside(row, INSIDE[phase], engine)}")
    # after the runs: the probe's CUDA memory must not count in their device readings
    for packed, model in kernels.items():
        kernel = attention_kernel(model, torch.device(device), sharded=gpus > 1)
        lines.append(
            f"attention kernel of the update's {'packed' if packed else 'padded'} micro-batches "
            f"on {device}: {kernel}"
        )
    print("\n".join(lines))


def inside(row: dict, moment: str, engine: str) -> str:
    """The vLLM sampler's reading inside a phase, or why there is none."""
    key = f"perf/device_used_gib/{moment}"
    if key in row:
        return f"inside the phase: device in use {row[key]:6.2f} GiB ({key})"
    if engine == "torch":
        return (
            "inside the phase: n/a (the torch engine frees nothing there: its end reading holds it)"
        )
    return f"inside the phase: n/a ({key} is read on CUDA only)"


if __name__ == "__main__":
    main()
