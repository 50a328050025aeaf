"""Processes, device mesh, FSDP2 sharding and the gathers of sharded state (SPEC §1: torchrun, FSDP2
with CPU offload, mixed precision): the bucketed weight gather for the sampler and the rank-0 gather
for exports. A.3's phase offload, which moves the shards to the host and back, is
psyrl/runtime/offload.py.

Under `torchrun` every rank runs the same entry script; without it (no WORLD_SIZE, or WORLD_SIZE =
1) psyrl runs in one process on a plain model, and every helper here degrades to a no-op or the
identity. The `Dist` value returned by `init_distributed` is passed around explicitly: no
module-level state.
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import math
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as tdist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import (
    CPUOffloadPolicy,
    MixedPrecisionPolicy,
    OffloadPolicy,
    fully_shard,
)
from torch.distributed.tensor import DTensor
from tqdm import tqdm

from psyrl.runtime.model import load_weights
from psyrl.runtime.offload import HostBlock

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


@dataclass(frozen=True)
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    local_world: int = 1
    device: torch.device = torch.device("cpu")
    mesh: DeviceMesh | None = None
    """1-D mesh named "fsdp" over all ranks; None in one process."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def sharded(self) -> bool:
        return self.mesh is not None


ONE_PROCESS = Dist()  # what init_distributed returns without torchrun (on the CPU)


def _device(choice: str, local_rank: int) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ValueError("run.device = 'cuda' but no CUDA device is available")
    if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()):
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def backend(device: torch.device, host_shards: bool) -> str:
    """gloo on CPU; nccl on GPU; both when some shards live on the host (any offload, the reference
    model's included): the broadcast of rank 0's weights and the float32 gather of an export then
    run on CPU tensors."""
    if device.type != "cuda":
        return "gloo"
    return "cuda:nccl,cpu:gloo" if host_shards else "nccl"


