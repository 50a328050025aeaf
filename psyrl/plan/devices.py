"""`psyrl plan`'s devices: one accelerator's figures (FLOP/s, memory and link bandwidths, from
its datasheet) and the fraction of each a run reaches, the table of GPUs the step-time model
(psyrl/plan/speed.py) knows, and `--device cpu`, this machine measured now.

Torch-free at import: only `measure_cpu` imports torch.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # architecture.py reads config.json through transformers, which imports torch
    from psyrl.plan.architecture import Shapes

GB = 1e9
# the fraction of its own microbenchmarks (matmul at the model's shapes, a fresh-tensor copy) that a
# CPU's eager training and sampling reach: fresh activations, cache misses, one operation after
# another. The one figure of the model set from measurement: bench/plan_calibration.py on this
# repository's 2-core development machine (tiny config, 2026-12-03) found the run at 0.63-0.87 x
# its roofline per phase at 100 %, so 0.7; it is printed with every `--device cpu` plan
CPU_UTIL = 0.7


@dataclass(frozen=True)
class Device:
    """One accelerator's figures and the fraction of each a run achieves (printed with the plan)."""

    name: str
    flops: float
    """Dense FLOP/s at the training dtype (bf16 tensor cores; `cpu`: measured float32 matmul)."""
    memory_bw: float
    """Device memory bandwidth, B/s."""
    host_link: float
    """Host link (PCIe) bandwidth, B/s per direction."""
    peer: float
    """GPU-to-GPU bandwidth, B/s per direction (NVLink, or PCIe through the switch/host)."""
    memory_gib: float
    source: str
    """Where the figures come from."""
    mfu: float = 0.40
    """Fraction of `flops` that training and prefill reach (assumption: 35-50 % is what FSDP
    trainers report for 1-10B models)."""
    bw_util: float = 0.70
    """Fraction of `memory_bw` that a decode step reaches (assumption)."""
    link_util: float = 0.75
    """Fraction of `host_link` and `peer` that copies and collectives reach (assumption: PCIe 4.0
    x16 moves about 24 of its 32 GB/s)."""
    layer_overhead: float = 0.0
    """Seconds the eager framework spends on one decoder layer's call besides its arithmetic, and
    `call_overhead` on the rest of a model call (measured on `cpu`; 0 on a GPU, where kernels
    launch asynchronously and vLLM replays CUDA graphs)."""
    call_overhead: float = 0.0

    def assumptions(self) -> str:
        return (
            f"{self.name}: {self.flops / 1e12:.3g} TFLOP/s dense, memory {self.memory_bw / GB:.4g} "
            f"GB/s, host link {self.host_link / GB:.3g} GB/s, GPU-to-GPU {self.peer / GB:.3g} GB/s "
            f"({self.source}); utilisation assumed: compute {self.mfu:.0%}, memory "
            f"{self.bw_util:.0%}, links {self.link_util:.0%}"
            + (
                f"; eager overhead {self.layer_overhead * 1e3:.2f} ms per decoder layer call and "
                f"{self.call_overhead * 1e3:.2f} ms per model call"
                if self.layer_overhead
                else ""
            )
        )


# Public spec-sheet values (NVIDIA datasheets, dense bf16 tensor-core figures, i.e. without the
# 2:4 sparsity doubling). PCIe 4.0 x16: 32 GB/s per direction; PCIe 5.0 x16: 64 GB/s. GPUs without
# NVLink (A6000 without its bridge, L20) talk over PCIe: `peer` = the host link.
DEVICES = {
    "a6000": Device(
        "a6000",
        154.8e12,
        768 * GB,
        32 * GB,
        32 * GB,
        48,
        "NVIDIA RTX A6000 datasheet: 154.8 TFLOPS bf16/fp16 tensor with fp32 accumulate, 768 GB/s "
        "GDDR6, PCIe 4.0 x16; peer over PCIe (no NVLink bridge, the paper's node)",
    ),  # fmt: skip
    "a100-40": Device(
        "a100-40",
        312e12,
        1555 * GB,
        32 * GB,
        300 * GB,
        40,
        "NVIDIA A100 Tensor Core GPU datasheet (SXM4 40GB): 312 TFLOPS bf16, 1,555 GB/s HBM2, "
        "NVLink 600 GB/s (300 per direction), PCIe 4.0 x16",
    ),  # fmt: skip
    "a100-80": Device(
        "a100-80",
        312e12,
        2039 * GB,
        32 * GB,
        300 * GB,
        80,
        "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB): 312 TFLOPS bf16, 2,039 GB/s HBM2e, "
        "NVLink 600 GB/s (300 per direction), PCIe 4.0 x16",
    ),  # fmt: skip
    "h100": Device(
        "h100",
        989e12,
        3350 * GB,
        64 * GB,
        450 * GB,
        80,
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5): 989 TFLOPS bf16 dense (1,979 with "
        "sparsity), 3.35 TB/s HBM3, NVLink 900 GB/s (450 per direction), PCIe 5.0 x16",
    ),  # fmt: skip
    "h200": Device(
        "h200",
        989e12,
        4800 * GB,
        64 * GB,
        450 * GB,
        141,
        "NVIDIA H200 Tensor Core GPU datasheet (SXM): 989 TFLOPS bf16 dense, 4.8 TB/s HBM3e, "
        "141 GB, NVLink 900 GB/s (450 per direction), PCIe 5.0 x16",
    ),  # fmt: skip
    "l20": Device(
        "l20",
        119.5e12,
        864 * GB,
        32 * GB,
        32 * GB,
        48,
        "NVIDIA L20 product brief: 119.5 TFLOPS bf16 tensor (dense), 864 GB/s GDDR6, 48 GB, "
        "PCIe 4.0 x16, no NVLink: peer over PCIe",
    ),  # fmt: skip
}
DEVICE_NAMES = (*DEVICES, "cpu")


