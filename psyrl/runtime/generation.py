"""What the tools that only generate (evaluate.py, `psyrl build`) share: a sampler on a checkpoint's own weights,
and one error message per failure from rank 0."""

from __future__ import annotations

import os
from pathlib import Path
from typing import NoReturn

import click

from psyrl.runtime.distributed import Dist
from psyrl.runtime.model import autocast, load_model, model_config
from psyrl.runtime.sampler import TorchSampler
from psyrl.runtime.vllm_sampler import VLLMSampler


def checkpoint_sampler(model_dir: Path, model_cfg, tokenizer, dist: Dist, batch: int, temperature: float,
                       engine: dict, progress: bool):
    """The sampler interface on a checkpoint's own weights, for tools that only generate (evaluate.py, psyrl build):
    psyrl's torch sampler, or a vLLM engine that reads the checkpoint itself (no weight sync: nothing trains).
    `engine`: engine, tensor_parallel, gpu_memory_utilization."""
    if engine["engine"] == "torch":
        model = load_model(model_cfg, tokenizer, device=dist.device)
        return TorchSampler(model, tokenizer, dist.device, batch, amp=autocast(model_cfg, dist.device))
    architecture = model_config(model_cfg, tokenizer)
    return VLLMSampler(model_dir, tokenizer, dist, dtype=model_cfg.dtype,
                       max_model_len=architecture.max_position_embeddings, batch=batch * engine["tensor_parallel"],
                       tensor_parallel=engine["tensor_parallel"],
                       gpu_memory_utilization=engine["gpu_memory_utilization"], sleep=False, dummy_weights=False,
                       temperature=temperature, progress=progress and dist.is_main)


def fail_once(error: Exception, prog: str, shared: tuple[type, ...]) -> NoReturn:
    """End a tool's run on `error` as one click message from rank 0. Another rank exits quietly when the error is of
    a `shared` type (input and settings errors, every rank's alike) and says it otherwise: it may be its alone."""
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        if not isinstance(error, shared):
            click.echo(f"{prog}: rank {rank}: {error}", err=True)
        raise SystemExit(1) from None
    raise click.ClickException(str(error)) from None