def set_threads(local_world: int) -> None:
    """Split this machine's cores between its ranks (torchrun's default OMP_NUM_THREADS=1 leaves
    cores idle, and the CPU-offloaded optimiser step runs on them)."""
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    torch.set_num_threads(max(1, cores // local_world))


def init_distributed(
    device_choice: str = "auto", host_shards: bool = False, timeout_minutes: float = 60.0
) -> Dist:
    """Join the torchrun process group (when WORLD_SIZE > 1) and build the explicit device mesh: the
    default mesh can pick CUDA on a GPU machine and then fail with gloo."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    device = _device(device_choice, local_rank)
    set_threads(local_world)
    if world == 1:
        return Dist(device=device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    tdist.init_process_group(
        backend(device, host_shards),
        timeout=datetime.timedelta(minutes=timeout_minutes),
        device_id=device if device.type == "cuda" else None,
    )
    mesh = init_device_mesh(device.type, (world,), mesh_dim_names=("fsdp",))
    return Dist(rank, world, local_rank, local_world, device, mesh)


def resolve_dtype(choice: str, device: torch.device) -> str:
    """A generating tool's `--dtype auto`: bfloat16 on CUDA (float32 would double the weights'
    memory and halve the speed of a GPU), float32 on a CPU (where this project measured bf16
    autocast 20x slower)."""
    if choice != "auto":
        return choice
    return "bfloat16" if device.type == "cuda" else "float32"


def gloo_threads() -> int:
    """How many of gloo's worker and I/O threads this process runs (read from /proc: 0 where there
    is none)."""
    count = 0
    for comm in Path("/proc/self/task").glob("*/comm"):
        with contextlib.suppress(OSError):  # a thread that ended while being listed
            count += comm.read_text().startswith(("pt_gloo", "gloo"))
    return count


def cleanup(dist: Dist) -> None:
    """Leave the process group and end gloo's threads before the interpreter exits; call it once the
    models and optimiser are released.

    Why the threads must end: a gloo worker releases a finished collective's tensors after `wait()`
    has returned; when that release needs the GIL while Python 3.11 is finalizing, the thread is
    ended by pthread_exit, whose unwinding through a noexcept destructor calls std::terminate
    ("terminate called without an active exception", exit -6; bench/teardown_aborts.py counts it).
    destroy_process_group() does not stop them while a DeviceMesh still holds the group (torch 2.13
    distributed/device_mesh.py:303-330, `_pg_registry`), so the mesh lets go of it too, and the
    collection then destroys the group, whose destructor joins its threads."""
    if not (dist.sharded and tdist.is_initialized()):
        return
    tdist.destroy_process_group()
    if dist.mesh is not None:
        dist.mesh._pg_registry.clear()
    gc.collect()
    left = gloo_threads()
    if left:
        print(
            f"rank {dist.rank}: warning: {left} gloo thread(s) still run after the process group "
            "was destroyed (something still holds it); the exit may abort",
            file=sys.stderr,
            flush=True,
        )


def print0(line: str, dist: Dist) -> None:
    """One console line, on rank 0 only, that does not break a tqdm bar; flushed (logs are read
    while a run goes)."""
    if dist.is_main:
        tqdm.write(line, file=sys.stdout)
        sys.stdout.flush()


def shard(
    policy: nn.Module,
    dist: Dist,
    dtype: str = "float32",
    offload: bool = False,
    reshard_after_forward: bool = True,
    pin: bool = True,
) -> nn.Module:
    """FSDP2: `fully_shard` each decoder layer, then the root (embedding, final norm, LM head). bf16
    keeps float32 master weights and reduces gradients in float32. CPU offload pins memory only when
    a GPU exists (pinning without one raises) and `pin` (False: the caller pins the shards itself,
    `load_sharded(host_block=True)`)."""
    mp = MixedPrecisionPolicy()
    if dtype != "float32":
        mp = MixedPrecisionPolicy(param_dtype=DTYPES[dtype], reduce_dtype=torch.float32)
    pinned = pin and torch.cuda.is_available()
    off = CPUOffloadPolicy(pin_memory=pinned) if offload else OffloadPolicy()
    kwargs = {
        "mesh": dist.mesh,
        "mp_policy": mp,
        "offload_policy": off,
        "reshard_after_forward": reshard_after_forward,
    }
    units = [*policy.lm.get_decoder().layers, policy]
    for unit in units:
        fully_shard(unit, **kwargs)
    # each rank's loss is already divided by the global normaliser: sum gradients, not average
    for unit in units:
        unit.set_gradient_divide_factor(1.0)
        unit.set_force_sum_reduction_for_comms(True)  # a plain SUM: gloo has no PREMUL_SUM
    return policy


def cast_parameters(model: nn.Module, dtype: str) -> None:
    """Parameters to `dtype` in place; buffers untouched: rotary inv_freq must stay float32 (bf16
    shifts long positions)."""
    for param in model.parameters():
        param.data = param.data.to(DTYPES[dtype])


def load_sharded(
    build: Callable[[bool], nn.Module],
    dist: Dist,
    dtype: str = "float32",
    offload: bool = False,
    reshard_after_forward: bool = True,
    storage_dtype: str = "float32",
    host_block: bool = False,
) -> nn.Module:
    """A sharded `Policy` whose weights are read on rank 0 only and broadcast: `build(empty)`
    returns the Policy, with real weights when empty is False (rank 0) or on the meta device (other
    ranks). `storage_dtype`: the dtype the shards are kept in (float32 master weights for a policy
    that trains; the compute dtype for a frozen reference, as verl and EasyR1 load theirs).

    `host_block` (a frozen model under `offload`): its CPU shards in one exact-size `HostBlock`,
    page-locked on CUDA, kept as `policy.host_block`. FSDP2's own pinning copies each shard with
    `Tensor.pin_memory()` (torch 2.13 distributed/fsdp/_fully_shard/_fsdp_param.py:312-315), each
    block rounded up to a power of two by the pinned allocator (see offload.py `host_buffer`); here
    FSDP2 is told not to pin, and its all-gather copies each shard to the device from the block
    (`.to(device, non_blocking=True)`, _fsdp_param.py:897-900). Not for a model that trains:
    FSDP2 would then stage its gradients in pageable memory."""
    error = None
    try:
        policy = build(not dist.is_main)
    # e.g. unreadable weights on rank 0: stop every rank, not only rank 0
    except (OSError, ValueError) as e:
        error = e
    if not agree(error is None, dist):
        raise error or RuntimeError(
            f"rank {dist.rank}: rank 0 could not load the model (see its error)"
        )
    cast_parameters(policy, storage_dtype)
    full = {k: v.detach().cpu() for k, v in policy.state_dict().items()} if dist.is_main else {}
    buffers = (
        {name: b.detach().clone() for name, b in policy.named_buffers()} if dist.is_main else {}
    )
    shard(policy, dist, dtype, offload, reshard_after_forward, pin=not host_block)
    if not dist.is_main:
        policy.to_empty(device="cpu" if offload else dist.device)
    set_model_state_dict(
        policy, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    )
    _broadcast_buffers(policy, buffers, dist)
    if offload and host_block:
        # the block outlives the model's use of it: it is unregistered when it is collected
        policy.host_block = HostBlock(policy, None, pin=dist.device.type == "cuda")
        policy.host_block.move(torch.device("cpu"), to_host=True)
    return policy


def _broadcast_buffers(
    model: nn.Module, rank0_buffers: dict[str, torch.Tensor], dist: Dist
) -> None:
    """Rank 0's buffers to every rank. Non-persistent buffers such as rotary `inv_freq` are not in
    the state dict, and `to_empty` left them uninitialised (measured: logits off by 0.006 when
    skipped)."""
    for name, buf in list(model.named_buffers()):
        owner, _, attr = name.rpartition(".")
        module = model.get_submodule(owner)
        value = (
            rank0_buffers[name].to(dist.device)
            if dist.is_main
            else torch.empty_like(buf, device=dist.device)
        )
        tdist.broadcast(value, src=0)
        setattr(module, attr, value)


def _unique_state(model: nn.Module, prefix: str) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) of the state dict; tied parameters once, under their first name; `prefix`
    stripped."""
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) not in seen:
            seen.add(id(tensor))
            yield name.removeprefix(prefix), tensor