def measure_cpu(seconds: float = 3.0, sh: Shapes | None = None) -> Device:
    """This machine as a device, in about `seconds`: float32 matmul FLOP/s (with `sh`: of the
    architecture's own matrices, 2,048 tokens through a decoder layer's projections and the LM
    head, FLOP-weighted, since a CPU's rate depends on the shape; else the median over 256, 512
    and 1024 squares); memory bandwidth as an eager operation sees it (a 16 MiB copy into a
    freshly allocated tensor: read + write, page faults included, as every torch operation
    allocates its output); and the eager framework's overhead, from a 1-token decode step of a
    64-wide transformers Qwen2 (vocabulary 64, a padding mask and positions, as psyrl's sampler
    calls it) with 1 and with 5 decoder layers: their difference is four layers' cost, the rest the
    model call's. Each figure is the mean wall time of repeated calls, like the run's own laps, so
    that another process on the core slows both alike. Host link and GPU-to-GPU: the same bandwidth
    (a move is a copy within RAM). Uses torch's current thread count."""
    import torch
    from transformers import DynamicCache, Qwen2Config, Qwen2ForCausalLM

    budget = seconds / 6

    def timed(fn) -> float:
        """Mean wall seconds per call over about `budget`."""
        fn()  # warm-up
        n, began = 0, time.perf_counter()
        while time.perf_counter() - began < budget or n < 5:
            fn()
            n += 1
        return (time.perf_counter() - began) / n

    if sh is None:
        rates = []
        for size in (256, 512, 1024):
            a, b = torch.randn(size, size), torch.randn(size, size)
            rates.append(2 * size**3 / timed(lambda a=a, b=b: a @ b))
        flops, what = sorted(rates)[1], "median of 256/512/1024 squares"
    else:
        # [tokens, in] @ [in, out] for q/k/v/o, gate/up/down and the head, as the model runs them
        weights = [s for s in sh.layer if len(s) == 2] + [(sh.vocab, sh.hidden)]
        pairs = [(torch.randn(2048, s[1]), torch.randn(s[1], s[0])) for s in weights]
        work = sum(2 * 2048 * s[0] * s[1] for s in weights)
        flops = work / timed(lambda: [x @ w for x, w in pairs])
        what = "the architecture's own matrices (2,048 tokens)"
    src = torch.randn(4 * 2**20)  # 16 MiB of float32
    bandwidth = 2 * src.numel() * 4 / timed(lambda: torch.empty_like(src).copy_(src))

    def decode_step(layers: int) -> float:
        torch.manual_seed(0)
        config = Qwen2Config(
            hidden_size=64,
            num_hidden_layers=layers,
            num_attention_heads=2,
            num_key_value_heads=1,
            intermediate_size=128,
            vocab_size=64,
            tie_word_embeddings=True,
        )
        model = Qwen2ForCausalLM(config).eval()
        # as psyrl's sampler calls it: a padding mask and positions
        ids, cache = torch.zeros(1, 16, dtype=torch.long), DynamicCache(config=config)
        mask, positions = torch.ones(1, 17, dtype=torch.long), torch.arange(17)[None]
        with torch.no_grad():
            model(ids, mask[:, :16], positions[:, :16], past_key_values=cache, logits_to_keep=1)
            return timed(
                lambda: model(
                    ids[:, :1], mask, positions[:, 16:], past_key_values=cache, logits_to_keep=1
                )
            )

    one, five = decode_step(1), decode_step(5)
    layer = max((five - one) / 4, 0.0)
    return Device(
        "cpu",
        flops,
        bandwidth,
        bandwidth,
        bandwidth,
        0.0,
        f"measured here on {torch.get_num_threads()} thread(s): float32 matmul, {what}; a 16 MiB "
        "copy into a fresh tensor; a 1-token Qwen2 decode step",
        mfu=CPU_UTIL,
        bw_util=CPU_UTIL,
        link_util=1.0,
        layer_overhead=layer,
        call_overhead=max(one - layer, 0.0),
    )


def device(name: str, sh: Shapes | None = None) -> Device:
    """A device of the table, or `cpu` measured now (at the shapes of `sh`, when given)."""
    if name == "cpu":
        return measure_cpu(sh=sh)
    if name not in DEVICES:
        raise ValueError(f"unknown device {name!r}: one of {', '.join(DEVICE_NAMES)}")
    return DEVICES[name]
