"""vLLM's sleep backup in host RAM (psyrl.plan.host_ram): the weight tensors of one tensor-parallel
rank, the segments torch's CUDA caching allocator puts them in, and the power of two torch's pinned
allocator rounds each segment's backup up to, worked out by hand for SMALL."""

import pytest
from plan_models import SMALL, SMALL_PARAMS, architecture

from psyrl.plan.architecture import shapes
from psyrl.plan.host_ram import (
    cuda_segments,
    pinned_block,
    vllm_sleep_backup,
    vllm_weight_bytes,
)
from psyrl.plan.phases import GIB, MIB


def test_pinned_block_is_the_next_power_of_two():
    assert [pinned_block(n) for n in (1, 2, 3, 512, 513, 20 * MIB, 2**30)] == [
        1,
        2,
        4,
        512,
        1024,
        32 * MIB,
        2**30,
    ]


def test_vllm_weights_of_small_by_hand():
    """TP 1, bf16: the embedding 65,536 x 1,024 (a multiple of 64: no padding); per layer q/k/v
    merged, (16 + 2 x 4) heads x 64 = 1,536 rows, and their bias; o 1,024 x 1,024; gate/up merged
    8,192 x 1,024; down 1,024 x 4,096; two norms; the final norm (tied head)."""
    weights = vllm_weight_bytes(shapes(SMALL), 1, 2)
    layer = [1536 * 1024 * 2, 1536 * 2, 2 * MIB, 16 * MIB, 8 * MIB, 2048, 2048]
    assert weights == [128 * MIB, *8 * layer, 2048]
    assert sum(weights) == 2 * SMALL_PARAMS
    # TP 2: half the vocabulary and heads, and max(1, 4 / 2) = 2 kv heads of 4
    two = vllm_weight_bytes(shapes(SMALL), 2, 2)
    assert two[:5] == [64 * MIB, (8 + 2 * 2) * 64 * 1024 * 2, 768 * 2, 1 * MIB, 8 * MIB]
    # the 17 norms (1,024 elements, 2,048 B) are whole on each rank: 1,024 B above half of 2 P each
    assert sum(two) == SMALL_PARAMS + 17 * 1024


def test_cuda_segments_of_small_by_hand():
    """The embedding: its own 128 MiB segment. Layer 1: q/k/v (3 MiB) opens a 20 MiB segment, o
    (2 MiB) takes 2 of its 17 free, gate/up (16 MiB) gets its own, down (8 MiB) 8 of the 15 free.
    Layer 2: q/k/v and o take 5 of the last 7, down opens a second 20 MiB segment (12 free).
    Layer 3: q/k/v 3 of the 12, o the 2 left over, down 8 of the 9 (the 1 MiB rest is not split
    off: not above 1 MiB). So 2 x 20 MiB every 3 layers, 6 for 8 layers; the biases and norms in
    one 2 MiB segment."""
    segments = cuda_segments(vllm_weight_bytes(shapes(SMALL), 1, 2))
    assert sorted(segments) == sorted([128 * MIB, 2 * MIB] + 8 * [16 * MIB] + 6 * [20 * MIB])
    # pinned: 128 + 2 + 8 x 16 + 6 x 32 (20 MiB -> 2^25) = 450 MiB for 360.05 MiB of weights
    assert vllm_sleep_backup(shapes(SMALL), 1, 2) == (2 * SMALL_PARAMS, 450 * MIB)


def test_max_split_keeps_a_large_block_whole():
    """A 24.5 MiB request gets a 26 MiB segment; under vLLM's max_split_size_mb:20 it is not split,
    so a 1.25 MiB request opens a 20 MiB segment; without the limit it takes the 1.5 MiB rest."""
    requests = [49 * MIB // 2, 5 * MIB // 4]
    assert cuda_segments(requests) == [26 * MIB, 20 * MIB]
    assert cuda_segments(requests, max_split=2**62) == [26 * MIB]
    # requests of at most 1 MiB share 2 MiB segments, each rounded up to 512 B: 1 B takes 512, so
    # two of 1 MiB do not fit beside it, two of 1 MiB - 512 do
    assert cuda_segments([1, MIB, MIB]) == [2 * MIB, 2 * MIB]
    assert cuda_segments([1, MIB - 512, MIB - 512]) == [2 * MIB]


def test_the_3b_preset_backup_per_rank():
    """Qwen2.5-3B at TP 2: 2.87 GiB of weights asleep take 4.44 GiB of pinned RAM per rank (gate/up
    44 MiB -> 64, down 22 MiB -> 32, q/k/v + o in 20 MiB segments -> 32, the embedding 298 ->
    512)."""
    weights, pinned = vllm_sleep_backup(shapes(architecture("3B")), 2, 2)
    assert weights / GIB == pytest.approx(2.8741, abs=1e-4)
    assert pinned == 36 * (64 + 32) * MIB + 18 * 32 * MIB + 512 * MIB + 2 * MIB
    assert pinned / GIB == pytest.approx(4.4395, abs=1e-4)
