"""Models and tokenizers: a local Hugging Face causal LM or a tiny seeded Qwen2, and memory-bounded
log-probs.

`token_logprobs` is the one place a policy's token log-probabilities are computed (SFT loss,
T-GRPO's logp_old / logp_ref / logp_theta), and on request the true entropy of each next-token
distribution: the LM head and log-softmax run in chunks of rows and each chunk is recomputed in the
backward pass, so full-vocabulary fp32 logits never exist for a whole batch (vocab 151,936 x 8 x
256 tokens: ~1.2 GiB per copy).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention.varlen import varlen_attn
from transformers import (
    AttentionInterface,
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    Qwen2Config,
    Qwen2ForCausalLM,
)
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from psyrl.core.checkpoints import verify_before_load
from psyrl.core.config import ModelConfig

SHIPPED_TOKENIZERS = ("tiny", "qwen2.5")
LOGPROB_CHUNK = 256  # rows per chunk: [256, 151936] fp32 logits are 156 MB
PACKED_ATTENTION = "psyrl_packed_sdpa"  # transformers' SDPA, and per-sequence attention when packed


def shipped_tokenizer_dir(name: str) -> Path:
    """Directory of a tokenizer that ships inside the package (`tiny` or `qwen2.5`)."""
    if name not in SHIPPED_TOKENIZERS:
        raise ValueError(
            f"unknown shipped tokenizer {name!r}; expected one of {', '.join(SHIPPED_TOKENIZERS)}"
        )
    return Path(str(resources.files("psyrl") / "assets" / "tokenizers" / name))


def _model_dir(path: str) -> Path:
    p = Path(path).expanduser()
    if not p.is_dir():
        from psyrl.core.presets import preset_writing  # this message only

        trainer = preset_writing(path)  # runs/tiny-sft/...: a preset's run not trained yet
        made = f"; it is written by `{trainer}`" if trainer else ""
        raise FileNotFoundError(
            f"no such model directory: {p} (model.path must be a local Hugging Face "
            f"model directory; psyrl never downloads from the hub){made}"
        )
    # every reader of model.path passes here: the tokenizer, the config, the weights; every rank
    # checks (a refusal on one rank alone would leave the others waiting in a collective), said
    # once (RANK 0)
    verify_before_load(p, note=_print_rank0)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{p} is not a Hugging Face model directory: it has no config.json")
    refuse_remote_code(p, "config.json")
    return p


def _print_rank0(line: str) -> None:
    if os.environ.get("RANK", "0") == "0":
        print(line, flush=True)


def refuse_remote_code(directory: Path, name: str) -> None:
    """psyrl never runs code shipped with a checkpoint: a config that maps its classes to the
    directory's own modules (`auto_map`) is refused, not silently loaded as a built-in class."""
    path = directory / name
    if not path.is_file():
        return
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ValueError(f"{path}: not a JSON file ({e})") from None
    if isinstance(config, dict) and config.get("auto_map"):
        raise ValueError(
            f"{path} maps its classes to code in the checkpoint (auto_map: "
            f"{', '.join(sorted(config['auto_map']))}): psyrl never runs a model's remote code; "
            "use a checkpoint of a built-in transformers architecture (e.g. Qwen2)"
        )


def weight_files(model_dir: Path) -> list[Path]:
    """A checkpoint's weight files: *.safetensors, then *.bin, each sorted."""
    return sorted(model_dir.glob("*.safetensors")) + sorted(model_dir.glob("*.bin"))


def model_fingerprint(model_dir: Path) -> str:
    """config.json, and each weight file's name, size and first and last MiB: a changed checkpoint
    is noticed on resume (evaluate.py, psyrl build) without reading gigabytes."""
    h = hashlib.sha256((model_dir / "config.json").read_bytes())
    for f in weight_files(model_dir):
        size = f.stat().st_size
        h.update(f"{f.name}:{size}".encode())
        with f.open("rb") as fh:
            h.update(fh.read(1 << 20))
            fh.seek(max(0, size - (1 << 20)))
            h.update(fh.read(1 << 20))
    return h.hexdigest()[:16]


