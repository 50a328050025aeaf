"""The host RAM of a node (`psyrl plan`'s last column): what each rank keeps there for the whole
run (a baseline, the phase offload's exact block, FSDP2's pinned shards under CPU offload, the
reference's CPU shards, a sleeping vLLM engine's pinned weights) and what comes and goes (a
checkpoint, the start-up). Rounded as the allocators that hold it round: torch's pinned host
allocator to a power of two per block, vLLM's weight pool in the CUDA caching allocator's segments.
"""

from __future__ import annotations

import math

from psyrl.core.config import Config
from psyrl.plan.architecture import Shapes
from psyrl.plan.phases import DTYPE_BYTES, GIB, MIB, setup

HOST_BASELINE_GIB = 3.0  # assumption: Python, torch and the CUDA libraries of one rank in host RAM

# torch's CUDA caching allocator (torch 2.13 include/c10/core/AllocatorConfig.h:16-25, and
# large_segment_size_ there): every request rounded to MIN_BLOCK; requests up to SMALL_SIZE share
# SMALL_BUFFER segments, those under MIN_LARGE_ALLOC LARGE_BUFFER ones, the rest get their own
MIN_BLOCK = 512
SMALL_SIZE = MIB
SMALL_BUFFER = 2 * MIB
MIN_LARGE_ALLOC = 10 * MIB
ROUND_LARGE = 2 * MIB
LARGE_BUFFER = 20 * MIB
# vLLM 0.32 loads its weights under max_split_size_mb:20 (v1/worker/gpu_worker.py:589-592)
VLLM_LOAD_MAX_SPLIT = 20 * MIB


