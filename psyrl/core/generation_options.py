"""The generating tools' options (evaluate.py, `psyrl build`): one set of generation settings, named
and checked by the config keys they stand for ([model], [run], [sampler], [rollout], [log]), so the
tools and the trainers share one configuration vocabulary. The command line makes its click options
from `OPTION_KEYS` (`psyrl.cli.options`); the start-up that uses the values is
psyrl.runtime.generation."""

from __future__ import annotations

import re
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
    """The config key an option stands for: its type, default and --help come from the key, and the
    tool refuses what the key's table refuses."""

    table: type
    key: str
    cut: str | None = None
    """Where the key's docstring stops holding for a tool that only generates."""
    note: str = ""
    """What holds instead, for both tools."""

    def default(self):
        return getattr(self.table(), self.key)


OPTION_KEYS = {
    "model": OptionKey(ModelConfig, "path", cut="; empty"),
    "temperature": OptionKey(
        RolloutConfig, "valid_temperature", cut=" of validation", note="0 = greedy."
    ),
    "top_p": OptionKey(RolloutConfig, "top_p", cut=", for training"),
    "max_new_tokens": OptionKey(RolloutConfig, "max_new_tokens"),
    "samples": OptionKey(RolloutConfig, "samples"),
    "seed": OptionKey(RunConfig, "seed"),
    "batch": OptionKey(
        SamplerConfig,
        "batch",
        note="Also the prompts each rank generates per round, with either engine.",
    ),
    "tokenizer": OptionKey(ModelConfig, "tokenizer", cut=", or `tiny` when"),
    "dtype": OptionKey(
        ModelConfig,
        "dtype",
        cut="; master",
        note="bfloat16: autocast with torch, the engine dtype with vllm; "
        "auto = bfloat16 on CUDA, float32 on a CPU.",
    ),
    "device": OptionKey(RunConfig, "device", note="Under torchrun, rank r takes GPU r."),
    "engine": OptionKey(SamplerConfig, "engine", cut=" Both take"),
    "tensor_parallel": OptionKey(SamplerConfig, "tensor_parallel"),
    "gpu_memory_utilization": OptionKey(SamplerConfig, "gpu_memory_utilization"),
    "progress": OptionKey(LogConfig, "progress"),
}
# where both tools differ from the trainers' config: --model has no default, one generation per
# prompt, smaller batches, and --dtype auto
TOOL_DEFAULTS = {"model": None, "samples": 1, "batch": 16, "dtype": "auto"}
CHECKED = (
    "temperature",
    "top_p",
    "max_new_tokens",
    "samples",
    "batch",
    "tensor_parallel",
    "gpu_memory_utilization",
)  # not --seed: the tools take any int, run.seed only >= 0


def flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def option_problems(gen: GenerationOptions) -> list[str]:
    """`--top-p must be in (0, 1]`, ... for each option whose config key refuses its value."""
    problems = []
    for name in CHECKED:
        spec = OPTION_KEYS[name]
        try:
            spec.table(**{spec.key: getattr(gen, name)})
        except FieldError as e:
            problems.append(f"{flag(name)} must be {_bound(e)}")
    return problems


def _bound(error: FieldError) -> str:
    """The tools' words for a table's bound: `expected >= 1, got 0` -> `>= 1`, `expected 0 < top_p
    <= 1, got 0` -> `in (0, 1]`."""
    wanted = error.message.split(", got ")[0].removeprefix("expected ")
    interval = re.fullmatch(rf"(\S+) (<=?) {error.key} (<=?) (\S+)", wanted)
    if interval:
        low, low_op, high_op, high = interval.groups()
        opening, closing = "[" if low_op == "<=" else "(", "]" if high_op == "<=" else ")"
        return f"in {opening}{low}, {high}{closing}"
    return wanted
