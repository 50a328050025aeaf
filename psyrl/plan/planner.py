"""`psyrl plan`: the memory a run needs per GPU, phase by phase, and on the host, before it spends a
node-hour.

The model describes psyrl's runtime (SPEC §1): FSDP2 `fully_shard` on every decoder layer and then
on the root `Policy` (embedding, final norm, LM head); float32 master weights, gradients and AdamW
state, sharded over the ranks (`fsdp.offload` says where they live in each phase); bf16 compute
through MixedPrecisionPolicy; a frozen reference model for the KL term; a colocated vLLM engine (or
psyrl's torch sampler) that sleeps between rollouts. Each phase of a step (rollout, experience
log-probs, update, weight sync, validation, checkpoint) is a few *moments* (the head's forward, the
first layer's backward, ...), each a sum of parts in bytes per GPU; the phase's peak is its largest
moment, and the table shows that moment's parts. A phase that does not fit is planned again with one
setting changed at a time (then two), and the first change that makes it fit, without breaking a
phase that fitted, is its fix.

Every formula says where it comes from: the code it counts (psyrl, transformers' Qwen2, torch's
FSDP2) or an assumption, stated. What is measured (tests/plan/): the parameter counts (transformers
on the meta device), the FSDP2 shard, gradient and AdamW bytes per rank (2 gloo ranks), a decoder
layer's saved bytes (exact, in float32 and bf16) and the activation and log-prob peak of one
forward/backward on a CPU in float32 (within 15 %). What is not: anything on a GPU (the CUDA
allocator's fragmentation, sdpa's GPU kernels, vLLM's own figures are estimates).

The package, imports running down: table (the text `psyrl plan` prints) -> planner (this module:
the plan, its verdict, the fixes) -> network (the collectives that cross between nodes) -> phases
(each phase's bytes, the vLLM pool, host RAM) -> activations (one micro-batch's bytes) ->
architecture (config.json as parameter shapes); speed (the time model) beside them.
"""

from __future__ import annotations

import copy
import itertools
from dataclasses import dataclass, field

from psyrl.core.config import Config
from psyrl.plan.architecture import Shapes, shapes
from psyrl.plan.devices import Device
from psyrl.plan.host_ram import host_ram
from psyrl.plan.network import (
    NETWORK_GBPS,
    Collective,
    check_network_gbps,
    network,
    network_seconds,
)
from psyrl.plan.phases import GIB, Phase, Pool, rollout_phase, step_phases, vllm_pool
from psyrl.plan.speed import (
    Times,
    Workload,
    experience_parts,
    step_times,
    update_parts,
)

# left free beside the pool in the rollout: allocator fragmentation, NCCL buffers made late
SUGGEST_MARGIN_GIB = 2.0
# KV cache the suggested pool holds beyond max_num_seqs full-length sequences: vLLM's profiled
# activation peak may exceed psyrl's estimate of it by this much before a sequence waits
KV_MARGIN_GIB = 1.0
OFFLOADS = ("none", "phase", "always")
# the update's token budget set beside the configured one (issue 29 item 6: twice A.3's 16,384
# halves the FSDP rounds, each an all-gather and a reduce-scatter of the whole model)
ALT_BUDGET = 32768


@dataclass
class Alternative:
    """One setting changed: the memory of the phase it moves and the predicted time."""

    setting: str
    current: bool
    phase: str
    gib: float
    """That phase's peak GiB per GPU."""
    fits: bool
    seconds: float
    """That phase's predicted seconds per step."""
    step_seconds: float
    detail: str


