"""psyrl.plan.planner: a computed fix that works, the suggested gpu_memory_utilization by hand, and
`Plan.gpus_fit`, the verdict the trainers start on (every GPU phase fits and the vLLM pool holds a
sequence; host RAM only warns)."""

import pytest
from plan_models import SETTINGS, SMALL, SMALL_PARAMS, architecture

from psyrl.core.config import load_config
from psyrl.plan.architecture import shapes
from psyrl.plan.planner import plan


def test_fix_is_computed_and_works():
    arch = architecture("3b")
    cfg = load_config(
        "configs/tgrpo/qwen2.5-3b.toml",
        ["fsdp.offload=none", "sampler.gpu_memory_utilization=0.85"],
    )
    result = plan(cfg, arch, 4, 48)
    rollout = next(p for p in result.phases if p.name == "rollout")
    assert not rollout.fits and rollout.fix.startswith('set fsdp.offload = "phase"')
    assert result.verdict().startswith("memory plan: rollout needs")
    assert not result.fits and result.problems[0].startswith("rollout needs")
    fixed = plan(
        load_config(
            "configs/tgrpo/qwen2.5-3b.toml",
            ["fsdp.offload=phase", "sampler.gpu_memory_utilization=0.85"],
        ),
        arch,
        4,
        48,
    )
    assert fixed.fits and fixed.verdict().startswith("memory plan: fits 4 x 48 GiB (peak ")
    # defer_grad_sync: float32 unsharded gradients of every parameter, held through the update
    assert fixed.defer_grad_sync_bytes == pytest.approx(4 * shapes(arch).params)


def test_suggested_gpu_memory_utilization_by_hand():
    """The smallest fraction (multiples of 0.01) whose KV cache holds max_num_seqs full-length
    sequences and KV_MARGIN_GIB more; the largest that fits when none holds them; none when not
    even one sequence fits."""
    assert shapes(SMALL).params == SMALL_PARAMS
    cfg = load_config(None, [*SETTINGS, 'fsdp.offload="none"'])
    # the pool must hold weights 2 B x P = 377,546,752 B + activation 8192 tokens x 2 B x (2 x 1024
    # + 3 x 4096) + 16 seqs x 65536 x 16 B = 251,658,240 B (no graphs: enforce_eager) + 16
    # sequences x 2048 tokens x (2 x 8 layers x 4 KV heads x 64 x 2 B = 8,192 B) = 268,435,456 B +
    # the 1 GiB margin 1,073,741,824 B = 1,971,382,272 B of 9 GiB = 9,663,676,416 B: 0.204 -> 0.21
    # (0.20 leaves 1,932,735,283 - 629,204,992 = 1,303,530,291 B of KV, less than 1,342,177,280)
    assert plan(cfg, SMALL, 2, 9).suggested_utilization == 0.21
    # the rollout beside it fits: 0.21 x 9 = 1.89 GiB + shards and AdamW 12 x 94,386,688 B = 1.0549
    # GiB + CUDA 0.5 + 2 communicators (psyrl's group, vLLM's world group) x 0.2 = 3.84 GiB, with 2
    # GiB to spare of 9; phase offload: the same fraction
    phase = load_config(None, [*SETTINGS, 'fsdp.offload="phase"'])
    assert plan(phase, SMALL, 2, 9).suggested_utilization == 0.21
    # 1,000 sequences (15.6 GiB of KV) fit in no pool: the largest fraction that fits, phase:
    # util x 9 <= 9 - 0.9 - 2 = 6.1 GiB -> util <= 0.6778 -> 0.67, with a note
    many_cfg = load_config(None, [*SETTINGS, 'fsdp.offload="phase"', "sampler.max_num_seqs=1000"])
    many = plan(many_cfg, SMALL, 2, 9)
    assert many.suggested_utilization == 0.67 and "fewer than" in many.suggestion_note
    # the KV cache of one sequence: at 0.70 the pool is 6.3 GiB; KV = 6,764,573,491 - 377,546,752 -
    # 251,658,240 = 6,135,368,499 B; a sequence is 2048 tokens x 8,192 B = 16 MiB -> 365 sequences
    pool = plan(
        load_config(None, [*SETTINGS, "sampler.gpu_memory_utilization=0.7"]), SMALL, 2, 9
    ).pool
    assert pool.sequences == 6_135_368_499 // (2048 * 8192) == 365
    # a max_model_len of 1,048,576 tokens: one sequence's KV cache is 1,048,576 x 8,192 B = 8 GiB,
    # more than the pool at the largest utilisation that fits (0.56: 5.04 GiB, less weights and
    # activation): none does
    long = load_config(None, [*SETTINGS, 'fsdp.offload="none"', "rollout.max_new_tokens=1047552"])
    none = plan(long, SMALL, 2, 9)
    assert none.suggested_utilization is None
    assert "no sampler.gpu_memory_utilization" in none.suggestion_note


def test_gpus_fit_when_every_phase_fits():
    """GPUs that hold every phase: gpus_fit, whatever the host RAM (a node of 1 GiB makes the plan
    not fit, and the trainers only warn)."""
    cfg = load_config(None, [*SETTINGS, 'fsdp.offload="none"'])
    # the rollout is the peak: the pool 0.8 x 48 = 38.4 GiB + shards and AdamW 1.0549 + CUDA 0.9
    # = 40.35 GiB of 48
    result = plan(cfg, SMALL, 2, 48)
    assert result.gpus_fit and result.fits
    small_node = plan(cfg, SMALL, 2, 48, host_memory_gib=1)  # 3 GiB per rank alone is 6
    assert small_node.gpus_fit and small_node.host_fits is False and not small_node.fits
    # the torch sampler: no vLLM pool to hold a sequence
    torch_sampler = plan(load_config(None, [*SETTINGS, 'sampler.engine="torch"']), SMALL, 2, 48)
    assert torch_sampler.pool is None and torch_sampler.gpus_fit


def test_gpus_fit_false_when_a_phase_does_not_fit():
    cfg = load_config(None, [*SETTINGS, 'fsdp.offload="none"'])
    # the rollout: the pool 0.8 x 4 = 3.2 GiB + shards and AdamW 1.0549 + CUDA 0.9 = 5.15 GiB of 4
    result = plan(cfg, SMALL, 2, 4)
    rollout = next(p for p in result.phases if p.name == "rollout")
    assert not rollout.fits and result.pool.sequences >= 1  # the phase, not the pool
    assert not result.gpus_fit and not result.fits


def test_gpus_fit_false_when_the_vllm_pool_holds_no_sequence():
    """Every phase fits, but vLLM would refuse to start: no room for one sequence's KV cache."""
    cfg = load_config(
        None, [*SETTINGS, 'fsdp.offload="none"', "sampler.gpu_memory_utilization=0.01"]
    )
    # the pool 0.01 x 48 GiB = 515,396,075 B < weights 377,546,752 B + activation 251,658,240 B
    # (test above): no KV cache
    result = plan(cfg, SMALL, 2, 48)
    assert all(p.fits for p in result.phases) and result.pool.sequences == 0
    assert not result.gpus_fit and not result.fits
    assert result.verdict().startswith("memory plan: rollout: the vLLM pool leaves")
