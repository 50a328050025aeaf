"""Models and tokenizers: a local Hugging Face causal LM or a tiny seeded Qwen2, and memory-bounded
log-probs.

`token_logprobs` is the one place a policy's token log-probabilities are computed (SFT loss,
T-GRPO's logp_old / logp_ref / logp_theta): the LM head and log-softmax run in chunks of rows and
each chunk is recomputed in the backward pass, so full-vocabulary fp32 logits never exist for a
whole batch (vocab 151,936 x 8 x 256 tokens: ~1.2 GiB per copy).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoTokenizer,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from psyrl.core.config import ModelConfig

SHIPPED_TOKENIZERS = ("tiny", "qwen2.5")
LOGPROB_CHUNK = 256  # rows per chunk: [256, 151936] fp32 logits are 156 MB


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
        raise FileNotFoundError(
            f"no such model directory: {p} (model.path must be a local Hugging Face "
            "model directory; psyrl never downloads from the hub)"
        )
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{p} is not a Hugging Face model directory: it has no config.json")
    refuse_remote_code(p, "config.json")
    return p


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
                attn_implementation=cfg.attn_implementation,
            )
    elif cfg.path:
        model = AutoModelForCausalLM.from_pretrained(
            str(_model_dir(cfg.path)),
            dtype=torch.float32,
            attn_implementation=cfg.attn_implementation,
        )
    else:
        # seeded init that leaves the caller's RNG untouched
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = Qwen2ForCausalLM._from_config(
                tiny_config(cfg, tokenizer),
                dtype=torch.float32,
                attn_implementation=cfg.attn_implementation,
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


class ChunkLogprobs(torch.autograd.Function):
    """log softmax(hidden @ W^T + b) / T at each row's target, for one chunk of rows. Saves only its
    inputs and the log-normaliser: backward recomputes the chunk's logits once and turns them into
    the gradient in place (softmax, times -g, plus g at the target), so a chunk costs one [rows, V]
    buffer and about six passes over it, where plain autograd with recomputation made about fifteen
    (profiled: bench/step_vs_trl.py)."""

    @staticmethod
    def forward(ctx, hidden, weight, bias, targets, temperature: float):
        logits = F.linear(hidden, weight, bias)  # [rows, V], bf16 under autocast
        ctx.dtype = logits.dtype  # backward recomputes and multiplies in the forward's precision
        logits = logits.float()
        if temperature != 1.0:
            logits.div_(temperature)
        lse = torch.logsumexp(logits, dim=-1)  # [rows]
        ctx.save_for_backward(hidden, weight, bias, targets, lse)
        ctx.temperature = temperature
        return logits.gather(-1, targets[:, None]).squeeze(-1) - lse

    @staticmethod
    def backward(ctx, g):
        hidden, weight, bias, targets, lse = ctx.saved_tensors
        T, dtype = ctx.temperature, ctx.dtype
        w = weight.to(dtype)
        logits = F.linear(hidden.to(dtype), w, None if bias is None else bias.to(dtype)).float()
        if T != 1.0:
            logits.div_(T)
        # d out / d z = onehot - softmax, times g
        grad = logits.sub_(lse[:, None]).exp_().mul_(-g[:, None])
        grad.scatter_add_(-1, targets[:, None], g[:, None].float())
        if T != 1.0:
            grad.div_(T)
        grad = grad.to(dtype)
        grad_hidden = (grad @ w).to(hidden.dtype) if ctx.needs_input_grad[0] else None
        grad_weight = (
            (grad.t() @ hidden.to(dtype)).to(weight.dtype) if ctx.needs_input_grad[1] else None
        )
        grad_bias = (
            grad.sum(0).to(bias.dtype) if bias is not None and ctx.needs_input_grad[2] else None
        )
        return grad_hidden, grad_weight, grad_bias, None, None


def token_logprobs(
    model,
    input_ids,
    attention_mask,
    temperature: float = 1.0,
    positions=None,
    chunk: int = LOGPROB_CHUNK,
):
    """log softmax(logits / T) over the full vocabulary: out[b, t] = log p(ids[b, t+1] | ids[b,
    :t+1]).

    input_ids, attention_mask: [B, T]; positions: [B, T-1] bool, the targets to score (default:
    every non-padding target); returns float32 [B, T-1], 0 where positions is False. Calls the
    decoder and the LM head directly, not `model.forward`: under FSDP2 call it through `Policy`,
    whose forward gathers the embedding, final norm and LM head and reduces their gradients.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probabilities, got {temperature}")
    if positions is None:
        positions = attention_mask[:, 1:].bool()  # [B, T-1]
    decoder = model.get_decoder()
    out = decoder(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
    hidden = out.last_hidden_state  # [B, T, H]
    rows = hidden[:, :-1][positions]  # [N, H]
    targets = input_ids[:, 1:][positions]  # [N]
    head = model.get_output_embeddings()
    pieces = [
        ChunkLogprobs.apply(
            rows[start : start + chunk],
            head.weight,
            head.bias,
            targets[start : start + chunk],
            temperature,
        )
        for start in range(0, rows.shape[0], chunk)
    ]
    values = torch.cat(pieces) if pieces else rows.new_zeros(0, dtype=torch.float32)  # [N]
    return torch.zeros(positions.shape, dtype=torch.float32, device=values.device).masked_scatter(
        positions, values
    )


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

    def forward(self, input_ids, attention_mask, temperature: float = 1.0, positions=None):
        return token_logprobs(self.lm, input_ids, attention_mask, temperature, positions)


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
