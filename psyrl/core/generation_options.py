"""The generating tools' options (evaluate.py, `psyrl build`): one set of generation settings, named
and checked by the config keys they stand for ([model], [run], [sampler], [rollout], [log]), so the
tools and the trainers share one configuration vocabulary. The command line makes its click options
from `OPTION_KEYS` (`psyrl.cli.options`); the start-up that uses the values is
psyrl.runtime.generation."""

from __future__ import annotations

from dataclasses import dataclass

from psyrl.core.config import LogConfig, ModelConfig, RolloutConfig, RunConfig, SamplerConfig
from psyrl.core.tomlconf import FieldError


@dataclass(frozen=True)
class GenerationOptions:
    """A generating tool's command line: one field per option (`--top-p`: top_p), --help's order."""

    model: str | None
    temperature: float
    top_p: float
    max_new_tokens: int
    samples: int
    seed: int
    batch: int
    tokenizer: str
    dtype: str
    """auto, float32 or bfloat16."""
    device: str
    engine: str
    tensor_parallel: int
    gpu_memory_utilization: float
    progress: bool


@dataclass(frozen=True)
class OptionKey:
    """The config key an option stands for: the option's type and default come from the key, and the
    key's table judges its value. The help and the bound are the option's own, written for the tools
    (which only generate), so --help and the errors say them as they are."""

    table: type
    key: str
    help: str
    bound: str = ""
    """What the key's table accepts, in the error's words (`>= 1`); empty: not checked."""

    def default(self):
        return getattr(self.table(), self.key)

    def accepts(self, value) -> bool:
        try:
            self.table(**{self.key: value})
        except FieldError:
            return False
        return True


OPTION_KEYS = {
    "model": OptionKey(
        ModelConfig, "path", "Local Hugging Face causal-LM directory (e.g. Qwen2.5-0.5B-Instruct)."
    ),
    "temperature": OptionKey(
        RolloutConfig, "valid_temperature", "Sampling temperature. 0 = greedy.", ">= 0"
    ),
    "top_p": OptionKey(RolloutConfig, "top_p", "Nucleus sampling mass (A.3: 0.99).", "in (0, 1]"),
    "max_new_tokens": OptionKey(
        RolloutConfig, "max_new_tokens", "Longest generated response in tokens (A.3: 2048).", ">= 1"
    ),
    "samples": OptionKey(
        RolloutConfig, "samples", "G: responses sampled per prompt (A.3: 5).", ">= 1"
    ),
    # not bounded: the tools take any int, run.seed only >= 0
    "seed": OptionKey(
        RunConfig,
        "seed",
        "Seed of every random generator of the run (data order, sampling, init).",
    ),
    "batch": OptionKey(
        SamplerConfig,
        "batch",
        "torch: sequences generated together (whole prompts: a prompt's G responses stay "
        "together). Also the prompts each rank generates per round, with either engine.",
        ">= 1",
    ),
    "tokenizer": OptionKey(
        ModelConfig,
        "tokenizer",
        "`tiny` (psyrl's small BPE), `qwen2.5` (shipped Qwen2.5 files), or a directory; empty = "
        "the model directory's own tokenizer.",
    ),
    "dtype": OptionKey(
        ModelConfig,
        "dtype",
        "Compute dtype (A.3/A.4: bf16). bfloat16: autocast with torch, the engine dtype with vllm; "
        "auto = bfloat16 on CUDA, float32 on a CPU.",
    ),
    "device": OptionKey(
        RunConfig,
        "device",
        "Where the model computes: `auto` takes CUDA when available, else the CPU. Under torchrun, "
        "rank r takes GPU r.",
    ),
    "engine": OptionKey(
        SamplerConfig,
        "engine",
        "What generates responses: `torch` (psyrl's own sampler on an unsharded copy of the model, "
        "KV cache, exact top-p; CPUs and tests) or `vllm` (a vLLM 0.32 engine colocated in every "
        "torchrun rank, `psyrl.runtime.vllm_sampler`; GPU nodes, `pip install -e '.[vllm]'`).",
    ),
    "tensor_parallel": OptionKey(
        SamplerConfig,
        "tensor_parallel",
        "vllm: ranks that hold one engine together (consecutive ranks; A.3: 2 on 4 GPUs). Must "
        "divide the ranks.",
        ">= 1",
    ),
    "gpu_memory_utilization": OptionKey(
        SamplerConfig,
        "gpu_memory_utilization",
        "vllm: the fraction of each GPU the engine may take for weights and KV cache while awake "
        "(A.3: 0.8).",
        "in (0, 1]",
    ),
    "progress": OptionKey(LogConfig, "progress", "Show tqdm progress bars (rank 0)."),
}
# where both tools differ from the trainers' config: --model has no default, one generation per
# prompt, smaller batches, and --dtype auto
TOOL_DEFAULTS = {"model": None, "samples": 1, "batch": 16, "dtype": "auto"}


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def option_problems(gen: GenerationOptions) -> list[str]:
    """`--top-p must be in (0, 1]`, ... for each option whose config key's table refuses its
    value."""
    return [
        f"{flag(name)} must be {spec.bound}"
        for name, spec in OPTION_KEYS.items()
        if spec.bound and not spec.accepts(getattr(gen, name))
    ]
