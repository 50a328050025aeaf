"""bench/attention_kernel.py, the attention kernel the GPU benches report: the op counts read from
torch's profiler on this CPU (where a packed row always takes the per-sequence SDPA loop), and the
names it gives the counts a GPU would produce."""

import dataclasses
import importlib.util
import sys
from pathlib import Path

import pytest
import torch
from test_model_packing import TINY  # the packing tests' tiny model

from psyrl.runtime.model import varlen_causal

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location(
        "bench_attention_kernel", Path("bench/attention_kernel.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_attention_kernel"] = module
    spec.loader.exec_module(module)
    return module


def test_a_packed_row_on_the_cpu_runs_sdpa_once_per_sequence_and_layer(bench):
    # 3 sequences x 2 layers = 6 SDPA calls, no varlen
    calls, layers = bench.forward_calls(TINY, CPU, sharded=False, lengths=(9, 5, 7))
    assert calls == {"varlen": 0, "sdpa": 6} and layers == 2
    assert bench.attention_kernel(TINY, CPU, sharded=False, lengths=(9, 5, 7)) == (
        "per-sequence SDPA loop (6 calls: 3 sequences x 2 layers); one process, float32"
    )


def test_a_padded_batch_runs_sdpa_once_per_layer(bench):
    padded = dataclasses.replace(TINY, packing=False, dtype="bfloat16")
    assert bench.attention_kernel(padded, CPU, sharded=True, lengths=(9, 5, 7)) == (
        "padded batch, transformers' SDPA with the padding mask (2 calls, 1 per layer); FSDP2 "
        "parameters in bfloat16"
    )


def test_the_names_of_what_a_gpu_would_count(bench):
    # 24 layers, 4 sequences: varlen once per layer; the loop once per sequence and layer
    assert bench.describe({"varlen": 24, "sdpa": 0}, 24, 4, True, True) == (
        "varlen (FlashAttention-2 varlen, 24 calls, 1 per layer)"
    )
    assert bench.describe({"varlen": 0, "sdpa": 96}, 24, 4, True, True) == (
        "per-sequence SDPA loop (96 calls: 4 sequences x 24 layers, a device sync per layer)"
    )
    # a mix is never taken for either
    assert bench.describe({"varlen": 24, "sdpa": 96}, 24, 4, True, True).startswith("unexpected")
    assert bench.describe({"varlen": 0, "sdpa": 24}, 24, 4, True, True).startswith("unexpected")
    assert bench.passes("bfloat16", False) == "one process, bfloat16 autocast over float32 weights"


def test_the_varlen_op_is_counted_under_its_profiler_name(bench):
    """No GPU here: psyrl's varlen call on meta tensors dispatches the same op, whose profiler
    event the census counts."""
    query = torch.empty(1, 4, 10, 16, device="meta", dtype=torch.bfloat16)  # [1, heads, N, d]
    key = torch.empty(1, 2, 10, 16, device="meta", dtype=torch.bfloat16)
    starts = torch.tensor([0, 3, 10], dtype=torch.int32, device="meta")
    calls = bench.attention_calls(lambda: varlen_causal(query, key, key, starts, 7, 0.25))
    assert calls == {"varlen": 1, "sdpa": 0}