def load_tokenizer(cfg: ModelConfig):
    """The tokenizer `model.tokenizer` names (see its docstring); padding on the left for
    generation."""
    name = cfg.tokenizer or ("tiny" if not cfg.path else "")
    if name in SHIPPED_TOKENIZERS:
        directory = shipped_tokenizer_dir(name)
    elif name:
        directory = Path(name).expanduser()
    else:
        directory = _model_dir(cfg.path)
    # else transformers would try the hub and report a confusing repo-id error
    if not directory.is_dir():
        raise FileNotFoundError(
            f"no such tokenizer directory: {directory} (model.tokenizer is "
            f"{', '.join(SHIPPED_TOKENIZERS)}, a directory, or empty)"
        )
    refuse_remote_code(directory, "tokenizer_config.json")
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    if None in (tokenizer.pad_token_id, tokenizer.eos_token_id, tokenizer.chat_template):
        raise ValueError(
            f"tokenizer in {directory} needs a pad token, an eos token and a chat template"
        )
    tokenizer.padding_side = "left"
    return tokenizer


def stop_token_ids(tokenizer) -> list[int]:
    """Tokens that end a response: end-of-turn, and end-of-text as Qwen2.5-Instruct's generation
    config lists."""
    return list(dict.fromkeys([tokenizer.eos_token_id, tokenizer.pad_token_id]))