def gather_full_state_dict(
    model: nn.Module, device: str | torch.device = "cpu", prefix: str = ""
) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) one at a time, on every rank, in the parameters' own dtype: each sharded
    parameter is all-gathered when its turn comes, so at most one full tensor exists beyond the
    shards. Tied parameters appear once, under their first name; `prefix` is stripped from names
    (e.g. "lm." for a Policy). Collective: every rank must iterate to the end. In one process: the
    model's own tensors, detached."""
    for name, tensor in _unique_state(model, prefix):
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        yield name, full.detach().to(device)


def gather_to_rank0(
    model: nn.Module, prefix: str = ""
) -> Iterator[tuple[str, torch.Tensor | None]]:
    """(name, full float32-or-own-dtype tensor on the CPU) on rank 0, (name, None) on the others:
    what an export needs, where only the rank that writes should hold the whole model (an all-gather
    would give it to every rank). Each shard goes to rank 0 by `gather`, on the CPU when the shards
    live there (gloo), else on the device. Collective: every rank must iterate to the end."""
    for name, tensor in _unique_state(model, prefix):
        if not isinstance(tensor, DTensor):
            yield name, tensor.detach().cpu()
            continue
        local, world = tensor.to_local().detach(), tensor.device_mesh.size()
        # FSDP2 shards dim 0 in chunks of ceil(rows / world)
        rows = math.ceil(tensor.shape[0] / world)
        padded = local.new_zeros((rows, *tensor.shape[1:]))
        padded[: local.shape[0]].copy_(local)
        parts = [torch.empty_like(padded) for _ in range(world)] if tdist.get_rank() == 0 else None
        tdist.gather(padded, parts, dst=0)
        # each part to the host before the concatenation: one full tensor on the GPU at most, not
        # two
        yield (
            name,
            torch.cat([p.cpu() for p in parts])[: tensor.shape[0]] if parts is not None else None,
        )


def sync_buckets(
    model: nn.Module, device: torch.device, dtype: torch.dtype, bucket_bytes: int, prefix: str = ""
) -> Iterator[tuple[str, torch.Tensor]]:
    """The weight sync's stream: (name, full tensor in `dtype` on `device`), every rank, in
    state-dict order. Parameters are grouped into buckets of about `bucket_bytes` of full tensors;
    for each bucket every rank moves its local shards to `device` (non-blocking from pinned memory),
    casts them to `dtype` there, packs them into one flat buffer, and one all-gather (NCCL on GPUs)
    assembles the bucket, whose tensors are yielded before the next bucket is gathered.
    Cast-then-gather equals gather-then-cast bit for bit (a cast is elementwise), so the sampler
    receives what the one-at-a-time float32 gather followed by a cast gave. Collective."""
    bucket: list[tuple[str, DTensor]] = []
    size = 0
    for name, tensor in _unique_state(model, prefix):
        # one process, or a tensor every rank holds whole: nothing to gather
        if not isinstance(tensor, DTensor):
            yield name, tensor.detach().to(device=device, dtype=dtype)
            continue
        bucket.append((name, tensor))
        size += tensor.numel() * dtype.itemsize
        if size >= bucket_bytes:
            yield from _gather_bucket(bucket, device, dtype)
            bucket, size = [], 0
    if bucket:
        yield from _gather_bucket(bucket, device, dtype)


