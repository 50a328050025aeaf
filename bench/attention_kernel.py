"""Which attention kernel the trainer's passes take under a config on this device, measured: one
forward of the config's architecture (random weights) over a micro-batch of a few sequences, under
torch's profiler, counting the attention ops that ran. The dtypes are the loop's: one process
autocasts over float32 weights (psyrl/recipes/tgrpo.py, `amp`); FSDP2 ranks compute with parameters
in model.dtype and no autocast (MixedPrecisionPolicy), which `sharded` reproduces by casting the
parameters. Imported by bench/phase_memory.py and bench/gpu_check.py, which call it after their
training runs (its CUDA memory would otherwise count in their device readings).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Sequence

import torch
from torch.profiler import ProfilerActivity, profile

from psyrl.core.config import ModelConfig
from psyrl.runtime.distributed import cast_parameters
from psyrl.runtime.model import autocast, collate, load_model, load_tokenizer, pack, token_logprobs

VARLEN_OP = "torch_attn::_varlen_attn"  # torch/nn/attention/varlen.py:45, FlashAttention-2 varlen
SDPA_OP = "aten::scaled_dot_product_attention"
LENGTHS = (48, 80, 32, 64)  # the probe's sequences, half prompt and half response each


def attention_calls(run: Callable[[], object]) -> dict[str, int]:
    """How many times each attention op ran during `run()`: {"varlen": n, "sdpa": m}."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        run()
    counts = Counter(event.name for event in prof.events())
    return {"varlen": counts[VARLEN_OP], "sdpa": counts[SDPA_OP]}


def describe(calls: dict[str, int], layers: int, sequences: int, packing: bool, cuda: bool) -> str:
    """One line naming the kernel from the op counts of one forward over `sequences` sequences."""
    varlen, sdpa = calls["varlen"], calls["sdpa"]
    if not packing and sdpa == layers and not varlen:
        return f"padded batch, transformers' SDPA with the padding mask ({sdpa} calls, 1 per layer)"
    if packing and varlen == layers and not sdpa:
        return f"varlen (FlashAttention-2 varlen, {varlen} calls, 1 per layer)"
    if packing and sdpa == layers * sequences and not varlen:
        sync = ", a device sync per layer" if cuda else ""
        return (
            f"per-sequence SDPA loop ({sdpa} calls: {sequences} sequences x {layers} layers{sync})"
        )
    return f"unexpected: {varlen} varlen and {sdpa} SDPA calls for {sequences} x {layers} layers"


def attention_kernel(
    cfg: ModelConfig, device: torch.device, sharded: bool, lengths: Sequence[int] = LENGTHS
) -> str:
    """`describe` of one forward of `cfg`'s model on `device`, in the dtypes of a run of one
    process (`sharded` False) or of FSDP2 ranks (True), packed when cfg.packing."""
    calls, layers = forward_calls(cfg, device, sharded, lengths)
    if device.type == "cuda":
        torch.cuda.empty_cache()  # the probe's model is gone: its blocks go back to the device
    kernel = describe(calls, layers, len(lengths), cfg.packing, device.type == "cuda")
    return f"{kernel}; {passes(cfg.dtype, sharded)}"


def passes(dtype: str, sharded: bool) -> str:
    """How a run's passes compute: FSDP2 parameters in model.dtype, or one process autocasting."""
    if sharded:
        return f"FSDP2 parameters in {dtype}"
    if dtype == "float32":
        return "one process, float32"
    return f"one process, {dtype} autocast over float32 weights"


def forward_calls(
    cfg: ModelConfig, device: torch.device, sharded: bool, lengths: Sequence[int]
) -> tuple[dict[str, int], int]:
    """`attention_calls` of one forward over sequences of `lengths`, and the model's layers."""
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, tokenizer, seed=0, device=device)
    if sharded:
        cast_parameters(model, cfg.dtype)
    amp = contextlib.nullcontext() if sharded else autocast(cfg, device)
    g = torch.Generator().manual_seed(0)
    ids = [torch.randint(10, 1000, (n,), generator=g).tolist() for n in lengths]
    prompts = [n // 2 for n in lengths]
    if cfg.packing:
        args = (pack(ids, prompts).to(device), None)
    else:
        input_ids, attention_mask, _ = collate(ids, prompts, tokenizer.pad_token_id)
        args = (input_ids.to(device), attention_mask.to(device))

    def forward():
        with torch.no_grad(), amp:
            token_logprobs(model, *args)
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    return attention_calls(forward), model.config.num_hidden_layers
