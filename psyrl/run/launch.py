"""Starting a trainer: the config, the process group, the start-up checks, then the loop.

`launch(train, ...)` is what `train_sft.py`, `train_tgrpo.py` and `psyrl train-sft|train-tgrpo`
run, once per torchrun rank: it loads the config, joins the process group, calls the recipe's
`train(cfg, dist, overwrite, resume)` (resume: run.resume) and leaves the group. It raises psyrl's
own errors, which the command line reports once (`psyrl.cli.errors`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Callable
from pathlib import Path

import torch
import transformers

from psyrl.core.config import Config, load_config
from psyrl.core.errors import Preempted, PsyrlError, RunError
from psyrl.runtime.distributed import Dist, cleanup, init_distributed, print0

Train = Callable[[Config, Dist, bool, str], None]


def launch(train: Train, config_path, overrides, overwrite: bool, resume: str | None) -> None:
    """Load the config, join the process group, run `train(cfg, dist, overwrite, run.resume)`,
    leave the group; `resume` (--resume: `on` or `auto`, None when not given) sets run.resume. A
    file error while training (a full disk while logging) becomes a RunError naming the file; on
    Preempted, rank 0 says how to resume before it propagates."""
    # no per-save bars inside psyrl's own progress bar
    transformers.utils.logging.disable_progress_bar()
    cfg = load_config(config_path, overrides)
    if resume is not None:
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, resume=resume))
    if overwrite and cfg.run.resume != "off":
        raise RunError("--overwrite and --resume (run.resume) exclude each other")
    # CPU tensors: gloo beside nccl
    host_shards = cfg.fsdp.offload != "none" or cfg.fsdp.ref_offload
    if cfg.sampler.engine == "vllm":
        from psyrl.runtime.vllm_sampler import check_tensor_parallel, import_vllm

        import_vllm()  # before anything starts: a torch run never imports it
    try:
        dist = init_distributed(cfg.run.device, host_shards, cfg.fsdp.timeout_minutes)
        if cfg.sampler.engine == "vllm":
            tp = cfg.sampler.tensor_parallel
            check_tensor_parallel(tp, dist.world, local_world=dist.local_world)
    except ValueError as e:  # a device or a tensor-parallel size this machine cannot give
        raise RunError(str(e)) from None
    check_restarts(cfg, dist)
    try:
        train(cfg, dist, overwrite, cfg.run.resume)
    # e.g. a full disk while logging: which file, not a traceback (checkpoints are atomic)
    except OSError as e:
        raise RunError(f"file error: {e}") from None
    except Preempted as e:
        print0(str(e), dist)
        cleanup(dist)
        raise
    # on a normal exit only: after an error, NCCL work may be in flight and the process just ends
    cleanup(dist)


def check_restarts(cfg: Config, dist: Dist) -> None:
    """Under torchrun's --max-restarts: warn, on rank 0, about what would stop a restart from
    continuing the run. torchrun's workers share its rendezvous store by default
    (TORCHELASTIC_USE_AGENT_STORE; torch/distributed/elastic/rendezvous/dynamic_rendezvous.py:1144-
    1146) and it keeps the previous attempt's keys: a restarted gloo or NCCL group can read a dead
    worker's address and fail to connect (pytorch/pytorch#135712; seen here with gloo);
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 gives every attempt its own store."""
    if int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0")) == 0:
        return
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        print0(
            "warning: torchrun --max-restarts with its shared rendezvous store: a restart may "
            "fail to reconnect (pytorch/pytorch#135712); set TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 "
            "where torchrun starts",
            dist,
        )
    if cfg.run.resume != "auto":
        print0(
            "warning: torchrun --max-restarts without --resume auto (run.resume): a restart "
            "may find this run's directory and stop instead of continuing it",
            dist,
        )


PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:  # not Linux, or no cgroup file system
        return ""


def job_memory_limit(proc_cgroup: str, root: Path) -> int | None:
    """The memory limit of the cgroup this process runs in, in bytes: the smallest over the cgroup
    and its ancestors (a job's limit is set on the job's cgroup, its tasks run in children), or
    None when none is set. `proc_cgroup`: the text of /proc/self/cgroup; `root`: where cgroups are
    mounted (/sys/fs/cgroup). cgroup v2 (line "0::/path"): <root>/path/memory.max, "max" = none;
    v1 (a line "N:...memory...:/path"): <root>/memory/path/memory.limit_in_bytes, where no limit
    reads as about 2^63. A folder that is not there is skipped: inside a cgroup namespace or a
    container the process's path may name folders above the mount's root."""
    files = []
    for line in proc_cgroup.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "":
            files.append((root, path, "memory.max"))
        elif "memory" in controllers.split(","):
            files.append((root / "memory", path, "memory.limit_in_bytes"))
    limits = []
    for base, path, name in files:
        folder = base / path.strip("/")
        for directory in [folder, *folder.parents]:
            text = _read(directory / name).strip()
            if text.isdigit():
                limits.append(int(text))
            if directory == base:
                break
    return min(limits, default=None)


def check_memory_plan(cfg: Config, dist: Dist, trainer: str) -> None:
    """On CUDA: print `psyrl plan`'s verdict for this config on these GPUs (their memory read from
    the device, the node's RAM from the OS and the job's cgroup limit, the smaller; several nodes:
    planned per node, world / local world of them), and refuse a config it predicts will not fit,
    unless run.memory_check is false."""
    if dist.device.type != "cuda":
        return
    # lazy: the planner is tooling (2,300 lines), and importing a trainer loads none of it
    from psyrl.plan import planner
    from psyrl.plan.architecture import load_architecture

    try:
        architecture, _ = load_architecture(cfg.model)
        gpu_gib = torch.cuda.get_device_properties(dist.device).total_memory / 2**30
        # this node's RAM, judged against the plan's per node (the first's, the largest): the
        # physical RAM, or the job's cgroup limit (SLURM's --mem) when smaller
        physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        limit = job_memory_limit(_read(PROC_CGROUP), CGROUP_ROOT)
        host_gib = min(physical, limit or physical) / 2**30
        if limit is not None and limit < physical:
            print0(
                f"memory plan: this job may use {limit / 2**30:.1f} GiB of the node's "
                f"{physical / 2**30:.1f} GiB of RAM (its cgroup's memory limit)",
                dist,
            )
        nodes = dist.world // dist.local_world
        memory = planner.plan(
            cfg, architecture, dist.world, gpu_gib, host_gib, trainer, nodes=nodes
        )
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
