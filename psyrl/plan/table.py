"""The plan as `psyrl plan` prints it: one table of GiB per GPU by part for each phase, the vLLM
pool, host RAM per node, each phase's verdict with its fix, the suggested gpu_memory_utilization,
and the assumptions stated under it all."""

from __future__ import annotations

from psyrl.plan.host_ram import HOST_BASELINE_GIB
from psyrl.plan.network import NETWORK_GBPS
from psyrl.plan.phases import (
    CUDA_CONTEXT_GIB,
    GIB,
    NCCL_COMM_GIB,
    PARTS,
    VLLM_GRAPHS_GIB,
    VLLM_STEP_TOKENS,
)
from psyrl.plan.planner import KV_MARGIN_GIB, SUGGEST_MARGIN_GIB, Plan
from psyrl.plan.speed import Times

# a phase above this fraction of the GPU fits, but is marked "tight" (allocator fragmentation)
TIGHT = 0.95

ASSUMPTIONS = (
    "every sequence at its maximum length (a micro-batch one unmasked row with model.packing, else "
    "padded, sdpa taking a mask); CUDA "
    f"context and cuBLAS {CUDA_CONTEXT_GIB:g} GiB per process plus {NCCL_COMM_GIB:g} GiB per NCCL "
    f"communicator of several ranks (estimate); {HOST_BASELINE_GIB:g} GiB of host RAM "
    f"per rank; vLLM's CUDA graphs {VLLM_GRAPHS_GIB:g} GiB (kept while it sleeps) and activation "
    f"peak are estimates, its step {VLLM_STEP_TOKENS[False]} tokens ({VLLM_STEP_TOKENS[True]} on a "
    "GPU from 70 GiB); the CUDA caching allocator's fragmentation is not counted (a phase above "
    f"{TIGHT:.0%} is 'tight'); checked on a CPU (a decoder layer's saved bytes exactly, in float32 "
    "and bf16; a forward/backward's peak within 15 % in float32), not on a GPU."
)