@dataclass
class Plan:
    """The memory plan of one configuration on `nodes` nodes of gpus / nodes GPUs each: its phases,
    vLLM pool and host RAM, each judged against the GPUs and a node, with the fixes found for what
    does not fit, and what crosses the network between nodes."""

    trainer: str
    gpus: int
    gpu_memory_gib: float
    host_memory_gib: float | None
    parameters: int
    phases: list[Phase]
    host: dict[str, float]
    """Host RAM per node that stays allocated, bytes by part."""
    host_transient: dict[str, float]
    """Host RAM that comes and goes (one at a time: the largest counts), bytes by part."""
    host_fix: str = ""
    """When the host RAM does not fit: the setting that makes it fit (computed), or why none
    does."""
    pool: Pool | None = None
    suggested_utilization: float | None = None
    suggestion_note: str = ""
    defer_grad_sync_bytes: float = 0.0
    """What fsdp.defer_grad_sync = true adds to the update phase per GPU (0 when there is no
    update)."""
    settings: str = ""
    notes: list[str] = field(default_factory=list)
    times: Times | None = None
    """Predicted seconds per phase (T-GRPO, with a device), psyrl.plan.speed."""
    device: Device | None = None
    workload: Workload | None = None
    alternatives: list[Alternative] = field(default_factory=list)
    """Issue 29 item 6: the same run with sampler.tensor_parallel 1 vs 2 and the update's token
    budget as set vs ALT_BUDGET."""
    nodes: int = 1
    network: list[Collective] = field(default_factory=list)
    """The collectives each phase runs over every rank (psyrl.plan.network), with several nodes."""
    network_gbps: float = NETWORK_GBPS
    """Each node's network link, Gbit/s per direction (--network-gbps)."""
    network_seconds: dict[str, float] = field(default_factory=dict)
    """Seconds each phase keeps a node's network link busy (per step; validation and checkpoint:
    each)."""
    compute_seconds: dict[str, float] = field(default_factory=dict)
    """T-GRPO with a device: the compute that FSDP2 overlaps the experience's and the update's
    collectives with, per step."""

    def network_bound(self, phase: str) -> bool:
        """Whether the network, not the compute, bounds an overlapped phase."""
        return self.network_seconds.get(phase, 0.0) > self.compute_seconds.get(phase, 0.0)

    @property
    def host_total(self) -> float:
        return sum(self.host.values()) + max(self.host_transient.values(), default=0.0)

    @property
    def host_fits(self) -> bool | None:
        if self.host_memory_gib is None:
            return None
        return self.host_total <= self.host_memory_gib * GIB

    @property
    def kv_fits(self) -> bool:
        """Whether the vLLM pool leaves KV cache for one max_model_len sequence (vLLM refuses to
        start otherwise); True without a pool."""
        return self.pool is None or self.pool.sequences >= 1

    @property
    def gpus_fit(self) -> bool:
        """Whether every GPU phase fits and the vLLM pool holds a sequence: what the trainers refuse
        to start without (host RAM rests on a per-rank assumption, so it only warns)."""
        return all(p.fits for p in self.phases) and self.kv_fits

    @property
    def fits(self) -> bool:
        return self.gpus_fit and self.host_fits is not False

    @property
    def problems(self) -> list[str]:
        out = [
            f"{p.name} needs {p.total / GIB:.1f} GiB of {self.gpu_memory_gib:g}: {p.fix}"
            for p in self.phases
            if not p.fits
        ]
        if not self.kv_fits:
            out.append(
                f"rollout: the vLLM pool leaves {self.pool.kv / GIB:.2f} GiB of KV cache, less "
                f"than one sequence of {self.pool.max_model_len} tokens (vLLM refuses to start): "
                + (
                    f"set sampler.gpu_memory_utilization = {self.suggested_utilization:.2f}"
                    if self.suggested_utilization
                    else self.suggestion_note
                )
            )
        if self.host_fits is False:
            out.append(
                f"host RAM needs {self.host_total / GIB:.1f} GiB of {self.host_memory_gib:g} per "
                f"node: {self.host_fix}"
            )
        return out

    def verdict(self) -> str:
        """One line: `memory plan: fits 4 x 48 GiB (peak 41.2 GiB: update)`, or the first problem
        with its fix."""
        if self.fits:
            peak = max(self.phases, key=lambda p: p.total)
            where = f" on {self.nodes} nodes" if self.nodes > 1 else ""
            return (
                f"memory plan: fits {self.gpus} x {self.gpu_memory_gib:g} GiB{where} (peak "
                f"{peak.total / GIB:.1f} GiB: {peak.name})"
            )
        return f"memory plan: {self.problems[0]}"


