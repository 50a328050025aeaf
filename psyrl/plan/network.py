"""What crosses the network between nodes (`psyrl plan --nodes N`): every collective psyrl runs on
tensors whose size the model sets, by phase, with its bytes per call and calls per step, and the
bytes each node sends over its network link.

The collectives, from psyrl's code (one FSDP2 mesh over every rank, psyrl/runtime/distributed.py):
  * experience: one FSDP2 all-gather of every unit's parameters per forward (reshard_after_forward
    is passed as a bool, so the root unit reshards too: torch _fully_shard.py auto_reshard), in
    model.dtype (MixedPrecisionPolicy param_dtype; the reference's shards are in model.dtype);
  * update: per micro-batch, the all-gather in the forward and again in the backward
    (fsdp.reshard_after_forward = false: once), and a reduce-scatter of float32 gradients
    (reduce_dtype), at the last micro-batch of each mini-batch only under fsdp.defer_grad_sync
    (psyrl/rl/update.py set_requires_gradient_sync);
  * sync: `sync_buckets`' all-gathers of every parameter cast to model.dtype, over all ranks, once;
    the hand-over into vLLM (`load_weights` on each rank's gathered tensors) and the engine's own
    all-reduces stay inside a node, since a tensor-parallel group never spans two;
  * validation: one all-gather per forward of the loss pass; checkpoint: `gather_to_rank0`, every
    rank's padded float32 shard to rank 0, one parameter at a time.
Not counted, being sized by text or a few scalars: all_gather_object of the prompts (TP > 1), of the
scored samples and of validation's outputs; the all-reduces of micro-batch counts, the gradient norm
and the metrics; the advantages are computed on every rank from the gathered samples (no
collective). Once a run: rank 0's weights broadcast at start-up.

Bytes over a node's link: NCCL runs all-gather and reduce-scatter as a ring (its tree algorithm is
for all-reduce), and a ring over nodes whose ranks are consecutive enters and leaves each node once
per channel: every link of the ring carries (W - 1) / W of the collective's full buffer, so each
node sends that much and receives as much. A gather to rank 0 brings the other nodes' shards into
rank 0's node: (N - 1) / N of the full buffer.

Seconds: a node's bytes over its link at --network-gbps (NETWORK_GBPS unless given), Gbit/s per
direction, at line rate (no protocol overhead, one link per node: a lower bound). A ring moves at
its slowest link, so on several nodes the time model (psyrl.plan.speed) runs each collective at the
slower of this and the GPU-to-GPU link; FSDP2 overlaps the experience's and the update's with their
compute, and the larger of the two bounds the phase.
"""

from __future__ import annotations

from dataclasses import dataclass

from psyrl.core.config import Config
from psyrl.plan.architecture import Shapes
from psyrl.plan.phases import DTYPE_BYTES
from psyrl.plan.speed import (
    Workload,
    experience_micro_batches,
    update_micro_batches,
    validation_micro_batches,
)

# the network a node is assumed to have when --network-gbps is not given: 25 GbE, Gbit/s per
# direction (an assumption, printed with the plan)
NETWORK_GBPS = 25.0


@dataclass
class Collective:
    """One collective of a phase over every rank."""

    phase: str
    what: str
    op: str
    """"all-gather", "reduce-scatter" (NCCL's ring) or "gather" (to rank 0)."""
    size: float
    """Bytes of one call's full buffer: the gathered tensors, or the reduce-scatter's input."""
    calls: float
    """Calls per step (validation and checkpoint: per validation, per checkpoint)."""

    def node_bytes(self, world: int, nodes: int) -> float:
        """Bytes one node sends over its network link for all `calls` (a gather: what rank 0's node
        receives)."""
        if nodes == 1:
            return 0.0
        if self.op == "gather":
            return self.calls * self.size * (nodes - 1) / nodes
        return self.calls * self.size * (world - 1) / world


def network(
    cfg: Config, sh: Shapes, gpus: int, trainer: str, wl: Workload | None
) -> list[Collective]:
    """The collectives of `trainer`'s phases on `gpus` ranks whose size the model sets (none in one
    process). T-GRPO's micro-batch counts are the time model's, from the workload `wl`; SFT's are
    optim.global_batch / ranks / optim.micro_batch."""
    if gpus == 1:
        return []
    b = DTYPE_BYTES[cfg.model.dtype]
    # FSDP2 gathers each rank's padded shard: the full buffer is W x the shard (Shapes.shard)
    padded = gpus * sh.shard(gpus)
    gathers = 2 if cfg.fsdp.reshard_after_forward else 1  # forward, and again in the backward
    params = f"parameters in {cfg.model.dtype}"
    out = []
    if trainer == "tgrpo":
        micro, passes = experience_micro_batches(cfg, gpus, wl)
        out.append(
            Collective("experience", f"{params} (FSDP2)", "all-gather", b * padded, passes * micro)
        )
        micro, updates = update_micro_batches(cfg, gpus, wl)
    else:
        micro = -(-cfg.optim.global_batch // gpus // cfg.optim.micro_batch)
        updates = 1
    syncs = updates if trainer == "tgrpo" and cfg.fsdp.defer_grad_sync else micro
    out += [
        Collective("update", f"{params} (FSDP2)", "all-gather", b * padded, gathers * micro),
        Collective("update", "gradients in float32 (FSDP2)", "reduce-scatter", 4.0 * padded, syncs),
    ]
    if trainer == "tgrpo":
        out.append(Collective("sync", f"{params} (sync_buckets)", "all-gather", b * padded, 1))
    if cfg.data.valid_file:
        loss = validation_micro_batches(cfg, gpus)
        out.append(Collective("validation", f"{params} (FSDP2)", "all-gather", b * padded, loss))
    out.append(
        Collective("checkpoint", "float32 shards (gather_to_rank0)", "gather", 4.0 * padded, 1)
    )
    return out


def check_network_gbps(gbps: float) -> None:
    """ValueError unless `gbps` (--network-gbps) is a positive, finite number of Gbit/s."""
    if not 0 < gbps < float("inf"):
        raise ValueError(f"--network-gbps must be a positive number of Gbit/s, got {gbps}")


def network_seconds(
    collectives: list[Collective], world: int, nodes: int, gbps: float = NETWORK_GBPS
) -> dict[str, float]:
    """Seconds each phase's collectives keep a node's network link busy (per step; validation and
    checkpoint: each), its bytes at `gbps` Gbit/s per direction, line rate. ValueError unless gbps
    is a positive number."""
    check_network_gbps(gbps)
    rate = gbps * 1e9 / 8  # bytes per second
    out: dict[str, float] = {}
    for c in collectives:
        out[c.phase] = out.get(c.phase, 0.0) + c.node_bytes(world, nodes) / rate
    return out
