"""What the tools that only generate (evaluate.py, `psyrl build`) share after their options
(psyrl.core.generation_options): one start-up, a sampler on a checkpoint's own weights, and one
error message per failure from rank 0."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import transformers

from psyrl.core.config import ModelConfig
from psyrl.core.generation_options import GenerationOptions, flag
from psyrl.runtime.distributed import Dist, init_distributed, resolve_dtype
from psyrl.runtime.model import (
    autocast,
    load_model,
    load_tokenizer,
    model_config,
    model_fingerprint,
)
from psyrl.runtime.sampler import TorchSampler
from psyrl.runtime.vllm_sampler import VLLMSampler, check_tensor_parallel, import_vllm


# ---------------------------------------------------------------- start-up
def start_generation(gen: GenerationOptions) -> Dist:
    """The ranks of a generating tool, before any input is read: vLLM imported first when it
    generates, torchrun joined, --tensor-parallel checked against the ranks."""
    transformers.utils.logging.disable_progress_bar()  # no "Loading weights" bar per rank
    if gen.engine == "vllm":
        import_vllm()  # before anything starts
    dist = init_distributed(gen.device)
    if gen.engine == "vllm":
        check_tensor_parallel(
            gen.tensor_parallel, dist.world, flag("tensor_parallel"), dist.local_world
        )
    return dist


@dataclass
class Generation:
    """A generating tool after start-up: its ranks and options, the checkpoint's tokenizer and model
    config (the model itself loads in `make_sampler`, once there is something to generate)."""

    dist: Dist
    gen: GenerationOptions
    model_cfg: ModelConfig
    tokenizer: object
    settings: dict
    """What the samples depend on (the model by path and fingerprint, the dtype resolved); a tool
    records the keys a resume must share."""

    def make_sampler(self):
        """The sampler interface on the checkpoint's own weights: psyrl's torch sampler, or a vLLM
        engine that reads the checkpoint itself (no weight sync: nothing trains)."""
        gen, dist = self.gen, self.dist
        if gen.engine == "torch":
            model = load_model(self.model_cfg, self.tokenizer, device=dist.device)
            amp = autocast(self.model_cfg, dist.device)
            return TorchSampler(model, self.tokenizer, dist.device, gen.batch, amp=amp)
        architecture = model_config(self.model_cfg, self.tokenizer)
        return VLLMSampler(
            Path(gen.model),
            self.tokenizer,
            dist,
            dtype=self.model_cfg.dtype,
            max_model_len=architecture.max_position_embeddings,
            batch=gen.batch * gen.tensor_parallel,
            tensor_parallel=gen.tensor_parallel,
            gpu_memory_utilization=gen.gpu_memory_utilization,
            sleep=False,
            dummy_weights=False,
            temperature=gen.temperature,
            progress=gen.progress and dist.is_main,
        )


def load_generation(dist: Dist, gen: GenerationOptions) -> Generation:
    """The tokenizer and settings of --model, --dtype auto resolved for this device; the model
    itself is not read."""
    model = Path(gen.model)
    dtype = resolve_dtype(gen.dtype, dist.device)
    model_cfg = ModelConfig(path=str(model), tokenizer=gen.tokenizer, dtype=dtype)
    tokenizer = load_tokenizer(model_cfg)
    settings = {
        "model": str(model.resolve()),
        "model_fingerprint": model_fingerprint(model),
        "tokenizer": gen.tokenizer,
        "engine": gen.engine,
        "tensor_parallel": gen.tensor_parallel,
        "gpu_memory_utilization": gen.gpu_memory_utilization,
        "dtype": dtype,
        "temperature": gen.temperature,
        "top_p": gen.top_p,
        "max_new_tokens": gen.max_new_tokens,
        "seed": gen.seed,
        "samples": gen.samples,
    }
    return Generation(dist, gen, model_cfg, tokenizer, settings)
