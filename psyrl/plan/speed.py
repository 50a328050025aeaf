"""`psyrl plan`'s step-time model: predicted seconds per phase of a T-GRPO step (rollout,
experience, update, offload moves, weight sync) and per validation and checkpoint, from the run
config, the architecture, the tokens a step processes and a device (psyrl/plan/devices.py).

Each phase is one function that reads like its formula (a roofline: FLOPs over FLOP/s, bytes over
bandwidth, at the utilisation the device table assumes; the only figure set from measurement is
devices.CPU_UTIL, for `--device cpu`):

  * rollout: prefill compute-bound, 2 N tokens + attention FLOPs; decode memory-bound, one decode
    step reads the weights and every running sequence's KV cache (vLLM: max of that and its
    compute, on the GPU; psyrl's torch sampler on a CPU: the compute, the KV cache re-copied by
    transformers' DynamicCache, and the eager framework's per-operation cost, in sequence);
  * experience: compute-bound forwards (the reference's, and pi_old's for every mini-batch after the
    first), 2 N tokens + attention, the LM head over the response tokens only;
  * update: compute-bound, 6 N tokens forward and backward (8 N with gradient checkpointing, which
    recomputes the forward) + attention, each micro-batch also all-gathering the bf16 parameters
    twice and reduce-scattering float32 gradients over the GPU-to-GPU link (FSDP2 overlaps them with
    the compute: the larger counts), then AdamW reading and writing its shards at memory bandwidth;
  * offload: the actor's float32 shards and AdamW state over the host link, there and back;
  * sync: bf16 all-gather of the weights over the GPU-to-GPU link, vLLM waking its weights over the
    host link and loading them at memory bandwidth;
  * validation: generation of data.valid_items responses and a loss pass; checkpoint: rank 0
    gathers the float32 state and writes it (and the export) to disk.

Not modelled: the reward (`score`: pure Python over the responses, microseconds each), the step's
bookkeeping (metrics, logging), the CUDA caching allocator and start-up. N counts the matrices a
token meets: the decoder layers and the LM head (not the embedding lookup).

Torch-free at import: only `--device cpu` imports torch, to measure this machine
(`devices.measure_cpu`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from psyrl.core.config import Config
from psyrl.plan.devices import GB, Device

if TYPE_CHECKING:  # architecture.py reads config.json through transformers, which imports torch
    from psyrl.plan.architecture import Shapes

DTYPE_BYTES = {"float32": 4, "bfloat16": 2}

# Top-level torch operations of one decoder layer of transformers' Qwen2 (counted with
# torch.profiler on transformers 5.19, a decode step of 1 and 3 layers: 84 and 192, so 54 a layer),
# and those psyrl's torch sampler adds per decode step (psyrl/runtime/sampler.py _generate_rows and
# draw: softmax, draw, gather, log, isin, cat, ..., about 20) besides one uniform per row, drawn
# from the row's own generator. They turn `Device.layer_overhead` into a cost per operation.
OPS_PER_LAYER = 54
SAMPLER_OPS_PER_STEP = 20

# assumption: vLLM's CPU-side cost of one decode step (scheduler, sampler, CUDA-graph launch), which
# a large batch hides only partly
VLLM_STEP_OVERHEAD_S = 0.004
# assumption: checkpoint files are written at this rate (a local NVMe disk, page cache absorbing
# part)
DISK_BYTES_PER_S = 1.0 * GB


# ---------------------------------------------------------------- the tokens of a step
@dataclass(frozen=True)
class Workload:
    """The tokens a step processes."""

    prompt_mean: float
    """Mean prompt tokens."""
    prompt_lengths: tuple[int, ...]
    """Every training prompt's tokens (those that fit rollout.max_prompt_tokens), or the maximum
    alone."""
    response_mean: float
    """Mean response tokens (--response-tokens)."""
    source: str

    def longest_of(self, k: float) -> float:
        """Expected longest of k prompts drawn from the data (order statistics): a padded batch's
        width."""
        lengths = sorted(self.prompt_lengths)
        n, k = len(lengths), max(k, 1)
        return sum(L * ((i / n) ** k - ((i - 1) / n) ** k) for i, L in enumerate(lengths, 1))


def default_response_tokens(cfg: Config) -> float:
    """--response-tokens' default: half of rollout.max_new_tokens (an assumption)."""
    return cfg.rollout.max_new_tokens / 2