def format_plan(p: Plan) -> str:
    """The plan as text: one table (phases x parts, GiB per GPU, total, fits?), the vLLM pool, host
    RAM per node, each phase's verdict with its fix, the suggested gpu_memory_utilization and the
    cost of fsdp.defer_grad_sync."""
    g = lambda x: f"{x / GIB:.2f}"
    head = ["GiB per GPU", *PARTS, "total", "fits?"]
    head += ["seconds" if p.times else "", "peak at"]
    rows = []
    for ph in p.phases:
        fits = "NO" if not ph.fits else "tight" if ph.total > TIGHT * ph.capacity else "yes"
        seconds = _phase_seconds(p.times, ph.name) if p.times else ""
        rows.append(
            [ph.name, *(g(ph.parts[k]) for k in PARTS), g(ph.total), fits, seconds, ph.peak_at]
        )
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(
        c.ljust(w) if i in (0, len(r) - 1) else c.rjust(w)
        for i, (c, w) in enumerate(zip(r, widths))
    ).rstrip()
    size = f"{p.parameters / 1e9:.2f}B" if p.parameters >= 1e9 else f"{p.parameters / 1e6:.1f}M"
    where = (
        f"{p.gpus} x {p.gpu_memory_gib:g} GiB GPUs (one node)"
        if p.nodes == 1
        else f"{p.nodes} nodes x {p.gpus // p.nodes} x {p.gpu_memory_gib:g} GiB GPUs"
    )
    out = [
        f"{size} parameters on {where}",
        f"settings: {p.settings}",
        "",
        line(head),
        *map(line, rows),
        "",
    ]
    if p.pool is not None:
        q = p.pool
        out.append(
            f"vLLM pool per GPU {g(q.pool)} GiB = weights {g(q.weights)} + activation peak "
            f"{g(q.activation)} (estimate) + CUDA graphs {g(q.graphs)} (estimate) + KV cache "
            f"{g(q.kv)} GiB: {max(q.kv, 0) / q.kv_per_token:,.0f} tokens, {q.sequences} sequences "
            f"of {q.max_model_len} tokens at once (sampler.max_num_seqs {q.max_num_seqs}"
            + (
                "; vLLM refuses to start below 1)"
                if q.sequences < 1
                else "; the rest wait)"
                if q.sequences < q.max_num_seqs
                else ")"
            )
        )
    if p.suggested_utilization is not None and p.suggestion_note:
        out.append(
            f"suggested sampler.gpu_memory_utilization: {p.suggested_utilization:.2f} "
            f"({p.suggestion_note})"
        )
    elif p.suggested_utilization is not None:
        out.append(
            f"suggested sampler.gpu_memory_utilization: {p.suggested_utilization:.2f}, the "
            f"smallest whose KV cache holds sampler.max_num_seqs = {p.pool.max_num_seqs} "
            f"sequences of {p.pool.max_model_len} tokens with {KV_MARGIN_GIB:g} GiB to spare (the "
            f"rollout fits with {SUGGEST_MARGIN_GIB:g} GiB free beside it)"
        )
    elif p.suggestion_note:
        out.append(f"suggested sampler.gpu_memory_utilization: none: {p.suggestion_note}")
    if p.gpus > 1:
        out.append(
            f"fsdp.defer_grad_sync = true: +{g(p.defer_grad_sync_bytes)} GiB per GPU in the update "
            "(float32 unsharded gradients of every parameter)"
        )
    ranks = (
        f"{p.gpus} ranks"
        if p.nodes == 1
        else f"{p.gpus // p.nodes} ranks: the first node's, with rank 0"
    )
    out += ["", f"host RAM per node ({ranks})      GiB"]
    width = max(len(k) for k in [*p.host, *p.host_transient])
    out += [f"  {k.ljust(width)}  {g(v):>7}" for k, v in p.host.items()]
    out += [
        f"  {k.ljust(width)}  {g(v):>7}  (transient: the larger one counts)"
        for k, v in p.host_transient.items()
    ]
    verdict = (
        "unknown (pass --host-memory-gib)"
        if p.host_fits is None
        else f"fits {p.host_memory_gib:g} GiB"
        if p.host_fits
        else f"does NOT fit {p.host_memory_gib:g} GiB"
    )
    out += [f"  {'total'.ljust(width)}  {g(p.host_total):>7}  {verdict}", ""]
    if p.nodes > 1:
        out += [*format_network(p), ""]
    for ph in p.phases:
        out.append(
            f"{ph.name}: "
            + (
                f"fits ({ph.total / GIB:.1f} of {p.gpu_memory_gib:g} GiB)"
                if ph.fits
                else f"needs {ph.total / GIB:.1f} of {p.gpu_memory_gib:g} GiB: {ph.fix}"
            )
        )
    if p.host_fits is False:
        out.append(
            f"host RAM: needs {p.host_total / GIB:.1f} of {p.host_memory_gib:g} GiB: {p.host_fix}"
        )
    if not p.kv_fits:
        out.append(next(line for line in p.problems if line.startswith("rollout: the vLLM pool")))
    if p.times:
        out += ["", *format_times(p)]
    elif p.trainer == "sft":
        out += ["", "time: psyrl plan's time model covers T-GRPO steps, not SFT"]
    out += ["", p.verdict(), "", "assumptions: " + ASSUMPTIONS]
    return "\n".join(out)


def format_network(p: Plan) -> list[str]:
    """The collectives over every rank, phase by phase, and what each node sends over the network
    (psyrl.plan.network)."""
    world, nodes = p.gpus, p.nodes
    out = [
        f"network between the {nodes} nodes (NCCL's ring: each node sends (W - 1) / W of a "
        f"collective's buffer, W = {world} ranks, and receives as much)"
    ]
    if not p.network:
        return out + ["  not planned: T-GRPO's micro-batch counts need the time model's workload"]
    gbps = f"{p.network_gbps:g} Gbit/s"
    head = ["phase", "collective", "GiB per call", "calls", "GiB per node", f"s at {gbps}", ""]
    rate = p.network_gbps * 1e9 / 8
    per = {"validation": "each validation", "checkpoint": "each checkpoint, into rank 0's node"}
    rows = [
        [
            c.phase,
            f"{c.op} of the {c.what}",
            f"{c.size / GIB:.2f}",
            f"{c.calls:,g}",
            f"{c.node_bytes(world, nodes) / GIB:,.2f}",
            f"{c.node_bytes(world, nodes) / rate:,.1f}",
            per.get(c.phase, "per step"),
        ]
        for c in p.network
    ]
    step = sum(c.node_bytes(world, nodes) for c in p.network if c.phase not in per)
    rows.append(
        ["step", "", "", "", f"{step / GIB:,.2f}", f"{step / rate:,.1f}", "per step, in all"]
    )
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    out += [
        "  "
        + "  ".join(
            c.ljust(w) if i in (0, 1, 6) else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))
        ).rstrip()
        for r in [head, *rows]
    ]
    out.append(
        "  inside a node: the vLLM engine's tensor-parallel all-reduces and the hand-over of the "
        "gathered weights into it; not counted (sized by text or a few scalars): the prompts, "
        "scored samples and validation outputs (all_gather_object), the micro-batch counts, "
        "gradient norm and metrics (all-reduces); once a run: rank 0's weights broadcast at "
        "start-up"
    )
    out.append(
        f"  seconds: each node's bytes at {gbps} per direction (--network-gbps, default "
        f"{NETWORK_GBPS:g}: 25 GbE), line rate with one link per node, so a lower bound"
    )
    if p.times:
        out += format_network_bound(p)
    return out


