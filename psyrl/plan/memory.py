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
FSDP2) or an assumption, stated. What is measured (tests/plan/test_memory_plan.py): the parameter
counts (transformers on the meta device), the FSDP2 shard, gradient and AdamW bytes per rank (2 gloo
ranks), a decoder layer's saved bytes (exact, in float32 and bf16) and the activation and log-prob
peak of one forward/backward on a CPU in float32 (within 15 %). What is not: anything on a GPU (the
CUDA allocator's fragmentation, sdpa's GPU kernels, vLLM's own figures are estimates).
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from transformers import AutoConfig

from psyrl.runtime.model import LOGPROB_CHUNK, load_tokenizer, model_config

GIB = 2**30
MIB = 2**20
DTYPE_BYTES = {"float32": 4, "bfloat16": 2}
CUDA_CONTEXT_GIB = 0.6  # assumption: CUDA context, cuBLAS workspace and NCCL buffers of one process
HOST_BASELINE_GIB = 3.0  # assumption: Python, torch and the CUDA libraries of one rank in host RAM
# estimate: vLLM's CUDA graphs (0.5-1 GiB is usual; the upper end taken); kept while asleep
VLLM_GRAPHS_GIB = 1.0
# vLLM's default max_num_batched_tokens for LLM(...): GPUs under / from 70 GiB
# (EngineArgs.get_batch_defaults; an A100 80 GB gets 8192)
VLLM_STEP_TOKENS = {False: 8192, True: 16384}
# left free beside the pool in the rollout: allocator fragmentation, NCCL buffers made late
SUGGEST_MARGIN_GIB = 2.0
# a phase above this fraction of the GPU fits, but is marked "tight" (allocator fragmentation)
TIGHT = 0.95
# Qwen2.5-{0.5B,1.5B,3B}-Instruct in a path
SHIPPED = re.compile(r"qwen2\.5-(0\.5|1\.5|3)b", re.IGNORECASE)
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
OFFLOADS = ("none", "phase", "always")


# ---------------------------------------------------------------- architecture
def shipped_architecture_dir(path: str) -> Path | None:
    """The shipped config.json directory of the Qwen2.5-Instruct size named anywhere in `path`, or
    None."""
    match = SHIPPED.search(path)
    if match is None:
        return None
    return Path(
        str(resources.files("psyrl") / "assets" / "models" / f"qwen2.5-{match.group(1)}b-instruct")
    )


def load_architecture(model_cfg) -> tuple[object, str]:
    """(PretrainedConfig, where it came from) for a [model] table: model.path's config.json; else
    the shipped copy whose size the path names (Qwen2.5-0.5B/1.5B/3B-Instruct, any case); else, with
    an empty path, the tiny model of the table. ValueError naming the path otherwise."""
    if not model_cfg.path:
        return model_config(model_cfg, load_tokenizer(model_cfg)), "the tiny model of [model]"
    directory = Path(model_cfg.path).expanduser()
    if (directory / "config.json").is_file():
        return AutoConfig.from_pretrained(str(directory)), str(directory / "config.json")
    shipped = shipped_architecture_dir(model_cfg.path)
    if shipped is None:
        raise ValueError(
            f"model.path = {model_cfg.path!r}: no config.json there, and the path names none of "
            "the architectures psyrl ships (Qwen2.5-0.5B/1.5B/3B-Instruct); point model.path at a "
            "Hugging Face model directory"
        )
    return AutoConfig.from_pretrained(str(shipped)), f"psyrl's copy of {shipped.name}/config.json"


@dataclass(frozen=True)
class Shapes:
    """A Qwen2 causal LM as parameter shapes: one decoder layer's, and the root unit's (embedding,
    final norm and, when untied, the LM head), in the order FSDP2 shards them."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool
    layer: tuple[tuple[int, ...], ...]
    root: tuple[tuple[int, ...], ...]

    @property
    def layer_params(self) -> int:
        return sum(math.prod(s) for s in self.layer)

    @property
    def root_params(self) -> int:
        return sum(math.prod(s) for s in self.root)

    @property
    def params(self) -> int:
        return self.layers * self.layer_params + self.root_params

    def shard(self, world: int, unit: str = "all") -> int:
        """Elements of one rank's FSDP2 shard: each parameter's dim 0 is padded to a multiple of
        `world` and split, ceil(dim0 / world) x rest on every rank (FSDP2 `_init_sharded_param`:
        chunks[0] is the padded size). Rank 0 holds exactly this many; the last ranks hold fewer
        real elements in storage of this size."""
        per = lambda shapes: sum(-(-s[0] // world) * math.prod(s[1:]) for s in shapes)
        if unit == "layer":
            return per(self.layer)
        if unit == "root":
            return per(self.root)
        return self.layers * per(self.layer) + per(self.root)


def shapes(architecture) -> Shapes:
    """The parameter shapes of a transformers Qwen2 config (modeling_qwen2.py: q/k/v projections
    with bias, o_proj and the SiLU MLP without, two RMSNorm gains per layer, the final norm,
    embedding and LM head)."""
    if getattr(architecture, "model_type", None) != "qwen2":
        raise ValueError(
            f"psyrl plan models Qwen2 architectures (model_type 'qwen2'), not "
            f"{getattr(architecture, 'model_type', None)!r}"
        )
    H, nh = architecture.hidden_size, architecture.num_attention_heads
    nkv = architecture.num_key_value_heads
    hd = getattr(architecture, "head_dim", None) or H // nh
    ffn, V = architecture.intermediate_size, architecture.vocab_size
    # q, k, v (+ bias)
    layer = (
        (nh * hd, H),
        (nh * hd,),
        (nkv * hd, H),
        (nkv * hd,),
        (nkv * hd, H),
        (nkv * hd,),
        # o_proj, gate, up, down, the two RMSNorms
        (H, nh * hd),
        (ffn, H),
        (ffn, H),
        (H, ffn),
        (H,),
        (H,),
    )
    tied = bool(architecture.tie_word_embeddings)
    root = ((V, H), (H,)) + (() if tied else ((V, H),))  # embedding, final norm, untied LM head
    return Shapes(H, architecture.num_hidden_layers, nh, nkv, hd, ffn, V, tied, layer, root)


# ----------------------------------------------------- activations and log-probs of one micro-batch
def layer_saved_per_token(sh: Shapes, b: int) -> int:
    """Bytes one Qwen2 decoder layer saves for backward per token, compute dtype of b bytes
    (modeling_qwen2.py with sdpa; a padded batch, so sdpa gets a mask and the GQA k/v are repeated
    to all heads). Measured on a CPU in float32 to the byte per layer
    (tests/plan/test_memory_plan.py lists the saved tensors)."""
    H, q, kv, ffn = sh.hidden, sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim, sh.intermediate
    # each RMSNorm: float32 input (pow, mul), normalised value, output; rsqrt
    norms = 2 * ((4 + 2 * b) * H + 4)
    # the rotary muls save only cos and sin (q and k need no saving: cos/sin carry no gradient);
    # sdpa saves q_embed, k and v (repeat_kv's copies to all heads when it has a mask), its output
    # (o_proj's input too) and logsumexp
    attention = 2 * b * q + 2 * b * (q if kv < q else kv) + 4 * sh.heads
    # gate_proj out (SiLU), SiLU out and up_proj out (their product), the product (down_proj)
    mlp = 4 * b * ffn
    return norms + attention + mlp


def layer_forward_per_token(sh: Shapes, b: int) -> int:
    """Bytes per token alive inside one decoder layer's gradient-free forward, at its largest
    (modeling_qwen2.py; nothing is saved, temporaries die as their last use returns)."""
    H, q, kv, ffn = sh.hidden, sh.heads * sh.head_dim, sh.kv_heads * sh.head_dim, sh.intermediate
    # layer input (the decoder loop holds it), residual, norm output; SiLU, up, product
    mlp = 3 * b * H + 3 * b * ffn
    # input, norm output; q_embed + a rotary temporary, k and v and their repeats, the output
    attention = 2 * b * H + 5 * b * q + 2 * b * kv
    norm = (b + 8 + b) * H  # input, its float32 copy and normalised value, the output
    return max(mlp, attention, norm)


def compute_moments(
    sh: Shapes,
    rows: float,
    seq_len: int,
    targets: int,
    b: int,
    grad_bytes: int,
    checkpointing: bool,
    backward: bool,
    autocast: bool = False,
) -> dict[str, dict[str, float]]:
    """Bytes of one micro-batch through psyrl.runtime.model.Policy (the decoder, then
    token_logprobs' ChunkLogprobs), at each moment that can be its peak: {moment: {"activations":
    ..., "log-probs": ...}}. rows x seq_len tokens (a padded batch), `targets` scored positions,
    compute dtype of b bytes, parameter gradients of grad_bytes. Excludes the weights and the
    decoder layers' own gradients (the caller's "gathered" and "grad sync" parts). `autocast`: one
    process in bf16 autocast over float32 weights, where ChunkLogprobs' backward casts the head
    weight to bf16 and its bf16 weight gradient to float32 (two more [V, H] copies)."""
    H, V, L = sh.hidden, sh.vocab, sh.layers
    tokens = rows * seq_len
    chunk = min(LOGPROB_CHUNK, targets)
    # transformers' sdpa mask [rows, 1, T, T] (bool), built once per forward
    bool_mask = rows * seq_len**2
    # torch's sdpa converts it to an additive mask in the compute dtype per call
    float_mask = b * rows * seq_len**2
    rows_saved = targets * b * H  # hidden[:, :-1][positions]: the [N, H] rows ChunkLogprobs saves
    hidden = tokens * b * H  # the final norm's output, alive while token_logprobs runs its forward
    # ChunkLogprobs.forward: [rows, V] float32 logits + logsumexp's exp temporary
    chunk_forward = 8 * V * chunk
    if not backward:  # no_grad: nothing is saved; one layer's working set, then the head
        layer = tokens * layer_forward_per_token(sh, b) + float_mask
        return {
            "layer forward": {"activations": bool_mask + layer, "log-probs": 0.0},
            "head forward": {
                "activations": bool_mask,
                "log-probs": hidden + rows_saved + chunk_forward,
            },
        }
    # sdpa saves its additive mask too
    layer_saved = tokens * layer_saved_per_token(sh, b) + float_mask
    # non-reentrant checkpoint keeps each layer's input; backward recomputes one layer at a time
    if checkpointing:
        stack = L * tokens * b * H
        recomputed = layer_saved
    else:
        stack = L * layer_saved
        recomputed = 0.0
    final = tokens * (4 + b) * H  # the final RMSNorm: its float32 input and normalised value
    # the LM head's (tied: the embedding's) gradient, summed until the backward ends
    head_grad = grad_bytes * V * H
    # recomputed float32 logits->grad, its b copy
    chunk_backward = 4 * V * chunk + (b * V * chunk if b < 4 else 0)
    chunks = math.ceil(targets / LOGPROB_CHUNK)
    # ChunkLogprobs.backward: weight.to(bf16), the bf16 grad_weight
    casts = 2 * 2 * V * H if autocast else 0
    # estimate: incoming grads + two MLP-wide grads
    layer_backward = tokens * (2 * b * H + 2 * b * sh.intermediate)
    return {
        "head forward": {
            "activations": bool_mask + stack + final,
            "log-probs": hidden + rows_saved + chunk_forward,
        },
        # the first chunk's weight gradient is new; from the second on it is added to the running
        # sum
        "head backward": {
            "activations": bool_mask + stack + final,
            "log-probs": rows_saved + chunk_backward + head_grad * (2 if chunks > 1 else 1) + casts,
        },
        "layer backward": {
            "activations": bool_mask + stack + recomputed + layer_backward,
            "log-probs": head_grad,
        },
        # the embedding's dense gradient joins the head's; the input's gradient is [tokens, H]
        "root backward": {"activations": tokens * b * H, "log-probs": 2 * head_grad},
    }


# ---------------------------------------------------------------- the plan
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


@dataclass
class Plan:
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

    @property
    def host_total(self) -> float:
        return sum(self.host.values()) + max(self.host_transient.values(), default=0.0)

    @property
    def host_fits(self) -> bool | None:
        if self.host_memory_gib is None:
            return None
        return self.host_total <= self.host_memory_gib * GIB

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.phases) and self.host_fits is not False and self._kv_ok

    @property
    def _kv_ok(self) -> bool:
        return self.pool is None or self.pool.sequences >= 1

    @property
    def problems(self) -> list[str]:
        out = [
            f"{p.name} needs {p.total / GIB:.1f} GiB of {self.gpu_memory_gib:g}: {p.fix}"
            for p in self.phases
            if not p.fits
        ]
        if not self._kv_ok:
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
            return (
                f"memory plan: fits {self.gpus} x {self.gpu_memory_gib:g} GiB (peak "
                f"{peak.total / GIB:.1f} GiB: {peak.name})"
            )
        return f"memory plan: {self.problems[0]}"


def plan(
    cfg,
    architecture,
    gpus: int,
    gpu_memory_gib: float,
    host_memory_gib: float | None = None,
    trainer: str = "tgrpo",
) -> Plan:
    """The memory plan of `cfg` on `gpus` GPUs of `gpu_memory_gib` each (one node): per phase, GiB
    per GPU by part and whether it fits, with a computed fix for each phase that does not; host RAM
    per node; the suggested sampler.gpu_memory_utilization; the cost of fsdp.defer_grad_sync.
    `architecture`: a transformers Qwen2 config. `trainer`: "tgrpo" or "sft" (SFT has no rollout,
    experience or weight sync)."""
    if trainer not in ("tgrpo", "sft"):
        raise ValueError(f"trainer must be 'tgrpo' or 'sft', got {trainer!r}")
    sh = shapes(architecture)
    result = _plan(cfg, sh, gpus, gpu_memory_gib, host_memory_gib, trainer)
    for phase in result.phases:
        if not phase.fits:
            phase.fix = _find_fix(
                cfg, sh, gpus, gpu_memory_gib, host_memory_gib, trainer, phase.name, result
            )
    if result.host_fits is False:
        result.host_fix = _find_fix(
            cfg, sh, gpus, gpu_memory_gib, host_memory_gib, trainer, "host", result
        )
    return result


def _suggest(
    cfg, sh: Shapes, gpus: int, gpu_memory_gib: float, trainer: str
) -> tuple[float | None, str]:
    capacity = gpu_memory_gib * GIB
    best = None
    for k in range(1, 20 + 1):  # k / 20: multiples of 0.05 without float steps
        util = k / 20
        trial = _with(
            cfg, {("sampler", "gpu_memory_utilization"): util, ("sampler", "engine"): "vllm"}
        )
        rollout = _rollout(trial, sh, gpus, capacity, trainer)
        pool = _pool(trial, sh, gpus, capacity)
        if rollout.total + SUGGEST_MARGIN_GIB * GIB <= capacity and pool.sequences >= 1:
            best = util
    if best is None:
        return None, (
            f"no sampler.gpu_memory_utilization lets the rollout fit on {gpu_memory_gib:g} GiB "
            f"with one {cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens}-token sequence "
            f"of KV cache and {SUGGEST_MARGIN_GIB:g} GiB to spare: offload more (fsdp.offload) or "
            "raise sampler.tensor_parallel"
        )
    return best, ""


# ---------------------------------------------------------------- phases
@dataclass(frozen=True)
class _Run:
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


def _setup(cfg, sh: Shapes, gpus: int, trainer: str) -> _Run:
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
    return _Run(
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
        CUDA_CONTEXT_GIB * GIB,
        trainer == "tgrpo" or bool(cfg.data.valid_file),
    )


def _resident(run: _Run, on_device: bool, grads: bool) -> dict[str, float]:
    """The actor's float32 shards and AdamW state on the GPU, when they are there in this phase
    (fsdp.offload)."""
    if run.offload == "always" or not on_device:
        return {"params": 0.0, "grads": 0.0, "adam": 0.0}
    return {"params": run.params, "grads": run.grads if grads else 0.0, "adam": run.adam}


def _sampler_idle(cfg, sh: Shapes, run: _Run, capacity: float) -> float:
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


def _pool(cfg, sh: Shapes, gpus: int, capacity: float) -> Pool:
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


def _torch_generation(cfg, sh: Shapes, run: _Run) -> float:
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


def _rollout(
    cfg, sh: Shapes, gpus: int, capacity: float, trainer: str, name: str = "rollout"
) -> Phase:
    """Generation: the sampler awake beside what the trainer keeps on the GPU ("phase": nothing)."""
    run = _setup(cfg, sh, gpus, trainer)
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


def _grad_sync(sh: Shapes, run: _Run, moment: str, defer: bool) -> float:
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
    cfg,
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
    run = _setup(cfg, sh, gpus, trainer)
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


def _sync(cfg, sh: Shapes, gpus: int, capacity: float, trainer: str) -> Phase:
    """Weight sync: the engine's weights awake (KV cache asleep), the trainer's resident memory, and
    the buckets: parameters cast to model.dtype on the GPU and all-gathered about
    sampler.sync_bucket_mib at a time (psyrl.runtime.distributed.sync_buckets: the gathered bucket,
    this rank's input share, one unpacked copy). A bucket closes once it reaches the size, so it can
    exceed it by its last tensor: at most the size plus the largest tensor."""
    run = _setup(cfg, sh, gpus, trainer)
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


def _checkpoint(cfg, sh: Shapes, gpus: int, capacity: float, trainer: str) -> Phase:
    """Checkpoint and export, after the validation (T-GRPO's phase offload has put the actor back on
    the host): the trainer's resident memory, and rank 0 gathering one full float32 parameter at a
    time (psyrl.runtime.distributed.gather_to_rank0): on the GPU when the shards are there (the
    world's padded shards, their concatenation, its own padded copy), on the host otherwise. The
    largest parameter is the embedding."""
    run = _setup(cfg, sh, gpus, trainer)
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


def _phases(cfg, sh: Shapes, gpus: int, capacity: float, trainer: str) -> list[Phase]:
    phases = []
    if trainer == "tgrpo":
        # the worst case: every sequence this long
        seq = cfg.rollout.max_prompt_tokens + cfg.rollout.max_new_tokens
        response = cfg.rollout.max_new_tokens
        phases.append(_rollout(cfg, sh, gpus, capacity, trainer))
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
        generation = _rollout(cfg, sh, gpus, capacity, trainer, "validation")
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


def _host(cfg, sh: Shapes, gpus: int, trainer: str) -> tuple[dict[str, float], dict[str, float]]:
    """Host RAM of the node (all `gpus` ranks on one node): what stays, and what comes and goes."""
    run = _setup(cfg, sh, gpus, trainer)
    stays = {
        f"baseline ({HOST_BASELINE_GIB:g} GiB per rank, assumption)": HOST_BASELINE_GIB * GIB * gpus
    }
    # float32 shards + AdamW pinned; "always" also gradients
    if run.offload in ("phase", "always") and run.world > 1:
        label = "actor shards + AdamW, pinned" + (
            " (+ gradients)" if run.offload == "always" else ""
        )
        stays[label] = (16.0 if run.offload == "always" else 12.0) * sh.shard(run.world) * run.world
    if run.kl and run.world > 1 and cfg.fsdp.ref_offload:  # CPUOffloadPolicy shards in model.dtype
        stays[f"reference model ({cfg.model.dtype}, CPU offload)"] = (
            run.b * sh.shard(run.world) * run.world
        )
    # sleep level 1: weights to the host
    if run.sampler and cfg.sampler.engine == "vllm" and cfg.sampler.sleep:
        stays["vLLM weights asleep"] = run.b * sh.params / cfg.sampler.tensor_parallel * gpus
    export = DTYPE_BYTES[cfg.checkpoint.export_dtype]
    transient = {
        # rank 0 gathers the full float32 state dict, then writes the HF export in
        # checkpoint.export_dtype
        f"checkpoint on rank 0 (float32 state + {cfg.checkpoint.export_dtype} export)": (4 + export)
        * sh.params,
        "start-up: rank 0 reads the float32 model": 4.0 * sh.params,  # runtime.load_sharded
    }
    return stays, transient


def _plan(
    cfg, sh: Shapes, gpus: int, gpu_memory_gib: float, host_memory_gib: float | None, trainer: str
) -> Plan:
    if gpus < 1:
        raise ValueError(f"--gpus must be >= 1, got {gpus}")
    if cfg.sampler.engine == "vllm" and gpus % cfg.sampler.tensor_parallel:
        raise ValueError(
            f"sampler.tensor_parallel = {cfg.sampler.tensor_parallel} must divide the {gpus} GPUs "
            "(each group of consecutive ranks holds one vLLM engine)"
        )
    capacity = gpu_memory_gib * GIB
    phases = _phases(cfg, sh, gpus, capacity, trainer)
    stays, transient = _host(cfg, sh, gpus, trainer)
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
    )
    if cfg.sampler.engine == "vllm" and (trainer == "tgrpo" or cfg.data.valid_file):
        result.pool = _pool(cfg, sh, gpus, capacity)
        result.suggested_utilization, result.suggestion_note = _suggest(
            cfg, sh, gpus, gpu_memory_gib, trainer
        )
    if gpus > 1:  # re-planned with the flag flipped: the update's difference
        flipped = _with(cfg, {("fsdp", "defer_grad_sync"): not cfg.fsdp.defer_grad_sync})
        other = next(p for p in _phases(flipped, sh, gpus, capacity, trainer) if p.name == "update")
        mine = next(p for p in phases if p.name == "update")
        result.defer_grad_sync_bytes = abs(mine.total - other.total)
    return result


def _settings(cfg, trainer: str) -> str:
    flag = lambda v: str(v).lower()
    parts = [
        f"model.dtype {cfg.model.dtype}",
        f"gradient_checkpointing {flag(cfg.model.gradient_checkpointing)}",
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
def _with(cfg, changes: dict[tuple[str, str], object]):
    new = copy.deepcopy(cfg)
    for (table, key), value in changes.items():
        setattr(getattr(new, table), key, value)
    return new


def _candidates(cfg, sh: Shapes, gpus: int, gpu_memory_gib: float, trainer: str) -> list[dict]:
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
                and gpus % tp == 0
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


def _host_candidates(cfg, trainer: str) -> list[dict]:
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
    cfg,
    sh: Shapes,
    gpus: int,
    gpu_memory_gib: float,
    host_memory_gib: float | None,
    trainer: str,
    name: str,
    current: Plan,
) -> str:
    """The first change (single ones, then pairs) after which phase `name` (or "host": the host RAM)
    fits and no phase that fitted stops fitting."""
    fitted = {p.name for p in current.phases if p.fits}
    singles = (
        _host_candidates(cfg, trainer)
        if name == "host"
        else _candidates(cfg, sh, gpus, gpu_memory_gib, trainer)
    )
    pairs = [{**a, **b} for a, b in itertools.combinations(singles, 2) if not set(a) & set(b)]
    for changes in singles + pairs:
        trial = _with(cfg, changes)
        try:
            result = _plan(trial, sh, gpus, gpu_memory_gib, host_memory_gib, trainer)
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


# ---------------------------------------------------------------- the table
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
    if not p._kv_ok:
        out.append(next(line for line in p.problems if line.startswith("rollout: the vLLM pool")))
    out += ["", p.verdict(), "", "assumptions: " + ASSUMPTIONS]
    return "\n".join(out)


ASSUMPTIONS = (
    "every sequence at its maximum length and every micro-batch padded (sdpa gets a mask); CUDA "
    f"context and NCCL {CUDA_CONTEXT_GIB:g} GiB per process; {HOST_BASELINE_GIB:g} GiB of host RAM "
    f"per rank; vLLM's CUDA graphs {VLLM_GRAPHS_GIB:g} GiB (kept while it sleeps) and activation "
    f"peak are estimates, its step {VLLM_STEP_TOKENS[False]} tokens ({VLLM_STEP_TOKENS[True]} on a "
    "GPU from 70 GiB); the CUDA caching allocator's fragmentation is not counted (a phase above "
    f"{TIGHT:.0%} is 'tight'); checked on a CPU (a decoder layer's saved bytes exactly, in float32 "
    "and bf16; a forward/backward's peak within 15 % in float32), not on a GPU."
)