def local_elements(sh: Shapes, world: int, rank: int) -> int:
    """Real elements of rank `rank`'s FSDP2 shard: each parameter's dim 0 split in chunks of
    ceil(dim0 / world) rows, the last ranks holding fewer (or none)."""
    total = 0
    for count, shapes in ((sh.layers, sh.layer), (1, sh.root)):
        for s in shapes:
            chunk = -(-s[0] // world)
            rows = max(0, min(chunk, s[0] - rank * chunk))
            total += count * rows * math.prod(s[1:])
    return total


def offload_bytes(sh: Shapes, world: int, rank: int = 0) -> dict[str, float]:
    """Host bytes of rank `rank`'s phase offload (fsdp.offload = "phase"): its float32 parameter
    shard as FSDP2 stores it, dim 0 padded to a multiple of `world` (every rank the same padded
    size, Shapes.shard), and AdamW's exp_avg and exp_avg_sq, float32, made by zeros_like from the
    unpadded local shard (`local_elements`); AdamW's `step` scalars stay where they are. The
    runtime holds exactly these bytes in one pinned buffer per rank (psyrl/runtime/offload.py
    PhaseOffload): no allocator rounding."""
    return {
        "params": 4.0 * sh.shard(world),
        "exp_avg": 4.0 * local_elements(sh, world, rank),
        "exp_avg_sq": 4.0 * local_elements(sh, world, rank),
    }


def pinned_block(nbytes: int) -> int:
    """Host bytes torch's CUDA pinned (caching host) allocator takes for a request of `nbytes`: the
    next power of two (torch 2.13 include/ATen/core/CachingHostAllocator.h:300-309, for every size
    under pinned_max_round_threshold_, unbounded by default: include/c10/core/AllocatorConfig.h:
    361)."""
    return 1 << max(nbytes - 1, 0).bit_length()


def pinned_per_tensor_bytes(sh: Shapes, world: int, element_bytes: int) -> float:
    """Host bytes of one rank's padded shards pinned one tensor at a time (FSDP2's CPUOffloadPolicy:
    `Tensor.pin_memory()` per shard, torch 2.13 _fsdp_param.py:312-315): torch's pinned allocator
    rounds each block up to a power of two (`pinned_block`)."""
    total = 0.0
    for count, shapes in ((sh.layers, sh.layer), (1, sh.root)):
        for s in shapes:
            total += count * pinned_block(-(-s[0] // world) * math.prod(s[1:]) * element_bytes)
    return total


def vllm_weight_bytes(sh: Shapes, tp: int, element_bytes: int) -> list[int]:
    """Bytes of each weight tensor one tensor-parallel rank of vLLM 0.32's Qwen2 allocates, in the
    order it builds them (vllm/model_executor/models/qwen2.py): the embedding, its vocabulary padded
    to a multiple of 64 and split over the ranks (vocab_parallel_embedding.py:36, 289-305); per
    layer the merged q/k/v projection and its bias (QKVParallelLinear, a rank's heads and
    max(1, kv_heads / tp) kv heads, qwen2.py:149), o_proj, the merged gate/up projection,
    down_proj, the two RMSNorms; the final norm; an untied LM head like the embedding."""
    H, hd = sh.hidden, sh.head_dim
    vocab = -(-sh.vocab // 64) * 64 // tp
    qkv = (sh.heads // tp + 2 * max(1, sh.kv_heads // tp)) * hd
    layer = [qkv * H, qkv, H * sh.heads * hd // tp, 2 * sh.intermediate // tp * H]
    layer += [H * sh.intermediate // tp, H, H]
    out = [vocab * H] + sh.layers * layer + [H] + ([] if sh.tied else [vocab * H])
    return [n * element_bytes for n in out]


def cuda_segments(requests: list[int], max_split: int = VLLM_LOAD_MAX_SPLIT) -> list[int]:
    """The segments torch's CUDA caching allocator reserves for `requests` bytes allocated in order
    and never freed (vLLM's weight pool while it loads): each request rounded up to 512 B, served
    by the smallest free block of its pool that fits (small: up to 1 MiB, large: above) or a new
    segment (2 MiB small; 20 MiB for 1-10 MiB; else the request rounded up to 2 MiB); a large block
    split when the request is under `max_split` and over 1 MiB would remain, a small one when 512 B
    would (torch c10/cuda/CUDACachingAllocator.cpp round_size, get_allocation_size, should_split,
    get_free_block; the sizes: include/c10/core/AllocatorConfig.h:16-25 and its 20 MiB
    large_segment_size_)."""
    segments: list[int] = []
    free: dict[bool, list[int]] = {True: [], False: []}  # free blocks by pool (small?)
    for request in requests:
        size = max(-(-request // MIN_BLOCK) * MIN_BLOCK, MIN_BLOCK)
        small = size <= SMALL_SIZE
        block = min((b for b in free[small] if b >= size), default=None)
        # the smallest free block that fits, unless oversized (then a new segment, no search on)
        oversized = block is not None and (
            size < max_split <= block or size >= max_split and block >= size + LARGE_BUFFER
        )
        if block is not None and not oversized:
            free[small].remove(block)
        else:
            if small:
                block = SMALL_BUFFER
            elif size < MIN_LARGE_ALLOC:
                block = LARGE_BUFFER
            else:
                block = -(-size // ROUND_LARGE) * ROUND_LARGE
            segments.append(block)
        rest = block - size
        split = rest >= MIN_BLOCK if small else size < max_split and rest > SMALL_SIZE
        if split:
            free[small].append(rest)
    return segments


def vllm_sleep_backup(sh: Shapes, tp: int, element_bytes: int) -> tuple[int, int]:
    """(weight bytes, pinned host bytes) of one rank's vLLM engine asleep at level 1: vLLM 0.32
    backs up every segment of its weight pool into its own `torch.empty(size, pin_memory=True)`
    (device_allocator/cumem.py:256-276), which torch rounds up to a power of two (`pinned_block`);
    freed at wake-up, the blocks stay cached by torch's host allocator for the next sleep, so the
    RAM stays taken the whole run. The pool's segments: `cuda_segments` of the weights, loaded
    under max_split_size_mb:20 (v1/worker/gpu_worker.py:589-592)."""
    weights = vllm_weight_bytes(sh, tp, element_bytes)
    return sum(weights), sum(pinned_block(s) for s in cuda_segments(weights))


def host_ram(
    cfg: Config, sh: Shapes, gpus: int, trainer: str, nodes: int = 1
) -> tuple[dict[str, float], dict[str, float]]:
    """Host RAM of the first node (its gpus / nodes ranks, rank 0 among them): what stays, and what
    comes and goes. It is the largest node's: rank 0 alone gathers a checkpoint and reads the model,
    and the first ranks hold the largest shards (`local_elements`)."""
    run = setup(cfg, sh, gpus, trainer)
    local = range(gpus // nodes)  # the first node's ranks
    stays = {
        f"baseline ({HOST_BASELINE_GIB:g} GiB per rank, assumption)": HOST_BASELINE_GIB
        * GIB
        * len(local)
    }
    # "phase": the actor's float32 shards + AdamW state in one exact-size pinned buffer per rank
    if run.offload == "phase" and run.world > 1:
        stays["actor shards + AdamW, pinned, exact"] = sum(
            sum(offload_bytes(sh, run.world, r).values()) for r in local
        )
    # "always": FSDP2 pins every shard and its gradient, each rounded up; AdamW's moments pageable
    if run.offload == "always" and run.world > 1:
        moments = sum(8.0 * local_elements(sh, run.world, r) for r in local)
        pinned = 2 * len(local) * pinned_per_tensor_bytes(sh, run.world, 4)
        stays["actor shards + gradients (pinned, rounded up per tensor) + AdamW"] = pinned + moments
    # CPUOffloadPolicy keeps each rank's padded shard in model.dtype
    if run.kl and run.world > 1 and cfg.fsdp.ref_offload:
        stays[f"reference model ({cfg.model.dtype}, CPU offload, padded shards)"] = (
            run.b * sh.shard(run.world) * len(local)
        )
    # sleep level 1: each weight segment to its own pinned block, rounded up to a power of two
    if run.sampler and cfg.sampler.engine == "vllm" and cfg.sampler.sleep:
        _, pinned = vllm_sleep_backup(sh, cfg.sampler.tensor_parallel, run.b)
        stays["vLLM weights asleep, pinned, rounded up per segment"] = pinned * len(local)
    export = DTYPE_BYTES[cfg.checkpoint.export_dtype]
    transient = {
        # rank 0 gathers the full float32 state dict, then writes the HF export in
        # checkpoint.export_dtype
        f"checkpoint on rank 0 (float32 state + {cfg.checkpoint.export_dtype} export)": (4 + export)
        * sh.params,
        "start-up: rank 0 reads the float32 model": 4.0 * sh.params,  # runtime.load_sharded
    }
    return stays, transient
