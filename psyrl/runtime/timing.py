"""What a step costs: wall seconds per named phase and the memory it held, for the `time/` and
`perf/` keys of metrics.jsonl.

Memory on CUDA is read two ways, never mixed under one key:
  * `perf/device_used_gib/<phase>`: the device's memory in use, total - free from cudaMemGetInfo:
    every process and allocator, the CUDA context and NCCL included; a sleeping vLLM pool counts
    only for the pages it still has mapped.
  * `perf/trainer_alloc_peak_gib/<phase>`: the peak of this process's torch allocator during the
    phase, less what vLLM's sleep-mode pools hold. Those pools live in torch's allocator
    (vllm/device_allocator/cumem.py:83-84 in vLLM 0.32: a `MemPool` under `use_mem_pool`), and
    sleep only unmaps their physical pages (cumem.py:256-278: the tensors stay allocated), so
    `max_memory_allocated` alone would count the sleeping engine's weights and KV cache in every
    phase (about 41 GiB for 3B).
A phase's device memory is read at its two ends only (cudaMemGetInfo has no peak), and the vLLM
sampler wakes, generates and sleeps inside the sample phase: the sampler reads the device itself
where the footprint is, `perf/device_used_gib/sample_before_sleep` and `.../sync_before_free`
(`VLLMSampler.memory_row`). On a CPU, `peak_memory_gib` is the process's peak resident set."""

from __future__ import annotations

import contextlib
import resource
import sys
import time
from collections.abc import Callable

import torch

from psyrl.runtime.distributed import all_reduce


def peak_memory_gib(device: torch.device) -> float:
    """The peak torch allocator memory on CUDA (right where no vLLM engine shares the process, as in
    SFT), else the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return kib / (2**30 if sys.platform == "darwin" else 2**20)


def device_memory_gib(device: torch.device) -> tuple[float, float] | None:
    """(used, total) GiB of the device from cudaMemGetInfo, every process and allocator counted;
    None on a CPU (and for a CUDA device in a build without CUDA, as a test's stand-in has)."""
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    free, total = torch.cuda.mem_get_info(device)
    return (total - free) / 2**30, total / 2**30


class PhaseTimer:
    """Wall seconds of each named phase of a step, `with timer("sample"): ...` (a name timed twice
    adds up; EasyR1's `timer` around each phase of `fit`). On CUDA the device is synchronised at
    both ends of a phase, so that the kernels a phase queued (the optimiser step) are billed to it
    and not to the next one (the offload), and each phase records the device memory in use (the
    larger of its start and end: cudaMemGetInfo has no peak) and the trainer's allocator peak;
    `pool_bytes` gives what the sampler's own pools hold in that allocator (module doc)."""

    def __init__(
        self, device: torch.device | None = None, pool_bytes: Callable[[], int] | None = None
    ):
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.device_used: dict[str, float] = {}
        self.alloc_peaks: dict[str, float] = {}
        self.cuda = device is not None and device.type == "cuda"
        self.device = device
        self.pool_bytes = pool_bytes or (lambda: 0)

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.cuda:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            used = device_memory_gib(self.device)[0]
        began = time.perf_counter()
        yield
        if self.cuda:
            torch.cuda.synchronize(self.device)
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began
        if self.cuda:
            used = max(used, device_memory_gib(self.device)[0])
            self.device_used[name] = max(self.device_used.get(name, 0.0), used)
            own = (torch.cuda.max_memory_allocated(self.device) - self.pool_bytes()) / 2**30
            self.alloc_peaks[name] = max(self.alloc_peaks.get(name, 0.0), own)

    def row(self, dist=None, inside: dict[str, float] | None = None) -> dict[str, float]:
        """`time/<phase>` of each timed phase, `time/step` (the whole step so far), on CUDA
        `perf/device_used_gib/<phase>` and `perf/trainer_alloc_peak_gib/<phase>`; with `dist`, the
        step's peaks as one value each, the largest over ranks: on CUDA `perf/device_used_gib`
        (the device in use, the sampler's readings `inside` its phases counted: the phase ends miss
        them) and `perf/trainer_alloc_peak_gib`, never one read as the other; on a CPU
        `perf/peak_mem_gib`, the peak RSS. `inside` (VLLMSampler.memory_row) is reduced too: GiB
        free before the engine's wakes to the least over ranks (`perf/free_gib...`), in use to the
        largest."""
        row = {
            **{f"time/{k}": v for k, v in self.seconds.items()},
            "time/step": time.perf_counter() - self.start,
            **{f"perf/device_used_gib/{k}": v for k, v in self.device_used.items()},
            **{f"perf/trainer_alloc_peak_gib/{k}": v for k, v in self.alloc_peaks.items()},
        }
        if dist is None:
            return row
        inside = inside or {}
        if self.cuda:
            used = [v for k, v in inside.items() if k.startswith("perf/device_used_gib/")]
            peaks = {
                "perf/device_used_gib": max([*self.device_used.values(), *used]),
                "perf/trainer_alloc_peak_gib": max(self.alloc_peaks.values()),
            }
        else:
            peaks = {"perf/peak_mem_gib": peak_memory_gib(self.device)}
        for key, value in {**peaks, **inside}.items():
            op = "min" if key.startswith("perf/free_gib") else "max"
            row[key] = float(all_reduce(torch.tensor(value), dist, op))
        return row