def plan(
    cfg: Config,
    architecture,
    gpus: int,
    gpu_memory_gib: float,
    host_memory_gib: float | None = None,
    trainer: str = "tgrpo",
    dev: Device | None = None,
    wl: Workload | None = None,
    nodes: int = 1,
    network_gbps: float = NETWORK_GBPS,
) -> Plan:
    """The memory plan of `cfg` on `gpus` GPUs of `gpu_memory_gib` each, on `nodes` nodes of gpus /
    nodes GPUs: per phase, GiB per GPU by part and whether it fits, with a computed fix for each
    phase that does not; host RAM per node (`host_memory_gib` each); the suggested
    sampler.gpu_memory_utilization; the cost of fsdp.defer_grad_sync. `architecture`: a
    transformers Qwen2 config. `trainer`: "tgrpo" or "sft" (SFT has no rollout, experience or weight
    sync). With a device and a workload (psyrl.plan.speed), a T-GRPO plan also predicts seconds per
    phase and the run's total, and sets the alternatives beside it. With several nodes, the
    collectives that cross the network (psyrl.plan.network; T-GRPO's need the workload), each
    phase's seconds on a network of `network_gbps` Gbit/s per node, and the time model runs them
    at that speed."""
    if trainer not in ("tgrpo", "sft"):
        raise ValueError(f"trainer must be 'tgrpo' or 'sft', got {trainer!r}")
    check_network_gbps(network_gbps)  # on one node too: a bad value is a mistake either way
    sh = shapes(architecture)
    result = _plan(cfg, sh, gpus, gpu_memory_gib, host_memory_gib, trainer, nodes)
    for phase in result.phases:
        if not phase.fits:
            phase.fix = _find_fix(
                cfg, sh, gpus, gpu_memory_gib, host_memory_gib, trainer, phase.name, result, nodes
            )
    if result.host_fits is False:
        result.host_fix = _find_fix(
            cfg, sh, gpus, gpu_memory_gib, host_memory_gib, trainer, "host", result, nodes
        )
    result.network_gbps = network_gbps
    if nodes > 1 and (wl is not None or trainer == "sft"):
        result.network = network(cfg, sh, gpus, trainer, wl)
        result.network_seconds = network_seconds(result.network, gpus, nodes, network_gbps)
    if dev is not None and wl is not None and trainer == "tgrpo":
        result.times = step_times(cfg, sh, gpus, dev, wl, result.network_seconds)
        result.device, result.workload = dev, wl
        result.alternatives = _alternatives(
            cfg, sh, gpus, gpu_memory_gib, dev, wl, nodes, network_gbps
        )
        result.compute_seconds = {
            "experience": experience_parts(cfg, sh, gpus, dev, wl)["compute"],
            "update": update_parts(cfg, sh, gpus, dev, wl)["compute"],
        }
    return result


def _network(
    cfg: Config, sh: Shapes, gpus: int, wl: Workload, nodes: int, gbps: float
) -> dict[str, float]:
    """Each T-GRPO phase's seconds on the network between `nodes` nodes (none on one)."""
    if nodes == 1:
        return {}
    return network_seconds(network(cfg, sh, gpus, "tgrpo", wl), gpus, nodes, gbps)


