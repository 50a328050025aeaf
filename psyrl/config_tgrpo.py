"""The T-GRPO tables of the run configuration: reward, cache, advantage, loss, rollout, sampler (SPEC §2-4, §9).

Part of `psyrl.config` (the root `Config` and the loaders live there), split off to keep both
files short; same conventions: a docstring under every field, range checks in `__post_init__`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from psyrl.tomlconf import check_choices, require


@dataclass
class RewardConfig:
    variant: Literal["base", "length", "short", "length_rp", "bilateral"] = "bilateral"
    """Final reward: `base` (eq. 11), `length` (eq. 12-13), `short` (eq. 12, 14), `length_rp` (eq. 15),
    `bilateral` (eq. 3, the paper's BR)."""
    w_f1: float = 0.5
    """Weight of the answer F1, w^F1 (eq. 3). Not stated in the paper: EasyR1's r1v scorer weighs accuracy 0.5."""
    w_fmt: float = 0.5
    """Weight of the format reward, w^fmt (eq. 3). Not stated in the paper: EasyR1's r1v scorer weighs format 0.5."""
    w_len: float = 0.1
    """Weight of the length reward, w^length (eq. 12, 15). Not stated in the paper."""
    w_short: float = 0.1
    """Weight of the short reward, w^short (eq. 12). Not stated in the paper."""
    delta: float = 0.1
    """Bilateral bonus delta for a short or long response that beats the mean F1 (eq. 8). Not stated in the paper."""
    tau_low: float = 0.75
    """tau_-: L/L-bar below this counts as short (eq. 8). Not stated in the paper."""
    tau_high: float = 1.25
    """tau_+: L/L-bar above this counts as long (eq. 8). Not stated in the paper."""
    l_plus: float = 2.0
    """L_+: the length reward is 0 when L/L-bar exceeds this (eq. 13). Not stated in the paper."""
    s_minus: float = 0.5
    """S_-: the short reward is 0 when L/L-bar is below this (eq. 14). Not stated in the paper."""
    tau_rep: float = 0.5
    """tau_rep: cap of the repetition penalty (eq. 9). Not stated in the paper."""
    eps: float = 1e-6
    """epsilon of eq. 9 and of r_F1/(r-bar_F1 + eps) in eq. 13-14. Not stated in the paper."""
    short_reward_literal: bool = False
    """Eq. 14 as printed (reward grows with L/L-bar) instead of SPEC §2's reading (grows with L-bar/L)."""

    def __post_init__(self):
        check_choices(self)
        for key in ("w_f1", "w_fmt", "w_len", "w_short", "delta", "tau_rep"):
            require(getattr(self, key) >= 0, key, f"expected >= 0, got {getattr(self, key)}")
        require(0 < self.tau_low <= 1, "tau_low", f"expected 0 < tau_low <= 1, got {self.tau_low}")
        require(self.tau_high >= 1, "tau_high", f"expected >= 1, got {self.tau_high}")
        require(self.l_plus > 0, "l_plus", f"expected > 0, got {self.l_plus}")
        require(self.s_minus > 0, "s_minus", f"expected > 0 (L-bar/L needs L > 0), got {self.s_minus}")
        require(self.eps > 0, "eps", f"expected > 0, got {self.eps}")


@dataclass
class CacheConfig:
    size: int = 4
    """C, the number of recent steps the trajectory cache keeps (B_c = B x C, section 3.2). Not stated in the paper."""

    def __post_init__(self):
        require(self.size >= 1, "size", f"expected >= 1, got {self.size}")


@dataclass
class AdvantageConfig:
    scope: Literal["cache", "batch", "group"] = "cache"
    """Pool of eq. 2's mean and std: `cache` (paper), `batch` (current step), `group` (standard GRPO, per prompt)."""
    eps: float = 1e-6
    """epsilon of eq. 2 (verl's GRPO value)."""

    def __post_init__(self):
        check_choices(self)
        require(self.eps > 0, "eps", f"expected > 0, got {self.eps}")


@dataclass
class LossConfig:
    eps_low: float = 0.2
    """Lower clip range: the ratio is clipped below at 1 - eps_low (eq. 1; EasyR1 v0.3.1 default)."""
    eps_high: float = 0.3
    """Upper clip range: the ratio is clipped above at 1 + eps_high (eq. 1 has eps_high = eps_low; EasyR1 uses 0.3)."""
    dual_clip: float = 3.0
    """Dual-clip c: for negative advantages the loss is capped at -c*A; 0 disables it (eq. 1 as printed)."""
    kl_coef: float = 1e-2
    """beta: weight of the low-variance KL to the reference model in the loss (eq. 1; A.3)."""

    def __post_init__(self):
        require(0 <= self.eps_low < 1, "eps_low", f"expected 0 <= eps_low < 1, got {self.eps_low}")
        require(self.eps_high >= 0, "eps_high", f"expected >= 0, got {self.eps_high}")
        require(
            self.dual_clip == 0 or self.dual_clip > 1, "dual_clip", f"expected 0 (off) or > 1, got {self.dual_clip}"
        )
        require(self.kl_coef >= 0, "kl_coef", f"expected >= 0, got {self.kl_coef}")


@dataclass
class RolloutConfig:
    prompts: int = 512
    """B: prompts sampled per step, over all ranks (A.3 rollout batch: 512); a multiple of optim.global_batch, each
    mini-batch of global_batch prompts being one update (SPEC §9)."""
    samples: int = 5
    """G: responses sampled per prompt (A.3: 5)."""
    temperature: float = 1.0
    """Sampling temperature of training responses (A.3: 1.0); every trainer forward divides logits by it."""
    top_p: float = 0.99
    """Nucleus sampling mass (A.3: 0.99), for training samples and validation alike."""
    max_new_tokens: int = 2048
    """Longest generated response in tokens (A.3: 2048)."""
    max_prompt_tokens: int = 2048
    """Training prompts longer than this many tokens are filtered out and counted (A.3: max prompt 2048)."""
    valid_temperature: float = 0.5
    """Sampling temperature of validation generations (A.3: 0.5); 0 = greedy."""

    def __post_init__(self):
        for key in ("prompts", "samples", "max_new_tokens", "max_prompt_tokens"):
            require(getattr(self, key) >= 1, key, f"expected >= 1, got {getattr(self, key)}")
        require(self.temperature > 0, "temperature", f"expected > 0, got {self.temperature}")
        require(0 < self.top_p <= 1, "top_p", f"expected 0 < top_p <= 1, got {self.top_p}")
        require(self.valid_temperature >= 0, "valid_temperature", f"expected >= 0, got {self.valid_temperature}")


@dataclass
class SamplerConfig:
    engine: Literal["torch", "vllm"] = "torch"
    """What generates responses: `torch` (psyrl's own sampler on an unsharded copy of the model, KV cache, exact
    top-p; CPUs and tests) or `vllm` (a vLLM 0.32 engine colocated in every torchrun rank, `psyrl.vllm_sampler`;
    GPU nodes, `pip install -e '.[vllm]'`). Both take the weights from the trainer after every update."""
    batch: int = 64
    """torch: sequences generated together (whole prompts: a prompt's G responses stay together)."""
    max_num_seqs: int = 256
    """vllm: sequences the engine decodes together at most (vLLM's max_num_seqs; it schedules within it)."""
    tensor_parallel: int = 1
    """vllm: ranks that hold one engine together (consecutive ranks; A.3: 2 on 4 GPUs). Must divide the ranks."""
    gpu_memory_utilization: float = 0.8
    """vllm: the fraction of each GPU the engine may take for weights and KV cache while awake (A.3: 0.8)."""
    sleep: bool = True
    """vllm on GPUs: put the engine to sleep (level 1: weights to CPU, KV cache freed) between sampling and the
    next weight sync, so that the update has the GPU. Off = the engine keeps its memory throughout."""
    enforce_eager: bool = False
    """vllm: no CUDA graphs (less memory and a faster start, slower decoding)."""
    disable_custom_all_reduce: bool = True
    """vllm: NCCL instead of vLLM's custom all-reduce between the ranks of an engine (tensor_parallel > 1), as EasyR1
    (the paper's stack) and verl set it: the custom kernel needs GPU peer access, and on PCIe boards without NVLink
    (RTX A6000) it has been reported to hang. false = vLLM's default (faster on NVLink nodes)."""
    sync_bucket_mib: int = 512
    """Weight sync: parameters are cast to model.dtype on the device and all-gathered in buckets of about this many
    MiB (of the gathered tensors), each bucket streamed into the sampler before the next is gathered."""

    def __post_init__(self):
        check_choices(self)
        require(self.batch >= 1, "batch", f"expected >= 1, got {self.batch}")
        require(self.max_num_seqs >= 1, "max_num_seqs", f"expected >= 1, got {self.max_num_seqs}")
        require(self.tensor_parallel >= 1, "tensor_parallel", f"expected >= 1, got {self.tensor_parallel}")
        require(self.sync_bucket_mib >= 1, "sync_bucket_mib", f"expected >= 1, got {self.sync_bucket_mib}")
        require(0 < self.gpu_memory_utilization <= 1, "gpu_memory_utilization",
                f"expected 0 < gpu_memory_utilization <= 1, got {self.gpu_memory_utilization}")
