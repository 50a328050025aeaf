"""The phases of a T-GRPO or SFT step (rollout, experience log-probs, update, weight sync,
validation, checkpoint), each as the bytes per GPU by part at its peak moment, and the vLLM engine's
pool. Its constants are most of the assumptions the table states; the node's host RAM is
psyrl/plan/host_ram.py."""

from __future__ import annotations

import math
from dataclasses import dataclass

from psyrl.core.config import Config
from psyrl.plan.activations import compute_moments
from psyrl.plan.architecture import Shapes

GIB = 2**30
MIB = 2**20
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
CUDA_CONTEXT_GIB = 0.5  # assumption: CUDA context and cuBLAS workspace of one process
# estimate: the buffers of one NCCL communicator of several ranks (channels x peers x
# NCCL_BUFFSIZE for the Simple, LL and LL128 protocols, plus NCCL's own structures); a one-rank
# communicator has no peers and is not counted
NCCL_COMM_GIB = 0.2
# estimate: vLLM's CUDA graphs (0.5-1 GiB is usual; the upper end taken); kept while asleep
VLLM_GRAPHS_GIB = 1.0
# vLLM's default max_num_batched_tokens for LLM(...): GPUs under / from 70 GiB
# (EngineArgs.get_batch_defaults; an A100 80 GB gets 8192)
VLLM_STEP_TOKENS = {False: 8192, True: 16384}
# the parts of a phase, in the table's column order
PARTS = (
    "params",
    "grads",
    "adam",
    "gathered",
    "grad sync",
    "activations",
    "log-probs",
    "reference",
    "sampler",
    "transfer",
    "CUDA",
)


@dataclass
class Phase:
    name: str
    parts: dict[str, float]
    """Bytes per GPU at the phase's peak moment, by part (PARTS)."""
    peak_at: str
    """The moment of the phase that is its peak."""
    capacity: float
    """Bytes of one GPU."""
    fix: str = ""
    """For a phase that does not fit: the setting that makes it fit (computed), or why none does."""

    @property
    def total(self) -> float:
        return sum(self.parts.values())

    @property
    def fits(self) -> bool:
        return self.total <= self.capacity