def _alternatives(
    cfg: Config,
    sh: Shapes,
    gpus: int,
    gpu_memory_gib: float,
    dev: Device,
    wl: Workload,
    nodes: int = 1,
    network_gbps: float = NETWORK_GBPS,
) -> list[Alternative]:
    """The run with sampler.tensor_parallel 1 and 2 (vLLM, a node's GPUs it divides; each at its
    own suggested gpu_memory_utilization), and with optim.micro_batch_tokens as set and ALT_BUDGET:
    the moved phase's memory and seconds, and the step's."""
    out = []
    capacity = gpu_memory_gib * GIB
    if cfg.sampler.engine == "vllm":
        for tp in (1, 2):
            if (gpus // nodes) % tp or not (sh.kv_heads % tp == 0 or tp % sh.kv_heads == 0):
                continue
            trial = _with(cfg, {("sampler", "tensor_parallel"): tp})
            util, _ = _suggest(trial, sh, gpus, gpu_memory_gib, "tgrpo")
            if util is not None:
                trial = _with(trial, {("sampler", "gpu_memory_utilization"): util})
            rollout = rollout_phase(trial, sh, gpus, capacity, "tgrpo")
            pool = vllm_pool(trial, sh, gpus, capacity)
            times = step_times(
                trial, sh, gpus, dev, wl, _network(trial, sh, gpus, wl, nodes, network_gbps)
            )
            out.append(
                Alternative(
                    f"sampler.tensor_parallel = {tp}",
                    tp == cfg.sampler.tensor_parallel,
                    "rollout",
                    rollout.total / GIB,
                    rollout.fits and pool.sequences >= 1,
                    times.step["rollout"],
                    times.step_total,
                    f"gpu_memory_utilization {trial.sampler.gpu_memory_utilization:.2f}, "
                    f"{min(pool.sequences, pool.max_num_seqs)} sequences at once",
                )
            )
    budgets = [cfg.optim.micro_batch_tokens] + (
        [ALT_BUDGET] if cfg.optim.micro_batch_tokens != ALT_BUDGET else []
    )
    for budget in budgets:
        trial = _with(cfg, {("optim", "micro_batch_tokens"): budget})
        update = next(
            p for p in step_phases(trial, sh, gpus, capacity, "tgrpo") if p.name == "update"
        )
        net = _network(trial, sh, gpus, wl, nodes, network_gbps)
        times = step_times(trial, sh, gpus, dev, wl, net)
        u = update_parts(trial, sh, gpus, dev, wl, net.get("update", 0.0))
        shown = (
            f"{u['micro-batches']:,.0f} micro-batches of "
            + (f"{budget:,} tokens" if budget else f"{cfg.optim.micro_batch} rows")
            + f" per rank, FSDP collectives {u['collectives']:,.1f} s "
            + ("hidden under" if u["collectives"] <= u["compute"] else "above")
            + f" compute {u['compute']:,.1f} s"
        )
        out.append(
            Alternative(
                f"optim.micro_batch_tokens = {budget}",
                budget == cfg.optim.micro_batch_tokens,
                "update",
                update.total / GIB,
                update.fits,
                times.step["update"],
                times.step_total,
                shown,
            )
        )
    return out


def _suggest(
    cfg: Config, sh: Shapes, gpus: int, gpu_memory_gib: float, trainer: str
) -> tuple[float | None, str]:
    """The smallest sampler.gpu_memory_utilization (a multiple of 0.01) whose pool holds
    sampler.max_num_seqs sequences of max_model_len tokens at once with KV_MARGIN_GIB of KV cache to
    spare, provided the rollout still fits with SUGGEST_MARGIN_GIB free beside it; when no such
    fraction fits, the largest that does (fewer sequences run at once); (None, why) when none
    holds even one sequence."""
    capacity = gpu_memory_gib * GIB
    fitting = []
    for k in range(1, 100):  # k / 100: multiples of 0.01 without float steps
        util = k / 100
        trial = _with(
            cfg, {("sampler", "gpu_memory_utilization"): util, ("sampler", "engine"): "vllm"}
        )
        rollout = rollout_phase(trial, sh, gpus, capacity, trainer)
        pool = vllm_pool(trial, sh, gpus, capacity)
        if rollout.total + SUGGEST_MARGIN_GIB * GIB > capacity or pool.sequences < 1:
            continue
        fitting.append(util)
        needed = pool.max_num_seqs * pool.max_model_len * pool.kv_per_token
        if pool.kv >= needed + KV_MARGIN_GIB * GIB:
            return util, ""
    if not fitting:
        return None, (
            f"no sampler.gpu_memory_utilization lets the rollout fit on {gpu_memory_gib:g} GiB "
            f"with one {cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens}-token sequence "
            f"of KV cache and {SUGGEST_MARGIN_GIB:g} GiB to spare: offload more (fsdp.offload) or "
            "raise sampler.tensor_parallel"
        )
    return fitting[-1], (
        f"the largest that fits: its KV cache holds fewer than sampler.max_num_seqs = "
        f"{cfg.sampler.max_num_seqs} full-length sequences at once"
    )


def check_layout(cfg: Config, gpus: int, nodes: int) -> None:
    """ValueError unless `gpus` ranks split evenly over `nodes` nodes and a vLLM tensor-parallel
    group fits inside one node and divides its GPUs: vLLM's external launcher groups consecutive
    ranks, torchrun numbers a node's ranks consecutively, so a group never spans two nodes."""
    if gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {gpus}")
    if nodes < 1:
        raise ValueError(f"--nodes must be >= 1, got {nodes}")
    if gpus % nodes:
        raise ValueError(
            f"--gpus {gpus} does not divide over --nodes {nodes}: every node runs the same number "
            "of ranks (torchrun --nproc_per_node)"
        )
    tp, node = cfg.sampler.tensor_parallel, gpus // nodes
    if cfg.sampler.engine != "vllm":
        return
    if tp > node:
        raise ValueError(
            f"sampler.tensor_parallel = {tp} is larger than a node's {node} GPUs: a vLLM "
            "tensor-parallel group never spans two nodes (each group of consecutive ranks, inside "
            "one node, holds one engine)"
        )
    if node % tp:
        where = f"the {gpus} GPUs" if nodes == 1 else f"a node's {node} GPUs"
        raise ValueError(
            f"sampler.tensor_parallel = {tp} must divide {where} (each group of consecutive ranks "
            "holds one vLLM engine)"
        )


def _plan(
    cfg: Config,
    sh: Shapes,
    gpus: int,
    gpu_memory_gib: float,
    host_memory_gib: float | None,
    trainer: str,
    nodes: int = 1,
) -> Plan:
    """The plan of `cfg` as it stands, without fixes: what plan() completes and _find_fix tries."""
    check_layout(cfg, gpus, nodes)
    capacity = gpu_memory_gib * GIB
    phases = step_phases(cfg, sh, gpus, capacity, trainer)
    stays, transient = host_ram(cfg, sh, gpus, trainer, nodes)
    result = Plan(
        trainer,
        gpus,
        gpu_memory_gib,
        host_memory_gib,
        sh.params,
        phases,
        stays,
        transient,
        settings=_settings(cfg, trainer),
        nodes=nodes,
    )
    if cfg.sampler.engine == "vllm" and (trainer == "tgrpo" or cfg.data.valid_file):
        result.pool = vllm_pool(cfg, sh, gpus, capacity)
        result.suggested_utilization, result.suggestion_note = _suggest(
            cfg, sh, gpus, gpu_memory_gib, trainer
        )
    if gpus > 1:  # re-planned with the flag flipped: the update's difference
        flipped = _with(cfg, {("fsdp", "defer_grad_sync"): not cfg.fsdp.defer_grad_sync})
        other = next(
            p for p in step_phases(flipped, sh, gpus, capacity, trainer) if p.name == "update"
        )
        mine = next(p for p in phases if p.name == "update")
        result.defer_grad_sync_bytes = abs(mine.total - other.total)
    return result


def _settings(cfg: Config, trainer: str) -> str:
    flag = lambda v: str(v).lower()
    parts = [
        f"model.dtype {cfg.model.dtype}",
        f"gradient_checkpointing {flag(cfg.model.gradient_checkpointing)}",
        f"packing {flag(cfg.model.packing)}",
        f"fsdp.offload {cfg.fsdp.offload}",
    ]
    if trainer == "tgrpo":
        o = cfg.optim
        parts.append(
            f"ref_offload {flag(cfg.fsdp.ref_offload)}" if cfg.loss.kl_coef > 0 else "no reference"
        )
        parts.append(
            f"sequences of {cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens} tokens, "
            "micro-batches "
            + (
                f"of {o.micro_batch_tokens} tokens"
                if o.micro_batch_tokens
                else f"of {o.micro_batch}"
            )
            + " (update), "
            + (
                f"{o.logprob_micro_batch_tokens} tokens"
                if o.logprob_micro_batch_tokens
                else f"{o.logprob_micro_batch}"
            )
            + " (experience)"
        )
    else:
        parts.append(f"micro-batches of {cfg.optim.micro_batch} x {cfg.data.max_length} tokens")
    sampler = f"sampler {cfg.sampler.engine}"
    if cfg.sampler.engine == "vllm":
        sampler += (
            f" (TP {cfg.sampler.tensor_parallel}, "
            f"gpu_memory_utilization {cfg.sampler.gpu_memory_utilization:g})"
        )
    else:
        sampler += f" (batch {cfg.sampler.batch})"
    return ", ".join(parts + [sampler])


# ---------------------------------------------------------------- fixes
def _with(cfg: Config, changes: dict[tuple[str, str], object]):
    new = copy.deepcopy(cfg)
    for (table, key), value in changes.items():
        setattr(getattr(new, table), key, value)
    return new


def _candidates(
    cfg: Config, sh: Shapes, gpus: int, gpu_memory_gib: float, trainer: str, nodes: int = 1
) -> list[dict]:
    """Setting changes to try, in order: fsdp.offload further, the suggested gpu_memory_utilization,
    a smaller token budget (update, then experience), more tensor parallelism, gradient
    checkpointing."""
    out = []
    for mode in OFFLOADS[OFFLOADS.index(cfg.fsdp.offload) + 1 :]:
        if trainer == "sft" and mode == "phase":
            continue  # SFT has no rollout: phase equals none
        out.append({("fsdp", "offload"): mode})
    if cfg.sampler.engine == "vllm" and (trainer == "tgrpo" or cfg.data.valid_file):
        util, _ = _suggest(cfg, sh, gpus, gpu_memory_gib, trainer)
        if util is not None and util != cfg.sampler.gpu_memory_utilization:
            out.append({("sampler", "gpu_memory_utilization"): util})
    if trainer == "tgrpo":
        seq = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
        for key, rows in (
            ("micro_batch_tokens", cfg.optim.micro_batch),
            ("logprob_micro_batch_tokens", cfg.optim.logprob_micro_batch),
        ):
            current = getattr(cfg.optim, key) or rows * seq
            # whole longest sequences per micro-batch, largest first
            for n in range(max(current // seq, 1), 0, -1):
                if n * seq < current:
                    out.append({("optim", key): n * seq})
    if cfg.sampler.engine == "vllm":
        for tp in (2, 4):
            if (
                tp > cfg.sampler.tensor_parallel
                and (gpus // nodes) % tp == 0
                and (sh.kv_heads % tp == 0 or tp % sh.kv_heads == 0)
            ):
                out.append({("sampler", "tensor_parallel"): tp})
    if not cfg.model.gradient_checkpointing:
        out.append({("model", "gradient_checkpointing"): True})
    return out


def _describe(changes: dict) -> str:
    show = lambda v: (
        f'"{v}"' if isinstance(v, str) else str(v).lower() if isinstance(v, bool) else f"{v:g}"
    )
    return " and ".join(
        f"set {table}.{key} = {show(value)}" for (table, key), value in changes.items()
    )


def _host_candidates(cfg: Config, trainer: str) -> list[dict]:
    """Setting changes that take host RAM back, in order: the actor's shards on the GPU, the
    reference's, the engine awake throughout (its weights stay on the GPU), a bf16 export."""
    out = []
    if cfg.fsdp.offload != "none":
        out.append({("fsdp", "offload"): "none"})
    if trainer == "tgrpo" and cfg.loss.kl_coef > 0 and cfg.fsdp.ref_offload:
        out.append({("fsdp", "ref_offload"): False})
    if cfg.sampler.engine == "vllm" and cfg.sampler.sleep:
        out.append({("sampler", "sleep"): False})
    if cfg.checkpoint.export_dtype != "bfloat16" and cfg.model.dtype == "bfloat16":
        out.append({("checkpoint", "export_dtype"): "bfloat16"})
    return out


def _find_fix(
    cfg: Config,
    sh: Shapes,
    gpus: int,
    gpu_memory_gib: float,
    host_memory_gib: float | None,
    trainer: str,
    name: str,
    current: Plan,
    nodes: int = 1,
) -> str:
    """The first change (single ones, then pairs) after which phase `name` (or "host": the host RAM)
    fits and no phase that fitted stops fitting."""
    fitted = {p.name for p in current.phases if p.fits}
    singles = (
        _host_candidates(cfg, trainer)
        if name == "host"
        else _candidates(cfg, sh, gpus, gpu_memory_gib, trainer, nodes)
    )
    pairs = [{**a, **b} for a, b in itertools.combinations(singles, 2) if not set(a) & set(b)]
    for changes in singles + pairs:
        trial = _with(cfg, changes)
        try:
            result = _plan(trial, sh, gpus, gpu_memory_gib, host_memory_gib, trainer, nodes)
        except ValueError:
            continue
        by_name = {p.name: p for p in result.phases}
        if not all(by_name[n].fits for n in fitted if n in by_name):
            continue
        if name == "host" and result.host_fits:
            return f"{_describe(changes)} ({result.host_total / GIB:.1f} GiB)"
        if name != "host" and by_name[name].fits:
            return f"{_describe(changes)} ({by_name[name].total / GIB:.1f} GiB)"
    if name == "host":
        return "no one or two of the settings psyrl plan tries makes it fit: a node with more RAM"
    return "no one or two of the settings psyrl plan tries makes it fit: more GPUs, or larger ones"
