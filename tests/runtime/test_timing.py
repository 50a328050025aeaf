"""PhaseTimer and the device-memory readings: on a CPU no CUDA call at all; on CUDA (its runtime
calls stubbed with scripted values, which is all a CPU can check) a synchronise at both ends of a
phase, the device memory in use from cudaMemGetInfo and the trainer allocator's peak less the
sampler's pools, under keys of their own."""

import time
from types import SimpleNamespace

import pytest
import torch

from psyrl.runtime import timing, vllm_sampler
from psyrl.runtime.timing import PhaseTimer, device_memory_gib

GIB = 2**30


def forbid_cuda(monkeypatch):
    for name in (
        "synchronize",
        "reset_peak_memory_stats",
        "mem_get_info",
        "max_memory_allocated",
        "empty_cache",
    ):
        monkeypatch.setattr(torch.cuda, name, lambda *a, name=name, **k: pytest.fail(name))


def test_cpu_timer_makes_no_cuda_call(monkeypatch):
    forbid_cuda(monkeypatch)
    timer = PhaseTimer(torch.device("cpu"))
    with timer("update"):
        pass
    with timer("update"):  # a name timed twice adds up
        pass
    assert set(timer.row()) == {"time/update", "time/step"}
    assert device_memory_gib(torch.device("cpu")) is None
    assert timing.peak_memory_gib(torch.device("cpu")) > 0  # the peak resident set


class FakeCuda:
    """torch.cuda's calls as a log; `synchronize` at the end of a phase waits for the kernels the
    phase queued (here: `queued` seconds)."""

    def __init__(self, monkeypatch, free: list[int], peak: int):
        self.calls, self.free, self.peak, self.queued = [], list(free), peak, 0.0
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "synchronize", self.synchronize)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.log("reset"))
        monkeypatch.setattr(torch.cuda, "mem_get_info", self.mem_get_info)
        monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda d: self.peak)

    def log(self, name):
        return lambda *a: self.calls.append(name)

    def synchronize(self, device):
        self.calls.append("sync")
        time.sleep(self.queued)
        self.queued = 0.0

    def mem_get_info(self, device):
        self.calls.append("mem_get_info")
        return self.free.pop(0), 48 * GIB


def test_cuda_timer_synchronises_and_reads_memory_under_separate_keys(monkeypatch):
    # free 40 GiB at the start, 30 at the end: 18 GiB in use at most; the allocator peaked at 45 GiB
    # of which vLLM's sleeping pools hold 41
    cuda = FakeCuda(monkeypatch, [40 * GIB, 30 * GIB, 30 * GIB, 30 * GIB], 45 * GIB)
    timer = PhaseTimer(torch.device("cuda", 0), pool_bytes=lambda: 41 * GIB)
    with timer("update"):
        cuda.calls.append("body")
        cuda.queued = 0.2  # the optimiser step's kernels, still running when the body returns
    assert cuda.calls == ["sync", "reset", "mem_get_info", "body", "sync", "mem_get_info"]
    # billed to this phase, not to the next one
    assert timer.seconds["update"] >= 0.2
    with timer("offload"):
        pass
    assert timer.seconds["offload"] < 0.2
    row = timer.row()
    assert row["perf/device_used_gib/update"] == pytest.approx(18)
    assert row["perf/trainer_alloc_peak_gib/update"] == pytest.approx(4)
    assert not any("peak_mem" in k for k in row)


def test_cuda_timer_without_a_sampler_pool_counts_the_whole_allocator(monkeypatch):
    FakeCuda(monkeypatch, [40 * GIB, 40 * GIB], 3 * GIB)
    timer = PhaseTimer(torch.device("cuda", 0))
    with timer("logprobs"):
        pass
    assert timer.row()["perf/trainer_alloc_peak_gib/logprobs"] == pytest.approx(3)


def wake_sampler(device: str, events: list):
    sampler = object.__new__(vllm_sampler.VLLMSampler)
    sampler.dist = SimpleNamespace(device=torch.device(device))
    sampler.asleep, sampler.llm = {"weights", "kv_cache"}, None
    sampler.sleeps = False
    return sampler


def test_wake_notes_the_free_device_memory_first_on_cuda_only(monkeypatch):
    events = []
    monkeypatch.setattr(
        vllm_sampler, "engine_call", lambda llm, op, arg=None: events.append((op, arg)) or True
    )
    forbid_cuda(monkeypatch)
    cpu = wake_sampler("cpu", events)
    assert cpu._wake("kv_cache")
    assert cpu.memory_row() == {} and events == [("wake", "kv_cache")]
    events.clear()

    def memory(device):
        events.append("mem_get_info")
        return 8.0, 48.0

    monkeypatch.setattr(vllm_sampler, "device_memory_gib", memory)
    sampler = wake_sampler("cuda", events)
    assert sampler._wake("weights")
    assert events == ["mem_get_info", ("wake", "weights")]
    assert sampler.memory_row() == {"perf/free_gib_before_wake/weights": 40.0}
    assert sampler.asleep == {"kv_cache"} and sampler.pool_bytes() == 0