def workload(
    cfg: Config,
    response_tokens: float | None = None,
    tokenizer=None,
    prompt_tokens: float | None = None,
) -> Workload:
    """The prompt lengths: `prompt_tokens` (--prompt-tokens, a mean) when given; else those of
    data.train_file rendered as the trainer renders them (prompts longer than
    rollout.max_prompt_tokens dropped, as the trainer drops them) when the file exists and a
    tokenizer is given; else rollout.max_prompt_tokens. The mean response: --response-tokens
    (default: half of rollout.max_new_tokens)."""
    from pathlib import Path

    response = default_response_tokens(cfg) if response_tokens is None else response_tokens
    response = min(response, cfg.rollout.max_new_tokens)
    maximum = cfg.rollout.max_prompt_tokens
    if prompt_tokens is not None:
        mean = min(prompt_tokens, maximum)
        return Workload(mean, (round(mean),), response, "--prompt-tokens")
    path = Path(cfg.data.train_file) if cfg.data.train_file else None
    if tokenizer is not None and path is not None and path.is_file():
        from psyrl.core import prompts
        from psyrl.core.records import load_stimuliqa

        lengths = [len(prompts.prompt_ids(tokenizer, r, cfg.prompt)) for r in load_stimuliqa(path)]
        kept = tuple(n for n in lengths if n <= maximum)
        if kept:
            return Workload(sum(kept) / len(kept), kept, response, f"{len(kept)} prompts of {path}")
    return Workload(maximum, (maximum,), response, "rollout.max_prompt_tokens (no data read)")


# ---------------------------------------------------------------- the formulas
def matmul_params(sh: Shapes) -> int:
    """The weights a token is multiplied by: every decoder layer and the LM head."""
    return sh.layers * sh.layer_params + sh.vocab * sh.hidden


def attention_flops(sh: Shapes, query: float, context: float) -> float:
    """QK^T and AV of `query` tokens against `context` keys, every layer: 2 x 2 x heads x head_dim
    multiply-adds per pair."""
    return 4 * sh.layers * sh.heads * sh.head_dim * query * context