def tiny_config(cfg: ModelConfig, tokenizer) -> Qwen2Config:
    """A Qwen2 architecture of the configured size; vocabulary padded to a multiple of 64 as Qwen2.5
    pads."""
    return Qwen2Config(
        vocab_size=-(-len(tokenizer) // 64) * 64,
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )


def model_config(cfg: ModelConfig, tokenizer):
    """The architecture `load_model` builds: `model.path`'s config.json, or the tiny Qwen2 of the
    model table."""
    if cfg.path:
        return AutoConfig.from_pretrained(str(_model_dir(cfg.path)))
    return tiny_config(cfg, tokenizer)


def attention_implementation(cfg: ModelConfig) -> str:
    """The name transformers dispatches attention by: `packed_attention` when `model.packing`."""
    if not cfg.packing:
        return cfg.attn_implementation
    # transformers looks attention and mask functions up by name in its registries (class-level
    # mappings, transformers/modeling_utils.py AttentionInterface, masking_utils.py
    # AttentionMaskInterface): registering the same pair again is a no-op
    AttentionInterface.register(PACKED_ATTENTION, packed_attention)
    AttentionMaskInterface.register(PACKED_ATTENTION, sdpa_mask)
    return PACKED_ATTENTION


def load_model(
    cfg: ModelConfig,
    tokenizer,
    seed: int = 0,
    device: str | torch.device = "cpu",
    empty: bool = False,
):
    """Float32 master weights: from `model.path`, or a tiny Qwen2 whose random init depends only on
    `seed`. empty=True builds the same architecture on the meta device without reading any weight
    (the ranks that receive rank 0's weights by broadcast,
    `psyrl.runtime.distributed.load_sharded`)."""
    if empty:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(
                model_config(cfg, tokenizer),
                dtype=torch.float32,
                attn_implementation=attention_implementation(cfg),
            )
    elif cfg.path:
        model = AutoModelForCausalLM.from_pretrained(
            str(_model_dir(cfg.path)),
            dtype=torch.float32,
            attn_implementation=attention_implementation(cfg),
        )
    else:
        # seeded init that leaves the caller's RNG untouched
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM._from_config(
                tiny_config(cfg, tokenizer),
                dtype=torch.float32,
                attn_implementation=attention_implementation(cfg),
            )
    if model.get_output_embeddings().weight.shape[0] < len(tokenizer):
        raise ValueError(
            f"the model's vocabulary ({model.get_output_embeddings().weight.shape[0]}) is smaller "
            f"than the tokenizer's ({len(tokenizer)})"
        )
    model.generation_config.eos_token_id = stop_token_ids(tokenizer)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model if empty else model.to(device)


def autocast(cfg: ModelConfig, device: torch.device):
    """bf16 autocast when `model.dtype = "bfloat16"` (weights stay fp32), else a no-op context."""
    if cfg.dtype == "bfloat16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


class HeadLogprobs(torch.autograd.Function):
    """log softmax(hidden @ W^T + b) / T at each row's target, `chunk` rows at a time. Saves only
    its inputs and the log-normalisers: backward recomputes each chunk's logits once and turns them
    into the gradient in place (softmax, times -g, plus g at the target), so a chunk costs one
    [rows, V] buffer and about six passes over it, where plain autograd with recomputation made
    about fifteen (profiled: bench/step_vs_trl.py). The LM head's (and a tied embedding's) weight
    gradient is summed over the chunks in float32 and rounded to the weight's dtype once: summed by
    autograd in bf16 (FSDP2's bf16 parameters), it lost a bf16 rounding per chunk.

    entropy=True also returns each row's entropy H = -sum_v p_v log p_v of the same softmax, [N]
    float32, from the same chunks: one more [rows, V] temporary per chunk in the forward, and in
    the backward when the entropy has a gradient. Its gradient is dH/dz_v = -p_v (log p_v + H)
    (z = logits / T); with both outputs in a loss the backward makes d/dz_v = g [v = target] - p_v
    (g + g_ent (log p_v + H)) in one pass. When the entropy receives no gradient (a metric only),
    backward is the log-prob-only one, operation for operation; entropy=False is the log-prob-only
    function, unchanged."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature: float, chunk: int, entropy=False):
        out = torch.empty(hidden.shape[0], dtype=torch.float32, device=hidden.device)  # [N]
        lse = torch.empty_like(out)  # [N]
        ent = torch.empty_like(out) if entropy else None  # [N]
        dtype = None
        for start in range(0, hidden.shape[0], chunk):
            rows = slice(start, start + chunk)
            logits = F.linear(hidden[rows], weight, bias)  # [rows, V], bf16 under autocast
            dtype = logits.dtype
            logits = logits.float()
            if temperature != 1.0:
                logits.div_(temperature)
            lse[rows] = torch.logsumexp(logits, dim=-1)
            out[rows] = logits.gather(-1, targets[rows, None]).squeeze(-1) - lse[rows]
            if entropy:
                logp = logits.sub_(lse[rows, None])  # [rows, V], in place
                ent[rows] = logp.exp().mul_(logp).sum(-1).neg_()
        ctx.dtype = dtype or weight.dtype  # backward recomputes in the forward's precision
        ctx.save_for_backward(hidden, weight, bias, targets, lse, ent)
        ctx.temperature, ctx.chunk = temperature, chunk
        if not entropy:
            return out
        ctx.set_materialize_grads(False)  # an entropy without gradient arrives as None
        return out, ent

    @staticmethod
    def backward(ctx, g, g_ent=None):
        hidden, weight, bias, targets, lse, ent = ctx.saved_tensors
        if g is None:  # only the entropy reached the loss
            g = torch.zeros_like(lse)
        temperature, dtype = ctx.temperature, ctx.dtype
        w = weight.to(dtype)
        b = None if bias is None else bias.to(dtype)
        need_hidden, need_weight, need_bias = ctx.needs_input_grad[:3]
        grad_hidden = torch.empty_like(hidden) if need_hidden else None
        grad_weight = (
            torch.zeros(weight.shape, dtype=torch.float32, device=weight.device)
            if need_weight
            else None
        )
        need_bias = need_bias and bias is not None
        grad_bias = torch.zeros(bias.shape, device=bias.device) if need_bias else None
        for start in range(0, hidden.shape[0], ctx.chunk):
            rows = slice(start, start + ctx.chunk)
            h = hidden[rows].to(dtype)
            logits = F.linear(h, w, b).float()  # [rows, V]
            if temperature != 1.0:
                logits.div_(temperature)
            if g_ent is None:
                # d out / d z = onehot - softmax, times g
                grad = logits.sub_(lse[rows, None]).exp_().mul_(-g[rows, None])
            else:
                # g (onehot - p) + g_ent dH/dz = g onehot - p (g + g_ent (log p + H))
                logp = logits.sub_(lse[rows, None])  # [rows, V]
                p = logp.exp()  # [rows, V]
                grad = logp.add_(ent[rows, None]).mul_(g_ent[rows, None]).add_(g[rows, None])
                grad = grad.mul_(p).neg_()
                del p  # freed before the matmuls below
            grad.scatter_add_(-1, targets[rows, None], g[rows, None].float())
            if temperature != 1.0:
                grad.div_(temperature)
            grad = grad.to(dtype)
            if need_hidden:
                grad_hidden[rows] = grad @ w
            if need_weight:
                grad_weight += grad.t() @ h  # each chunk's product added in float32
            if need_bias:
                grad_bias += grad.sum(0).float()
        return (
            grad_hidden,
            grad_weight.to(weight.dtype) if need_weight else None,
            grad_bias.to(bias.dtype) if need_bias else None,
            None,
            None,
            None,
            None,
        )


def packed_attention(
    module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs
) -> tuple[torch.Tensor, None]:
    """Attention for `PACKED_ATTENTION`. A packed row (kwargs `cu_seq_lens_q`: [b+1] int32, where
    each sequence starts) attends causally within each sequence only: query [1, heads, N, d], key
    and value [1, kv_heads, N, d] -> [1, N, heads, d]. Anything else (a padded batch, generation)
    is transformers' own SDPA with the padding mask, unchanged."""
    starts = kwargs.pop("cu_seq_lens_q", None)
    if starts is None:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    query, key, value = autocast_inputs(query.device.type, query, key, value)
    if packed_kernel(query.device.type, query.dtype) == "varlen":
        return varlen_causal(query, key, value, starts, kwargs["max_length_q"], scaling), None
    # CPU (and float32 on CUDA, which FlashAttention lacks): causal SDPA per sequence, no mask
    # (measured faster here than one block-diagonal mask over the row: bench/packing.py)
    bounds = starts.tolist()  # a device sync on CUDA, once per layer
    pieces = [
        sdpa_attention_forward(
            module, query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], None, scaling=scaling
        )[0]
        for a, b in zip(bounds, bounds[1:])
    ]
    return torch.cat(pieces, dim=1), None


