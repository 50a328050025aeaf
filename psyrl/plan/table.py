"""The plan as `psyrl plan` prints it: one table of GiB per GPU by part for each phase, the vLLM
pool, host RAM per node, each phase's verdict with its fix, the suggested gpu_memory_utilization,
and the assumptions stated under it all."""

from __future__ import annotations

from psyrl.plan.phases import (
    CUDA_CONTEXT_GIB,
    GIB,
    HOST_BASELINE_GIB,
    PARTS,
    VLLM_GRAPHS_GIB,
    VLLM_STEP_TOKENS,
)
from psyrl.plan.planner import SUGGEST_MARGIN_GIB, Plan

# a phase above this fraction of the GPU fits, but is marked "tight" (allocator fragmentation)
TIGHT = 0.95

ASSUMPTIONS = (
    "every sequence at its maximum length and every micro-batch padded (sdpa gets a mask); CUDA "
    f"context and NCCL {CUDA_CONTEXT_GIB:g} GiB per process; {HOST_BASELINE_GIB:g} GiB of host RAM "
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
    head = ["GiB per GPU", *PARTS, "total", "fits?", "peak at"]
    rows = []
    for ph in p.phases:
        fits = "NO" if not ph.fits else "tight" if ph.total > TIGHT * ph.capacity else "yes"
        rows.append([ph.name, *(g(ph.parts[k]) for k in PARTS), g(ph.total), fits, ph.peak_at])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "  ".join(
        c.ljust(w) if i in (0, len(r) - 1) else c.rjust(w)
        for i, (c, w) in enumerate(zip(r, widths))
    ).rstrip()
    size = f"{p.parameters / 1e9:.2f}B" if p.parameters >= 1e9 else f"{p.parameters / 1e6:.1f}M"
    out = [
        f"{size} parameters on {p.gpus} x {p.gpu_memory_gib:g} GiB GPUs (one node)",
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
    if p.suggested_utilization is not None:
        out.append(
            f"suggested sampler.gpu_memory_utilization: {p.suggested_utilization:.2f} (the rollout "
            f"fits with {SUGGEST_MARGIN_GIB:g} GiB to spare and the KV cache holds a max_model_len "
            "sequence)"
        )
    elif p.suggestion_note:
        out.append(f"suggested sampler.gpu_memory_utilization: none: {p.suggestion_note}")
    if p.gpus > 1:
        out.append(
            f"fsdp.defer_grad_sync = true: +{g(p.defer_grad_sync_bytes)} GiB per GPU in the update "
            "(float32 unsharded gradients of every parameter)"
        )
    out += ["", f"host RAM per node ({p.gpus} ranks)      GiB"]
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
    out += ["", p.verdict(), "", "assumptions: " + ASSUMPTIONS]
    return "\n".join(out)
