"""Starting a trainer: the config, the process group, the start-up checks, then the loop.

`launch(train, ...)` is what `train_sft.py`, `train_tgrpo.py` and `psyrl train-sft|train-tgrpo`
run, once per torchrun rank: it loads the config, joins the process group, calls the recipe's
`train(cfg, dist, overwrite, resume)` and leaves the group. It raises psyrl's own errors, which the
command line reports once (`psyrl.cli.errors`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable

import torch
import transformers

from psyrl.core.config import Config, load_config
from psyrl.core.errors import Preempted, PsyrlError, RunError
from psyrl.plan.architecture import load_architecture
from psyrl.plan.planner import plan
from psyrl.runtime.distributed import Dist, cleanup, init_distributed, print0
from psyrl.runtime.vllm_sampler import check_tensor_parallel, import_vllm  # imports no vLLM

Train = Callable[[Config, Dist, bool, bool], None]


def launch(train: Train, config_path, overrides, overwrite: bool, resume: bool) -> None:
    """Load the config, join the process group, run `train(cfg, dist, overwrite, resume)`, leave
    the group. A file error while training (a full disk while logging) becomes a RunError naming
    the file; on Preempted, rank 0 says how to resume before it propagates."""
    # no per-save bars inside psyrl's own progress bar
    transformers.utils.logging.disable_progress_bar()
    if overwrite and resume:
        raise RunError("--overwrite and --resume exclude each other")
    cfg = load_config(config_path, overrides)
    # CPU tensors: gloo beside nccl
    host_shards = cfg.fsdp.offload != "none" or cfg.fsdp.ref_offload
    if cfg.sampler.engine == "vllm":
        import_vllm()  # before anything starts: a torch run never imports it
    try:
        dist = init_distributed(cfg.run.device, host_shards, cfg.fsdp.timeout_minutes)
        if cfg.sampler.engine == "vllm":
            check_tensor_parallel(cfg.sampler.tensor_parallel, dist.world)
    except ValueError as e:  # a device or a tensor-parallel size this machine cannot give
        raise RunError(str(e)) from None
    try:
        train(cfg, dist, overwrite, resume)
    # e.g. a full disk while logging: which file, not a traceback (checkpoints are atomic)
    except OSError as e:
        raise RunError(f"file error: {e}") from None
    except Preempted as e:
        print0(str(e), dist)
        cleanup(dist)
        raise
    # on a normal exit only: after an error, NCCL work may be in flight and the process just ends
    cleanup(dist)


def check_memory_plan(cfg: Config, dist: Dist, trainer: str) -> None:
    """On CUDA: print `psyrl plan`'s verdict for this config on these GPUs (their memory read from
    the device, the node's RAM from the OS), and refuse a config it predicts will not fit, unless
    run.memory_check is false."""
    if dist.device.type != "cuda":
        return
    try:
        architecture, _ = load_architecture(cfg.model)
        gpu_gib = torch.cuda.get_device_properties(dist.device).total_memory / 2**30
        # the host figures are per node, with every rank on it
        one_node = dist.world == dist.local_world
        host_gib = (
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if one_node else None
        )
        memory = plan(cfg, architecture, dist.world, gpu_gib, host_gib, trainer)
    except ValueError as e:  # e.g. an architecture the planner does not model
        print0(f"memory plan: not available ({e})", dist)
        return
    whole = "" if memory.fits else " (`psyrl plan --config ...` prints the whole table)"
    print0(memory.verdict() + whole, dist)
    # host RAM rests on a per-rank assumption: a warning only
    if not memory.gpus_fit and cfg.run.memory_check:
        raise RunError(f"{memory.verdict()}; set run.memory_check = false to start anyway")


@contextlib.contextmanager
def setup_errors():
    """Around a trainer's set-up (data, tokenizer, models, reward plug-in): a file, checkpoint or
    value the config names that cannot be used ends the run as one message, not a traceback."""
    try:
        yield
    except PsyrlError:
        raise
    except (OSError, ValueError, RuntimeError) as e:
        raise RunError(str(e)) from None