def autocast_inputs(device_type: str, *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tensors in autocast's dtype when autocast is on for `device_type`, else unchanged. Under
    autocast over float32 weights, q and k reach attention in float32 and v in bf16: Qwen2's rotary
    cos/sin take the float32 hidden states' dtype (transformers 5.19 qwen2/modeling_qwen2.py:94)
    and promote q * cos (:125), while v comes straight from a linear that autocast ran in bf16. SDPA
    casts its inputs itself under autocast; torch's varlen op is a custom op that registers no
    autocast rule (torch/nn/attention/varlen.py; torch/_library/custom_ops.py register_autocast), so
    nothing would cast them for it. The kernel is chosen on the cast tensors; what SDPA computes is
    unchanged (the cast is the one autocast makes)."""
    if not torch.is_autocast_enabled(device_type):
        return tensors
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) for t in tensors)


def packed_kernel(device_type: str, dtype: torch.dtype) -> str:
    """The attention a packed row gets: "varlen" (FlashAttention-2 varlen, one call per layer) on
    CUDA in half precision, else "sdpa_loop" (causal SDPA per sequence, its bounds read to the host:
    a device sync per layer on CUDA). FlashAttention has no float32 kernel."""
    if device_type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        return "varlen"
    return "sdpa_loop"


def varlen_causal(query, key, value, starts, longest: int, scaling) -> torch.Tensor:
    """FlashAttention-2 varlen (torch/nn/attention/varlen.py `varlen_attn`, which takes [tokens,
    heads, d]; window (-1, 0) is causal; grouped-query attention without repeating key and value):
    query [1, heads, N, d], key and value [1, kv_heads, N, d] -> [1, N, heads, d]."""
    out = varlen_attn(
        query[0].transpose(0, 1),
        key[0].transpose(0, 1),
        value[0].transpose(0, 1),
        starts,
        starts,
        longest,
        longest,
        scale=scaling,
        window_size=(-1, 0),
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return out.unsqueeze(0)


@dataclass
class Packed:
    """The sequences of a micro-batch end to end in one row, without padding (`pack`). Input to
    `token_logprobs`, whose result it lays out per sequence again."""

    input_ids: torch.Tensor
    """[1, N] long: the b sequences concatenated, N = their total length."""
    position_ids: torch.Tensor
    """[1, N] long: 0, 1, ... restarting at each sequence (rotary positions as if alone)."""
    starts: torch.Tensor
    """[b+1] int32: where each sequence starts in the row, then N (FlashAttention's cu_seqlens)."""
    longest: int
    """Length of the longest sequence."""
    targets: torch.Tensor
    """[1, N-1] bool: the positions scored, in the row (position t predicts token t+1)."""
    layout: torch.Tensor
    """[b, T-1] bool: the same targets in the padded per-sequence layout (T = longest) that
    `token_logprobs` returns, equal to `collate`'s response mask."""

    def to(self, device) -> Packed:
        return Packed(
            self.input_ids.to(device),
            self.position_ids.to(device),
            self.starts.to(device),
            self.longest,
            self.targets.to(device),
            self.layout.to(device),
        )


def pack(token_ids: Sequence[Sequence[int]], prompt_lengths: Sequence[int]) -> Packed:
    """`Packed` of sequences whose first prompt_lengths[i] tokens are the prompt: the targets are
    the response tokens, as in `collate`'s response mask. A position whose next token starts the
    following sequence is never a target."""
    lengths = [len(ids) for ids in token_ids]
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + n)
    total, longest = starts[-1], max(lengths)
    targets = torch.zeros((1, total - 1), dtype=torch.bool)  # [1, N-1]
    layout = torch.zeros((len(lengths), longest - 1), dtype=torch.bool)  # [b, T-1]
    for row, (start, n, prompt_len) in enumerate(zip(starts, lengths, prompt_lengths)):
        targets[0, start + prompt_len - 1 : start + n - 1] = True
        layout[row, prompt_len - 1 : n - 1] = True
    return Packed(
        input_ids=torch.tensor([[t for ids in token_ids for t in ids]], dtype=torch.long),
        position_ids=torch.cat([torch.arange(n) for n in lengths])[None],
        starts=torch.tensor(starts, dtype=torch.int32),
        longest=longest,
        targets=targets,
        layout=layout,
    )


def decode_packed(decoder, packed: Packed) -> torch.Tensor:
    """The decoder's last hidden states [1, N, H] of a packed row: position ids restart per
    sequence, and the sequence starts reach `packed_attention` as transformers' FlashAttention
    keyword arguments (passed through every layer to the attention function). The attention mask is
    given as its per-layer-type mapping of None, which transformers takes as already prepared
    (qwen2/modeling_qwen2.py Qwen2Model.forward), so no [N, N] mask is ever built."""
    if decoder.config._attn_implementation != PACKED_ATTENTION:
        raise ValueError(
            f"a packed batch needs the model built with model.packing = true (attention "
            f"{decoder.config._attn_implementation!r} would attend across sequences)"
        )
    no_mask = {kind: None for kind in set(decoder.config.layer_types)}
    out = decoder(
        input_ids=packed.input_ids,
        position_ids=packed.position_ids,
        attention_mask=no_mask,
        use_cache=False,
        cu_seq_lens_q=packed.starts,
        cu_seq_lens_k=packed.starts,
        max_length_q=packed.longest,
        max_length_k=packed.longest,
    )
    return out.last_hidden_state


def token_logprobs(
    model,
    input_ids,
    attention_mask,
    temperature: float = 1.0,
    positions=None,
    chunk: int = LOGPROB_CHUNK,
    entropy: bool = False,
):
    """log softmax(logits / T) over the full vocabulary: out[b, t] = log p(ids[b, t+1] | ids[b,
    :t+1]).

    input_ids, attention_mask: [B, T]; positions: [B, T-1] bool, the targets to score (default:
    every non-padding target); returns float32 [B, T-1], 0 where positions is False. `input_ids` may
    instead be a `Packed` micro-batch (attention_mask and positions None): the same [b, T-1] result,
    computed without padding. Calls the decoder and the LM head directly, not `model.forward`: under
    FSDP2 call it through `Policy`, whose forward gathers the embedding, final norm and LM head and
    reduces their gradients.

    entropy=True returns (log-probs, entropy): entropy[b, t] = -sum_v p_v log p_v of the same
    next-token distribution softmax(logits / T) at position t, float32 in the same [B, T-1] layout
    and 0 where positions is False, computed in the same chunks (no [B, T, V] tensor) and
    differentiable (`HeadLogprobs`).
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probabilities, got {temperature}")
    decoder = model.get_decoder()
    if isinstance(input_ids, Packed):
        packed = input_ids
        hidden = decode_packed(decoder, packed)  # [1, N, H]
        input_ids, positions, layout = packed.input_ids, packed.targets, packed.layout
    else:
        if positions is None:
            positions = attention_mask[:, 1:].bool()  # [B, T-1]
        out = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        hidden, layout = out.last_hidden_state, positions  # [B, T, H]
    rows = hidden[:, :-1][positions]  # [N, H]
    targets = input_ids[:, 1:][positions]  # [N]
    head = model.get_output_embeddings()
    # [N], or ([N], [N]) with the entropy
    values = HeadLogprobs.apply(rows, head.weight, head.bias, targets, temperature, chunk, entropy)
    # row-major order of the targets is the same in the packed row and the per-sequence layout
    if not entropy:
        return torch.zeros(layout.shape, dtype=torch.float32, device=values.device).masked_scatter(
            layout, values
        )
    return tuple(
        torch.zeros(layout.shape, dtype=torch.float32, device=v.device).masked_scatter(layout, v)
        for v in values
    )  # [B, T-1] each


def collate(token_ids: Sequence[Sequence[int]], prompt_lengths: Sequence[int], pad_id: int):
    """Right-padded input_ids, attention_mask [B, T] and the response mask [B, T-1] (True where
    token t+1 is response: position t predicts it) of sequences whose first prompt_lengths[i] tokens
    are the prompt."""
    width = max(len(ids) for ids in token_ids)
    input_ids = torch.full((len(token_ids), width), pad_id, dtype=torch.long)  # [B, T]
    attention_mask = torch.zeros((len(token_ids), width), dtype=torch.long)  # [B, T]
    response_mask = torch.zeros((len(token_ids), width - 1), dtype=torch.bool)  # [B, T-1]
    for row, (ids, prompt_len) in enumerate(zip(token_ids, prompt_lengths)):
        n = len(ids)
        input_ids[row, :n] = torch.tensor(ids)
        attention_mask[row, :n] = 1
        response_mask[row, prompt_len - 1 : n - 1] = True
    return input_ids, attention_mask, response_mask


class Policy(nn.Module):
    """A causal LM whose forward is `token_logprobs`: the one call SFT and T-GRPO make on pi_theta
    and pi_ref.

    FSDP2 gathers a module's parameters around its forward only, so the module that owns the
    embedding, final norm and LM head (the FSDP root) must be the one whose forward computes the
    chunked log-probs. `lm` stays a plain transformers model for generation and export."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(
        self,
        input_ids,
        attention_mask=None,
        temperature: float = 1.0,
        positions=None,
        entropy: bool = False,
    ):
        """`token_logprobs` of a padded batch, or of a `Packed` one (then input_ids is it);
        entropy=True returns (log-probs, entropy)."""
        return token_logprobs(
            self.lm, input_ids, attention_mask, temperature, positions, entropy=entropy
        )


@torch.no_grad()
def load_weights(model: nn.Module, named_tensors) -> None:
    """Copy (name, tensor) pairs into `model`'s parameters and buffers in place, one pair at a time:
    the weight sync of an unsharded copy from a sharded trainer
    (`psyrl.runtime.distributed.gather_full_state_dict`). Tied parameters arrive once and fill every
    name that shares them; a parameter left unfilled is an error."""
    filled = set()
    for name, tensor in named_tensors:
        try:
            target = model.get_parameter(name)
        except AttributeError:
            target = model.get_buffer(name)
        target.copy_(tensor)
        filled.add(id(target))
    missing = [name for name, p in model.named_parameters() if id(p) not in filled]
    if missing:
        raise ValueError(
            f"load_weights: no tensor for {', '.join(missing[:5])} ({len(missing)} parameters)"
        )