def format_network_bound(p: Plan) -> list[str]:
    """Whether the network or the compute bounds each phase whose collectives FSDP2 overlaps with
    its compute, and so the step (a ring runs at its slowest link: the time model takes the
    network's seconds where they exceed the GPU-to-GPU link's)."""
    out = []
    for phase in ("experience", "update"):
        net, compute = p.network_seconds.get(phase, 0.0), p.compute_seconds[phase]
        bound = "the network bounds it" if p.network_bound(phase) else "compute bounds it"
        out.append(
            f"  {phase}: {net:,.1f} s of network against {compute:,.1f} s of compute "
            f"({net / compute:.2f}x): {bound}"
        )
    bound = [ph for ph in ("experience", "update") if p.network_bound(ph)]
    out.append(
        f"  the network bounds the step (in the {' and the '.join(bound)}): predicted "
        f"{p.times.step_total:,.1f} s at {p.network_gbps:g} Gbit/s"
        if bound
        else f"  compute bounds the step; predicted {p.times.step_total:,.1f} s at "
        f"{p.network_gbps:g} Gbit/s (the sync's all-gather is not hidden: "
        f"{p.network_seconds.get('sync', 0.0):,.1f} s)"
    )
    return out


def _phase_seconds(t: Times, name: str) -> str:
    if name in t.step:
        return f"{t.step[name]:,.1f}/step"
    if name == "validation":
        return f"{t.validation:,.1f} each"
    if name == "checkpoint":
        return f"{t.checkpoint:,.1f} each"
    return ""


def _duration(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.2f} s"


def format_times(p: Plan) -> list[str]:
    """The predicted step and run, the alternatives, and what the prediction rests on."""
    t, wl, dev = p.times, p.workload, p.device
    out = [
        f"predicted step on {p.gpus} x {dev.name} ({_duration(t.step_total)}): "
        + ", ".join(f"{k} {v:,.1f} s" for k, v in t.step.items())
        + " (offload: the moves there and back, not in the table)",
        f"predicted run: {t.steps} steps x {t.step_total:,.1f} s + {t.validations} validations x "
        f"{t.validation:,.1f} s + {t.checkpoints} checkpoints x {t.checkpoint:,.1f} s = "
        f"{_duration(t.run_total)}",
        f"tokens: prompts {wl.prompt_mean:,.0f} on average ({wl.source}), responses "
        f"{wl.response_mean:,.0f} on average (--response-tokens)",
    ]
    if p.alternatives:
        out += ["", "alternatives (issue 29 item 6; the config's own choice marked *):"]
        width = max(len(a.setting) for a in p.alternatives)
        for a in p.alternatives:
            out.append(
                f"  {'*' if a.current else ' '} {a.setting.ljust(width)}  {a.phase} "
                f"{a.gib:5.1f} GiB{'' if a.fits else ' (does NOT fit)'}, {a.seconds:,.1f} s; step "
                f"{a.step_seconds:,.1f} s ({a.detail})"
            )
    out += [
        "",
        "time assumptions: " + dev.assumptions() + ". " + " ".join(t.notes) + ".",
    ]
    return out