def kv_bytes_per_token(sh: Shapes, b: int, tp: int = 1) -> float:
    """K and V of every layer, one token, per TP rank."""
    return 2 * sh.layers * max(1, sh.kv_heads // tp) * sh.head_dim * b


def forward_seconds(sh: Shapes, dev: Device, tokens: float, attention: float) -> float:
    """A compute-bound forward: 2 N per token + the attention FLOPs, at mfu."""
    return (2 * matmul_params(sh) * tokens + attention) / (dev.flops * dev.mfu)


# passes over the [scored tokens, vocabulary] float32 logits of psyrl's chunked LM head
# (psyrl/runtime/model.py HeadLogprobs): forward writes them and logsumexp reads them (max, sum of
# exp); backward writes them again, subtracts, exponentiates and scales them in place (a read and a
# write each) and reads them for the two gradient products
HEAD_PASSES = {"forward": 3, "backward": 9}


def head_traffic_seconds(sh: Shapes, dev: Device, scored: float, backward: bool) -> float:
    """The LM head's log-softmax over the vocabulary: memory-bound passes over [scored, V] float32
    (HEAD_PASSES)."""
    passes = HEAD_PASSES["forward"] + (HEAD_PASSES["backward"] if backward else 0)
    return passes * scored * sh.vocab * 4 / (dev.memory_bw * dev.bw_util)


def logprob_forward_seconds(
    sh: Shapes, dev: Device, tokens: float, scored: float, attention: float
) -> float:
    """A log-prob forward (psyrl/runtime/model.py token_logprobs): the decoder layers over every
    token, the LM head over the scored targets only (the response tokens), + the attention."""
    decoder = 2 * sh.layers * sh.layer_params * tokens
    head = 2 * sh.vocab * sh.hidden * scored
    return (decoder + head + attention) / (dev.flops * dev.mfu)


def _seq_attention(sh: Shapes, length: float, causal: bool) -> float:
    """Attention FLOPs of one sequence's forward: the causal half on a GPU (FlashAttention skips
    the masked half), the full square on a CPU (sdpa's masked math kernel)."""
    return attention_flops(sh, length, length) * (0.5 if causal else 1.0)


@dataclass
class Times:
    """Predicted seconds: per step by phase, per validation and per checkpoint, with the run's
    total."""

    step: dict[str, float]
    validation: float
    checkpoint: float
    steps: int
    validations: int
    checkpoints: int
    notes: list[str]

    @property
    def step_total(self) -> float:
        return sum(self.step.values())

    @property
    def run_total(self) -> float:
        return (
            self.steps * self.step_total
            + self.validations * self.validation
            + self.checkpoints * self.checkpoint
        )


def rollout_seconds(cfg: Config, sh: Shapes, gpus: int, dev: Device, wl: Workload) -> float:
    """Generation of every response of the step on this rank (vLLM: this TP group's engine)."""
    G = cfg.rollout.samples
    sequences = cfg.rollout.prompts * G / gpus  # this rank's
    if cfg.sampler.engine == "vllm":
        return vllm_generation_seconds(cfg, sh, gpus, dev, wl, sequences)
    return torch_generation_seconds(cfg, sh, dev, wl, sequences, G)


def vllm_generation_seconds(
    cfg: Config, sh: Shapes, gpus: int, dev: Device, wl: Workload, sequences: float
) -> float:
    """A vLLM engine of TP ranks generating `sequences` per rank (the TP group's prompts together,
    each rank computing its 1/TP of every matrix): prefill compute-bound, once per prompt; each
    decode step reads the
    weights and the running sequences' KV cache (memory-bound) or computes (whichever is slower)
    plus VLLM_STEP_OVERHEAD_S; continuous batching keeps max_num_seqs running, the decode takes the
    steps of all tokens over the running batch but at least max_new_tokens (the longest response
    of the step, assumed to reach the limit); TP adds two all-reduces of the hidden state per layer
    and step over the GPU-to-GPU link. Sleep after it: the weights to the host."""
    tp = cfg.sampler.tensor_parallel
    b = DTYPE_BYTES[cfg.model.dtype]
    group = sequences * tp  # the engine's sequences
    # a prompt's G samples share its prefill (SamplingParams(n=G), and vLLM's prefix cache is on by
    # default: vllm/config/cache.py:141 enable_prefix_caching = True)
    prompts = group / cfg.rollout.samples
    prefill = (
        2 * matmul_params(sh) * prompts * wl.prompt_mean
        + prompts * _seq_attention(sh, wl.prompt_mean, True)
    ) / tp / (dev.flops * dev.mfu)  # fmt: skip
    running = min(cfg.sampler.max_num_seqs, group)
    decode_steps = max(group * wl.response_mean / running, cfg.rollout.max_new_tokens)
    context = wl.prompt_mean + wl.response_mean / 2  # mean context over a response
    read = b * matmul_params(sh) / tp + running * context * kv_bytes_per_token(sh, b, tp)
    compute = (2 * matmul_params(sh) + attention_flops(sh, 1, context)) * running / tp
    tp_comm = (
        2 * sh.layers * 2 * (tp - 1) / tp * running * sh.hidden * b / (dev.peer * dev.link_util)
        if tp > 1
        else 0.0
    )
    step = (
        max(read / (dev.memory_bw * dev.bw_util), compute / (dev.flops * dev.mfu))
        + tp_comm
        + VLLM_STEP_OVERHEAD_S
    )
    sleep = (
        (b * matmul_params(sh) / tp) / (dev.host_link * dev.link_util) if cfg.sampler.sleep else 0
    )
    return prefill + decode_steps * step + sleep


def torch_generation_seconds(
    cfg: Config, sh: Shapes, dev: Device, wl: Workload, sequences: float, G: int
) -> float:
    """psyrl's torch sampler: calls of sampler.batch rows (whole prompts), each left-padded to its
    longest prompt, prefilled, then decoded max_new_tokens steps (until the longest response ends:
    assumed to reach the limit). A decode step's cost, in sequence on a CPU: its matmuls; the
    KV-cache traffic of every layer, memory-bound: transformers' DynamicCache concatenating the new
    K and V (reads and writes the cache), and, since the padding mask rules out sdpa's own GQA
    (transformers integrations/sdpa_attention.py `use_gqa_in_sdpa`), `repeat_kv` expanding K and V
    to every query head (reads the cache, writes heads/kv_heads times it), which sdpa then reads:
    (3 + 2 g) x the cache, g = heads / kv_heads; and the eager framework's per-operation cost."""
    b = DTYPE_BYTES[cfg.model.dtype]
    per_call = max(1, cfg.sampler.batch // G)
    calls = math.ceil(sequences / G / per_call)
    rows = min(per_call * G, sequences)
    width = wl.longest_of(per_call)
    steps = cfg.rollout.max_new_tokens
    g = sh.heads / sh.kv_heads
    prefill = forward_seconds(sh, dev, rows * width, rows * _seq_attention(sh, width, False))
    prefill += _eager_seconds(sh, dev)
    decode = 0.0
    for t in range(steps):
        context = width + t
        compute = 2 * matmul_params(sh) * rows
        traffic = (3 + 2 * g) * rows * context * kv_bytes_per_token(sh, b)
        decode += (
            compute / (dev.flops * dev.mfu)
            + traffic / (dev.memory_bw * dev.bw_util)
            + _eager_seconds(sh, dev)
            + (SAMPLER_OPS_PER_STEP + rows) * dev.layer_overhead / OPS_PER_LAYER
        )
    return calls * (prefill + decode)


def _eager_seconds(sh: Shapes, dev: Device, passes: float = 1.0) -> float:
    """The eager framework's overhead of one model call (`passes`: forward, backward, recompute)."""
    return passes * (sh.layers * dev.layer_overhead + dev.call_overhead)


def _micro_batches(rows: float, budget: int, per_batch: int, length: float) -> float:
    """Micro-batches of `rows` sequences of `length` mean tokens: a token budget packs
    budget / length rows in one, else `per_batch` rows."""
    if budget > 0:
        return max(1.0, math.ceil(rows * length / budget))
    return max(1.0, math.ceil(rows / per_batch))


def _tokens(
    cfg: Config, sh: Shapes, wl: Workload, rows: float, micro: float
) -> tuple[float, float]:
    """(tokens computed, attention FLOPs) of `rows` sequences in `micro` micro-batches: real tokens
    when model.packing, else each micro-batch padded to its longest prompt + response (assumed the
    longest possible response)."""
    length = wl.prompt_mean + wl.response_mean
    if getattr(cfg.model, "packing", False):
        return rows * length, rows * _seq_attention(sh, length, False)
    per = rows / micro
    width = wl.longest_of(per) + min(cfg.rollout.max_new_tokens, max(wl.response_mean, 1))
    return rows * width, rows * _seq_attention(sh, width, False)


def experience_micro_batches(cfg: Config, gpus: int, wl: Workload) -> tuple[float, float]:
    """(micro-batches of one pass, passes) of the experience on one rank per step: this rank's
    sequences in micro-batches of optim.logprob_micro_batch(_tokens), once for the reference model
    (loss.kl_coef > 0) and, for pi_old, once over the mini-batches after the first (the first's is
    the update's own)."""
    rows = cfg.rollout.prompts * cfg.rollout.samples / gpus
    updates = max(1, cfg.rollout.prompts // cfg.optim.global_batch)
    passes = (1.0 if cfg.loss.kl_coef > 0 else 0.0) + (updates - 1) / updates
    length = wl.prompt_mean + wl.response_mean
    micro = _micro_batches(
        rows, cfg.optim.logprob_micro_batch_tokens, cfg.optim.logprob_micro_batch, length
    )
    return micro, passes


def update_micro_batches(cfg: Config, gpus: int, wl: Workload) -> tuple[float, int]:
    """(micro-batches, mini-batches) of the update on one rank per step: one mini-batch (optimiser
    step) per optim.global_batch prompts, each in micro-batches of optim.micro_batch(_tokens)."""
    rows = cfg.rollout.prompts * cfg.rollout.samples / gpus
    updates = max(1, cfg.rollout.prompts // cfg.optim.global_batch)
    length = wl.prompt_mean + wl.response_mean
    micro = updates * _micro_batches(
        rows / updates, cfg.optim.micro_batch_tokens, cfg.optim.micro_batch, length
    )
    return micro, updates


def validation_items(cfg: Config) -> int:
    """Held-out prompts of one validation: data.valid_items (0: assumed 1,024, A.3's validation
    batch)."""
    return cfg.data.valid_items or 1024


def validation_micro_batches(cfg: Config, gpus: int) -> float:
    """Micro-batches of one validation's loss pass on one rank: its share of the held-out items in
    micro-batches of optim.logprob_micro_batch rows."""
    return max(1.0, math.ceil(validation_items(cfg) / gpus / cfg.optim.logprob_micro_batch))


def experience_parts(cfg: Config, sh: Shapes, gpus: int, dev: Device, wl: Workload) -> dict:
    """The experience's terms over all its passes (`experience_seconds`): compute, the all-gathers
    over the GPU-to-GPU link, and the eager overhead."""
    rows = cfg.rollout.prompts * cfg.rollout.samples / gpus
    micro, passes = experience_micro_batches(cfg, gpus, wl)
    tokens, attention = _tokens(cfg, sh, wl, rows, micro)
    scored = rows * wl.response_mean
    compute = logprob_forward_seconds(sh, dev, tokens, scored, attention * _causal(dev))
    compute += head_traffic_seconds(sh, dev, scored, backward=False)
    b = DTYPE_BYTES[cfg.model.dtype]
    return {
        "compute": passes * compute,
        "collectives": passes * (micro * _all_gather_seconds(sh, gpus, dev, b)),
        "overhead": passes * (micro * _eager_seconds(sh, dev)),
    }


def experience_seconds(
    cfg: Config, sh: Shapes, gpus: int, dev: Device, wl: Workload, network: float = 0.0
) -> float:
    """Gradient-free forwards over this rank's sequences: the reference model's (loss.kl_coef > 0)
    and pi_old's of every mini-batch after the first (the first's is the update's own), in
    micro-batches of optim.logprob_micro_batch(_tokens); FSDP2 all-gathers the bf16 weights once per
    micro-batch, overlapped with the compute. `network`: the seconds those all-gathers take on the
    network between nodes (psyrl.plan.network): a ring runs at its slowest link."""
    e = experience_parts(cfg, sh, gpus, dev, wl)
    return max(e["compute"], e["collectives"], network) + e["overhead"]


def _causal(dev: Device) -> float:
    return 1.0 if dev.name == "cpu" else 0.5


def _all_gather_seconds(sh: Shapes, gpus: int, dev: Device, b: int) -> float:
    """One all-gather of every parameter in dtype bytes b over the GPU-to-GPU link (ring: each rank
    receives (W - 1) / W of it)."""
    if gpus == 1:
        return 0.0
    return b * sh.shard(gpus) * (gpus - 1) / (dev.peer * dev.link_util)


def update_parts(
    cfg: Config, sh: Shapes, gpus: int, dev: Device, wl: Workload, network: float = 0.0
) -> dict:
    """The update's terms (`update_seconds`): micro-batches per rank, compute, collectives (over the
    GPU-to-GPU link, or `network`'s seconds between nodes when slower: a ring runs at its slowest
    link), eager overhead and AdamW seconds."""
    rows = cfg.rollout.prompts * cfg.rollout.samples / gpus
    micro, updates = update_micro_batches(cfg, gpus, wl)
    tokens, attention = _tokens(cfg, sh, wl, rows, micro)
    passes = 4 if cfg.model.gradient_checkpointing else 3  # forward + backward (2) + recompute
    b = DTYPE_BYTES[cfg.model.dtype]
    return {
        "micro-batches": micro,
        "compute": passes
        * logprob_forward_seconds(
            sh, dev, tokens, rows * wl.response_mean, attention * _causal(dev)
        )
        + head_traffic_seconds(sh, dev, rows * wl.response_mean, backward=True),
        "collectives": max(
            micro
            * (2 * _all_gather_seconds(sh, gpus, dev, b) + _all_gather_seconds(sh, gpus, dev, 4)),
            network,
        ),
        "overhead": micro * _eager_seconds(sh, dev, passes),
        "adamw": updates * 28 * sh.shard(gpus) / (dev.memory_bw * dev.bw_util),
    }


def update_seconds(
    cfg: Config, sh: Shapes, gpus: int, dev: Device, wl: Workload, network: float = 0.0
) -> float:
    """Forward and backward over this rank's sequences: 6 N per token + 3 x the attention (8 N and
    4 x with gradient checkpointing, which recomputes each layer's forward); per micro-batch FSDP2
    all-gathers the weights twice (forward, and backward after the reshard) in bf16 and
    reduce-scatters float32 gradients, overlapped with the compute (the larger counts: a larger
    token budget, fewer micro-batches, only shows when the collectives are the larger); then one
    AdamW step per mini-batch over the float32 shard (reads parameter, gradient and two moments,
    writes three: 28 B per parameter at memory bandwidth). `network`: the collectives' seconds
    between nodes."""
    u = update_parts(cfg, sh, gpus, dev, wl, network)
    return max(u["compute"], u["collectives"]) + u["overhead"] + u["adamw"]


def offload_seconds(cfg: Config, sh: Shapes, gpus: int, dev: Device) -> float:
    """fsdp.offload = "phase": the float32 shard and AdamW's two moments (12 B per parameter of
    the shard) to the host after the update and back before the experience, over the host link."""
    if cfg.fsdp.offload != "phase" or gpus == 1 or dev.name == "cpu":
        return 0.0
    return 2 * 12 * sh.shard(gpus) / (dev.host_link * dev.link_util)


def sync_seconds(cfg: Config, sh: Shapes, gpus: int, dev: Device, network: float = 0.0) -> float:
    """Weight sync: the bf16 weights all-gathered in buckets over the GPU-to-GPU link (or
    `network`'s seconds between nodes, when slower), the engine's weights woken from the host (vLLM
    sleep level 1) over the host link, every tensor loaded into the engine (read and written at
    memory bandwidth)."""
    b = DTYPE_BYTES[cfg.model.dtype]
    full = b * sh.params
    tp = cfg.sampler.tensor_parallel if cfg.sampler.engine == "vllm" else 1
    wake = (
        full / tp / (dev.host_link * dev.link_util)
        if cfg.sampler.engine == "vllm" and cfg.sampler.sleep
        else 0.0
    )
    load = 2 * full / (dev.memory_bw * dev.bw_util)
    return max(_all_gather_seconds(sh, gpus, dev, b), network) + wake + load


def validation_seconds(
    cfg: Config, sh: Shapes, gpus: int, dev: Device, wl: Workload, network: float = 0.0
) -> float:
    """One validation: a response to each of data.valid_items held-out prompts (0: assumed 1,024,
    A.3's validation batch) at this rank's share, then the gradient-free loss pass over them (its
    all-gathers overlapped with it, counted only as `network`'s seconds between nodes)."""
    if not cfg.data.valid_file:
        return 0.0
    items = validation_items(cfg)
    one = replace(cfg.rollout, prompts=items, samples=1)
    trial = _with_rollout(cfg, one)
    generate = rollout_seconds(trial, sh, gpus, dev, wl)
    rows = items / gpus
    micro = validation_micro_batches(cfg, gpus)
    tokens, attention = _tokens(cfg, sh, wl, rows, micro)
    scored = rows * wl.response_mean
    return generate + max(
        logprob_forward_seconds(sh, dev, tokens, scored, attention * _causal(dev)), network
    )


def _with_rollout(cfg: Config, rollout) -> Config:
    import copy

    new = copy.copy(cfg)
    new.rollout = rollout
    return new


def checkpoint_seconds(
    cfg: Config, sh: Shapes, gpus: int, dev: Device, network: float = 0.0
) -> float:
    """One checkpoint: rank 0 gathers the float32 parameters over the GPU-to-GPU link (or
    `network`'s seconds into its node, when slower), then writes the state (float32 parameters and
    AdamW's two moments) and the export in checkpoint.export_dtype at DISK_BYTES_PER_S."""
    gather = 4 * sh.params * (gpus - 1) / gpus / (dev.peer * dev.link_util) if gpus > 1 else 0.0
    gather = max(gather, network)
    written = (12 + DTYPE_BYTES[cfg.checkpoint.export_dtype]) * sh.params
    return gather + written / DISK_BYTES_PER_S


def step_times(
    cfg: Config,
    sh: Shapes,
    gpus: int,
    dev: Device,
    wl: Workload,
    network: dict[str, float] | None = None,
) -> Times:
    """Every phase's predicted seconds for a T-GRPO step of `cfg` on `gpus` devices, and the run's
    total (validations every checkpoint.every steps and at the start, checkpoints every
    checkpoint.every steps). `network`: on several nodes, each phase's seconds of collectives on
    the network between them (psyrl.plan.network `network_seconds`); a collective runs at its
    ring's slowest link, the network or the GPU-to-GPU one."""
    net = network or {}
    step = {
        "rollout": rollout_seconds(cfg, sh, gpus, dev, wl),
        "experience": experience_seconds(cfg, sh, gpus, dev, wl, net.get("experience", 0.0)),
        "update": update_seconds(cfg, sh, gpus, dev, wl, net.get("update", 0.0)),
        "offload": offload_seconds(cfg, sh, gpus, dev),
        "sync": sync_seconds(cfg, sh, gpus, dev, net.get("sync", 0.0)),
    }
    steps = cfg.run.steps
    every = cfg.checkpoint.every
    checkpoints = steps // every if every else 0
    validations = (checkpoints + 1) if cfg.data.valid_file else 0
    notes = [
        "not modelled: score (the reward, pure Python over the responses), the step's logging, "
        "start-up and the final export"
    ]
    return Times(
        step,
        validation_seconds(cfg, sh, gpus, dev, wl, net.get("validation", 0.0)),
        checkpoint_seconds(cfg, sh, gpus, dev, net.get("checkpoint", 0.0)),
        steps,
        validations,
        checkpoints,
        notes,
    )
