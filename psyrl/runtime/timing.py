"""What a step costs: wall seconds per named phase and the peak memory (the accelerator's on CUDA,
the process's resident set on a CPU), for the `time/` and `perf/` keys of metrics.jsonl."""

from __future__ import annotations

import contextlib
import resource
import sys
import time

import torch


def peak_memory_gib(device: torch.device) -> float:
    """Peak accelerator memory on CUDA, else the process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return kib / (2**30 if sys.platform == "darwin" else 2**20)


class PhaseTimer:
    """Wall seconds of each named phase of a step, `with timer("sample"): ...` (a name timed twice
    adds up), and on CUDA the peak memory the trainer's allocator held in each phase (EasyR1's
    `timer` around each phase of `fit`)."""

    def __init__(self, device: torch.device | None = None):
        self.start = time.perf_counter()
        self.seconds: dict[str, float] = {}
        self.peaks: dict[str, float] = {}
        self.cuda = device is not None and device.type == "cuda"
        self.device = device

    @contextlib.contextmanager
    def __call__(self, name: str):
        if self.cuda:
            torch.cuda.reset_peak_memory_stats(self.device)
        began = time.perf_counter()
        yield
        self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - began
        if self.cuda:
            peak = torch.cuda.max_memory_allocated(self.device) / 2**30
            self.peaks[name] = max(self.peaks.get(name, 0.0), peak)

    def row(self) -> dict[str, float]:
        """`time/<phase>` of each timed phase, `time/step` (the whole step so far), on CUDA
        `perf/peak_gib/<phase>`."""
        return {
            **{f"time/{k}": v for k, v in self.seconds.items()},
            "time/step": time.perf_counter() - self.start,
            **{f"perf/peak_gib/{k}": v for k, v in self.peaks.items()},
        }