def _gather_bucket(bucket, device, dtype) -> Iterator[tuple[str, torch.Tensor]]:
    """One all-gather of a bucket's shards (each padded to FSDP2's ceil(rows / world) rows),
    unpacked per tensor."""
    world = bucket[0][1].device_mesh.size()
    # (name, tensor, elements of one rank's padded shard, offset in the flat buffer)
    layout, offset = [], 0
    for name, tensor in bucket:
        rest = math.prod(tensor.shape[1:])
        per_rank = math.ceil(tensor.shape[0] / world) * rest
        layout.append((name, tensor, per_rank, offset))
        offset += per_rank
    flat = torch.zeros(offset, dtype=dtype, device=device)  # this rank's share, padding included
    for _, tensor, _, start in layout:
        local = tensor.to_local().detach()
        # the cast happens on the device
        flat[start : start + local.numel()].copy_(local.reshape(-1).to(device, non_blocking=True))
    gathered = torch.empty(world * offset, dtype=dtype, device=device)  # [world, offset]
    tdist.all_gather_single(gathered, flat)
    gathered = gathered.view(world, offset)
    for name, tensor, per_rank, start in layout:
        # [world * padded rows, ...]
        rows = gathered[:, start : start + per_rank].reshape(-1, *tensor.shape[1:])
        yield name, rows[: tensor.shape[0]].contiguous()


def unsharded_copy(
    policy: nn.Module, empty_lm: nn.Module, dist: Dist, dtype: str = "float32"
) -> nn.Module:
    """A full, unsharded copy of `policy.lm` on this rank (what a colocated sampler holds):
    `empty_lm` is the same architecture on the meta device, filled one tensor at a time from the
    shards. Collective."""
    lm = empty_lm.to_empty(device=dist.device)
    # to_empty made new Parameters: a tied LM head would otherwise stay uninitialised memory
    lm.tie_weights()
    cast_parameters(lm, dtype)
    load_weights(lm, gather_full_state_dict(policy, dist.device, prefix="lm."))
    with torch.no_grad():
        for name, buffer in policy.lm.named_buffers():  # rotary inv_freq: not in the state dict
            lm.get_buffer(name).copy_(buffer)
    return lm


def broadcast_object(obj, dist: Dist):
    """Rank 0's value of a small Python object, on every rank (so that all ranks act on one
    decision)."""
    if not dist.sharded:
        return obj
    box = [obj]
    tdist.broadcast_object_list(box, src=0)
    return box[0]


def all_reduce(value: torch.Tensor, dist: Dist, op: str = "sum") -> torch.Tensor:
    """Sum, max or min over ranks (identity in one process), in float64 so the reduction itself adds
    no error."""
    if not dist.sharded:
        return value
    out = value.detach().to(dist.device, torch.float64)
    tdist.all_reduce(
        out,
        op={"sum": tdist.ReduceOp.SUM, "max": tdist.ReduceOp.MAX, "min": tdist.ReduceOp.MIN}[op],
    )
    return out


def agree(ok: bool, dist: Dist) -> bool:
    """True on every rank iff `ok` on every rank: a rank that failed (a write error) stops all of
    them together instead of leaving the others waiting in the next collective."""
    return bool(all_reduce(torch.tensor(float(ok)), dist, "min").item())


def barrier(dist: Dist) -> None:
    if dist.sharded:
        tdist.barrier()


def rank_share(items: Sequence, dist: Dist) -> list:
    """This rank's contiguous slice of `items` (sizes differ by at most one; rank order = item
    order)."""
    base, extra = divmod(len(items), dist.world)
    start = dist.rank * base + min(dist.rank, extra)
    return list(items[start : start + base + (1 if dist.rank < extra else 0)])


def all_gather_lists(local: list, dist: Dist) -> list:
    """Concatenate every rank's list in rank order (inverse of `rank_share`); small Python objects
    only."""
    if not dist.sharded:
        return list(local)
    parts: list = [None] * dist.world
    tdist.all_gather_object(parts, local)
    return [x for part in parts for x in part]


def scatter_lists(outgoing: list[list], dist: Dist) -> list:
    """What every rank sent this one, in rank order (`outgoing[r]`: this rank's list for rank r):
    a rank receives only its share, where `all_gather_lists` gives every rank everything."""
    if not dist.sharded:
        return list(outgoing[0])
    parts = [[None] for _ in range(dist.world)]
    for src, part in enumerate(parts):  # a scatter per sender
        tdist.scatter_object_list(part, outgoing if dist.rank == src else None, src=src)
    return [x for (got,) in parts for x in got]