@dataclass
class Pool:
    """The vLLM engine's memory pool during a rollout, per GPU (bytes)."""

    pool: float
    weights: float
    activation: float
    graphs: float
    kv_per_token: float
    max_model_len: int
    max_num_seqs: int

    @property
    def kv(self) -> float:
        return self.pool - self.weights - self.activation - self.graphs

    @property
    def sequences(self) -> int:
        return max(0, int(self.kv // (self.kv_per_token * self.max_model_len)))


@dataclass(frozen=True)
class Setup:
    """What every phase of one configuration shares (bytes per GPU)."""

    world: int
    b: int  # compute dtype bytes (model.dtype)
    # bytes of a parameter's gradient as autograd makes it (the gathered parameter's dtype)
    grad_b: int
    offload: str
    params: float
    grads: float
    adam: float
    gathered: float
    reference: float
    kl: bool
    cuda: float
    sampler: bool  # whether the run builds a sampler (SFT: only to validate)


def setup(cfg: Config, sh: Shapes, gpus: int, trainer: str) -> Setup:
    world = gpus
    b = DTYPE_BYTES[cfg.model.dtype]
    # SFT: phase = none
    offload = cfg.fsdp.offload if trainer == "tgrpo" or cfg.fsdp.offload != "phase" else "none"
    # CPUOffloadPolicy is FSDP2's: one process keeps its model on the device
    if world == 1 and offload == "always":
        offload = "none"
    shard = sh.shard(world)
    # FSDP2, MixedPrecisionPolicy(param_dtype=model.dtype): autograd's gradients are in model.dtype
    # the root unit stays gathered through forward and backward (Policy is the root and computes
    # everything); FSDP2 prefetches the next layer while one computes: two layer units at once (dim
    # 0 padded to the world)
    if world > 1:
        gathered = b * world * (sh.shard(world, "root") + 2 * sh.shard(world, "layer"))
        grad_b = b
    # one process: a plain float32 model; bf16 autocast caches a bf16 copy of every weight it casts
    else:
        gathered = 2 * sh.params if b == 2 else 0.0
        grad_b = 4
    kl = trainer == "tgrpo" and cfg.loss.kl_coef > 0
    if not kl:
        reference = 0.0
    # one process: the reference is a second model on the device, in model.dtype (build_reference)
    elif world == 1:
        reference = b * sh.params
    else:  # FSDP2 shard in model.dtype; with ref_offload it lives on the host (CPUOffloadPolicy)
        reference = 0.0 if cfg.fsdp.ref_offload else b * shard
    return Setup(
        world,
        b,
        grad_b,
        offload,
        4.0 * shard,
        4.0 * shard,
        8.0 * shard,
        gathered,
        reference,
        kl,
        cuda_context_bytes(cfg, gpus, trainer),
        trainer == "tgrpo" or bool(cfg.data.valid_file),
    )


def nccl_communicators(cfg: Config, gpus: int, trainer: str) -> dict[str, int]:
    """The NCCL communicators of several ranks one process holds, by owner. All are created eagerly:
    psyrl binds its default group to the device (psyrl/runtime/distributed.py init_process_group(
    device_id=...)), so every later NCCL group is connected when it is made. vLLM 0.32 under
    external_launcher (wheel vllm-0.32.0, vllm/distributed/parallel_state.py): the world group
    (init_world_group, :1502-1510, a torch NCCL group over every rank made at :501), then tp
    (:2152), dcp (:2226), pcp (:2249), pp (:2267) and dp (:2285) groups (ep only for MoE models,
    :2296), each a torch NCCL group over its ranks (:501) and, for a group of several ranks with a
    device communicator, a second one of its own, vLLM's PyNcclCommunicator
    (device_communicators/cuda_communicator.py:106-110; the world group has none, :1506). In
    psyrl's layout only the world and, with TP > 1, the tp groups have several ranks (dcp, pcp, pp
    and dp hold one)."""
    out = {}
    if gpus > 1:
        out["psyrl's default group (FSDP2)"] = 1
    engine = cfg.sampler.engine == "vllm" and (trainer == "tgrpo" or bool(cfg.data.valid_file))
    if engine and gpus > 1:
        out["vLLM world group"] = 1
    if engine and cfg.sampler.tensor_parallel > 1:
        out["vLLM tp group (torch + PyNccl)"] = 2
    return out


def cuda_context_bytes(cfg: Config, gpus: int, trainer: str) -> float:
    """CUDA context and cuBLAS workspace, and NCCL_COMM_GIB for each communicator of several
    ranks."""
    communicators = sum(nccl_communicators(cfg, gpus, trainer).values())
    return (CUDA_CONTEXT_GIB + NCCL_COMM_GIB * communicators) * GIB


def _resident(run: Setup, on_device: bool, grads: bool) -> dict[str, float]:
    """The actor's float32 shards and AdamW state on the GPU, when they are there in this phase
    (fsdp.offload)."""
    if run.offload == "always" or not on_device:
        return {"params": 0.0, "grads": 0.0, "adam": 0.0}
    return {"params": run.params, "grads": run.grads if grads else 0.0, "adam": run.adam}


def _sampler_idle(cfg: Config, sh: Shapes, run: Setup, capacity: float) -> float:
    """What the sampler holds on the GPU outside its own phases: the torch sampler its unsharded
    copy in model.dtype (psyrl.runtime.distributed.unsharded_copy); a sleeping vLLM engine its CUDA
    graphs (sleep level 1 frees weights and KV cache only: the graph pool is not in vLLM's sleep
    allocator); an engine that never sleeps its whole pool. SFT builds its sampler at the first
    validation and keeps it."""
    if not run.sampler:
        return 0.0
    if cfg.sampler.engine == "torch":
        return run.b * sh.params
    if not cfg.sampler.sleep:
        return cfg.sampler.gpu_memory_utilization * capacity
    return 0.0 if cfg.sampler.enforce_eager else VLLM_GRAPHS_GIB * GIB


def vllm_pool(cfg: Config, sh: Shapes, gpus: int, capacity: float) -> Pool:
    """The vLLM pool (gpu_memory_utilization x the GPU: vLLM sizes it so and refuses to start if
    less is free)."""
    tp, b = cfg.sampler.tensor_parallel, DTYPE_BYTES[cfg.model.dtype]
    max_model_len = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
    # vLLM splits the KV heads over TP ranks; fewer heads than ranks: replicated
    kv_heads = max(1, sh.kv_heads // tp)
    # K and V of every layer, in model.dtype
    kv_per_token = 2 * sh.layers * kv_heads * sh.head_dim * b
    weights = b * sh.params / tp  # vLLM shards every matrix (and the vocabulary) over the TP ranks
    step_tokens = VLLM_STEP_TOKENS[capacity >= 70 * GIB]  # chunked prefill: a step never exceeds it
    # estimate of vLLM's profiled activation peak: one step's residual stream and MLP (gate_up and
    # its product), plus the sampler's [max_num_seqs, V] float32 logits and three temporaries of the
    # same size (softmax, top-p sort)
    activation = (
        step_tokens * b * (2 * sh.hidden + 3 * sh.intermediate / tp)
        + cfg.sampler.max_num_seqs * sh.vocab * 16
    )
    graphs = 0.0 if cfg.sampler.enforce_eager else VLLM_GRAPHS_GIB * GIB
    return Pool(
        cfg.sampler.gpu_memory_utilization * capacity,
        weights,
        activation,
        graphs,
        kv_per_token,
        max_model_len,
        cfg.sampler.max_num_seqs,
    )


def _torch_generation(cfg: Config, sh: Shapes, run: Setup) -> float:
    """psyrl's torch sampler generating sampler.batch rows (psyrl.runtime.sampler): a DynamicCache
    in model.dtype, the prompts' prefill (one gradient-free forward over them), last-position logits
    only."""
    rows, prompt = cfg.sampler.batch, cfg.rollout.max_prompt_tokens
    full = prompt + cfg.rollout.max_new_tokens
    # K and V of every layer (transformers' cache)
    kv_per_token = 2 * sh.layers * sh.kv_heads * sh.head_dim * run.b
    prefill = compute_moments(sh, rows, prompt, rows, run.b, run.grad_b, False, False)[
        "layer forward"
    ]["activations"]
    # [rows, V] float32 logits, probabilities and the draw's temporary
    logits = rows * sh.vocab * 4 * 3
    return max(rows * full * kv_per_token, rows * prompt * kv_per_token + prefill) + logits


def _parts(**values: float) -> dict[str, float]:
    return {p: float(values.get(p.replace(" ", "_").replace("-", "_"), 0.0)) for p in PARTS}


def rollout_phase(
    cfg: Config, sh: Shapes, gpus: int, capacity: float, trainer: str, name: str = "rollout"
) -> Phase:
    """Generation: the sampler awake beside what the trainer keeps on the GPU ("phase": nothing)."""
    run = setup(cfg, sh, gpus, trainer)
    resident = _resident(run, on_device=run.offload == "none", grads=False)
    if cfg.sampler.engine == "vllm":
        # the whole pool; vLLM does not subtract the trainer
        sampler = cfg.sampler.gpu_memory_utilization * capacity
    else:
        sampler = run.b * sh.params + _torch_generation(cfg, sh, run)
    return Phase(
        name,
        _parts(**resident, reference=run.reference, sampler=sampler, CUDA=run.cuda),
        "generation",
        capacity,
    )


def _batch(rows: int, seq_len: int, budget: int, max_response: int) -> tuple[float, int, int]:
    """(rows, seq_len, scored targets) of the largest micro-batch: fixed `rows` sequences of seq_len
    tokens, or, under a token budget (optim.micro_batch_tokens, logprob_micro_batch_tokens;
    psyrl.rl.update.micro_batches), rows x longest row <= budget (a longer sequence alone), so at
    most max(budget, seq_len) tokens, whose mask is largest when the rows are longest, and nearly
    all of them scored when the prompts are short."""
    if budget > 0:
        tokens = max(budget, seq_len)
        return tokens / seq_len, seq_len, tokens
    return rows, seq_len, rows * min(max_response, seq_len - 1)


def _grad_sync(sh: Shapes, run: Setup, moment: str, defer: bool) -> float:
    """Gradient buffers of FSDP2's reduce-scatter (torch _fsdp_collectives.foreach_reduce): the
    unit's unsharded gradients in model.dtype, copied into a float32 reduce-scatter input (dim 0
    padded), reduced into a float32 shard. defer_grad_sync: float32 unsharded gradients of every
    parameter held through the update (set_requires_gradient_sync (False) accumulates them in
    reduce_dtype, _fsdp_param.to_accumulated_grad_if_needed)."""
    deferred = 4.0 * sh.params if defer and run.world > 1 else 0.0
    if run.world == 1:  # one process: gradients accumulate in .grad (the "grads" part)
        return deferred
    layer = run.world * sh.shard(run.world, "layer")
    root = run.world * sh.shard(run.world, "root")
    # conservative: the previous layer's reduce may still run (its own stream)
    if moment == "layer backward":
        return deferred + run.grad_b * sh.layer_params + 4 * layer + 4 * layer / run.world
    # the root's own unsharded gradient is the head's (counted under log-probs)
    if moment == "root reduce":
        return deferred + 4 * root + 4 * root / run.world
    return deferred


def _compute_phase(
    cfg: Config,
    sh: Shapes,
    gpus: int,
    capacity: float,
    trainer: str,
    name: str,
    rows: float,
    seq_len: int,
    targets: int,
    backward: bool,
    on_device: bool = True,
) -> Phase:
    """A forward (and backward) of one micro-batch beside the resident memory; the peak over its
    moments."""
    run = setup(cfg, sh, gpus, trainer)
    moments = compute_moments(
        sh,
        rows,
        seq_len,
        targets,
        run.b,
        run.grad_b,
        cfg.model.gradient_checkpointing,
        backward,
        autocast=run.world == 1 and run.b == 2,
        packed=cfg.model.packing,
    )
    # the end of the backward: the root unit's gradients reduce-scattered
    if backward and run.world > 1:
        moments["root reduce"] = {
            "activations": 0.0,
            "log-probs": run.grad_b * sh.vocab * sh.hidden,
        }
    resident = _resident(run, on_device, grads=backward)
    best = None
    for moment, compute in moments.items():
        sync = _grad_sync(sh, run, moment, cfg.fsdp.defer_grad_sync) if backward else 0.0
        parts = _parts(
            **resident,
            gathered=run.gathered,
            grad_sync=sync,
            activations=compute["activations"],
            log_probs=compute["log-probs"],
            reference=run.reference,
            sampler=_sampler_idle(cfg, sh, run, capacity),
            CUDA=run.cuda,
        )
        phase = Phase(name, parts, moment, capacity)
        if best is None or phase.total > best.total:
            best = phase
    return best


def _sync(cfg: Config, sh: Shapes, gpus: int, capacity: float, trainer: str) -> Phase:
    """Weight sync: the engine's weights awake (KV cache asleep), the trainer's resident memory, and
    the buckets: parameters cast to model.dtype on the GPU and all-gathered about
    sampler.sync_bucket_mib at a time (psyrl.runtime.distributed.sync_buckets: the gathered bucket,
    this rank's input share, one unpacked copy). A bucket closes once it reaches the size, so it can
    exceed it by its last tensor: at most the size plus the largest tensor."""
    run = setup(cfg, sh, gpus, trainer)
    resident = _resident(run, on_device=run.offload == "none", grads=False)
    largest = run.b * max(math.prod(s) for s in sh.root + sh.layer)
    # no bigger than the whole model
    bucket = min(cfg.sampler.sync_bucket_mib * MIB + largest, run.b * sh.params)
    # one process: no shards to gather; each tensor is cast on its own (sync_buckets' replicated
    # path)
    transfer = bucket * (2 + 1 / run.world) if run.world > 1 else largest
    if cfg.sampler.engine == "vllm":
        idle = _sampler_idle(cfg, sh, run, capacity)
        sampler = idle
        if cfg.sampler.sleep:
            sampler += run.b * sh.params / cfg.sampler.tensor_parallel
    else:
        sampler = run.b * sh.params
    return Phase(
        "sync",
        _parts(
            **resident, reference=run.reference, sampler=sampler, transfer=transfer, CUDA=run.cuda
        ),
        "bucket",
        capacity,
    )


def _checkpoint(cfg: Config, sh: Shapes, gpus: int, capacity: float, trainer: str) -> Phase:
    """Checkpoint and export, after the validation (T-GRPO's phase offload has put the actor back on
    the host): the trainer's resident memory, and rank 0 gathering one full float32 parameter at a
    time (psyrl.runtime.distributed.gather_to_rank0): on the GPU when the shards are there (the
    world's padded shards, their concatenation, its own padded copy), on the host otherwise. The
    largest parameter is the embedding."""
    run = setup(cfg, sh, gpus, trainer)
    on_device = run.offload == "none"
    largest = 4.0 * max(math.prod(s) for s in sh.root + sh.layer)
    transfer = largest * (2 + 1 / run.world) if on_device and run.world > 1 else 0.0
    return Phase(
        "checkpoint",
        _parts(
            **_resident(run, on_device, False),
            reference=run.reference,
            sampler=_sampler_idle(cfg, sh, run, capacity),
            transfer=transfer,
            CUDA=run.cuda,
        ),
        "largest tensor",
        capacity,
    )


def step_phases(cfg: Config, sh: Shapes, gpus: int, capacity: float, trainer: str) -> list[Phase]:
    """The phases of one step of `trainer` on GPUs of `capacity` bytes, in the order they run, each
    at its peak moment."""
    phases = []
    if trainer == "tgrpo":
        # the worst case: every sequence this long
        seq = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
        response = cfg.rollout.max_new_tokens
        phases.append(rollout_phase(cfg, sh, gpus, capacity, trainer))
        rows, seq_len, targets = _batch(
            cfg.optim.logprob_micro_batch, seq, cfg.optim.logprob_micro_batch_tokens, response
        )
        phases.append(
            _compute_phase(
                cfg, sh, gpus, capacity, trainer, "experience", rows, seq_len, targets, False
            )
        )
        rows, seq_len, targets = _batch(
            cfg.optim.micro_batch, seq, cfg.optim.micro_batch_tokens, response
        )
        phases.append(
            _compute_phase(cfg, sh, gpus, capacity, trainer, "update", rows, seq_len, targets, True)
        )
        phases.append(_sync(cfg, sh, gpus, capacity, trainer))
    else:
        seq = cfg.data.max_length
        rows, seq_len, targets = _batch(cfg.optim.micro_batch, seq, 0, seq)
        phases.append(
            _compute_phase(cfg, sh, gpus, capacity, trainer, "update", rows, seq_len, targets, True)
        )
    # generation with the sampler awake, then the gradient-free loss pass of the SFT targets
    if cfg.data.valid_file:
        generation = rollout_phase(cfg, sh, gpus, capacity, trainer, "validation")
        rows, seq_len, targets = _batch(
            cfg.optim.logprob_micro_batch, cfg.data.max_length, 0, cfg.data.max_length
        )
        loss = _compute_phase(
            cfg, sh, gpus, capacity, trainer, "validation", rows, seq_len, targets, False
        )
        loss.peak_at = f"loss pass ({loss.peak_at})"
        phases.append(max(generation, loss, key=lambda p: p.total))
    phases.append(_checkpoint(cfg, sh, gpus, capacity, trainer))
    return phases
