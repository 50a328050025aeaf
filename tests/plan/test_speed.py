"""psyrl.plan.speed, the step-time model: its formulas by hand, the offload bytes and NCCL
communicators the memory plan counts, and the model against a measured run of the tiny T-GRPO config
on this machine (bench/plan_calibration.py), phase by phase within a factor of 1.5."""

import json
import os
import subprocess
import sys

import pytest
from plan_models import SETTINGS, SMALL, SMALL_PARAMS

from psyrl.core.config import load_config
from psyrl.plan import speed
from psyrl.plan.architecture import shapes
from psyrl.plan.devices import DEVICES, Device
from psyrl.plan.host_ram import local_elements, offload_bytes
from psyrl.plan.phases import nccl_communicators

# round figures: every term of a formula readable in the arithmetic
DEVICE = Device("test", 1e12, 1e11, 1e10, 1e10, 48, "by hand", mfu=1.0, bw_util=1.0, link_util=1.0)


def test_speed_imports_no_torch():
    """`psyrl plan --device a6000` predicts without torch: only --device cpu measures with it."""
    code = "import sys, psyrl.plan.speed; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_update_seconds_by_hand():
    cfg = load_config(
        None,
        [
            *SETTINGS,
            "rollout.prompts=4",
            "rollout.samples=2",
            "optim.global_batch=4",
            "optim.micro_batch=2",
            "optim.micro_batch_tokens=0",
            "model.gradient_checkpointing=false",
        ],
    )
    wl = speed.Workload(100, (100,), 28, "by hand")
    sh = shapes(SMALL)
    # the matrices a token meets: 8 layers x 15,207,936 + the head 65,536 x 1,024 = 188,772,352
    assert speed.matmul_params(sh) == 188_772_352
    # 8 sequences of 100 + 28 = 128 tokens, 1,024 tokens, 224 of them scored (the responses): the
    # decoder 2 x 8 x 15,207,936 x 1,024 = 249,166,823,424, the LM head only over the scored ones
    # 2 x 65,536 x 1,024 x 224 = 30,064,771,072; attention per sequence 4 x 8 layers x 16 heads x
    # 64 x 128 x 128 = 536,870,912, the causal half on a GPU: 268,435,456, x 8 = 2,147,483,648; a
    # forward 281,379,078,144 / 1e12 = 0.281379078144 s; forward and backward 3 x = 0.844137234432
    # s; the head's log-softmax, 3 + 9 passes over [224, 65,536] float32 at 1e11 B/s: 12 x
    # 58,720,256 / 1e11 = 0.00704643072 s; one process: no collectives; AdamW 28 B x 188,773,376 /
    # 1e11 B/s = 0.05285654528 s
    assert speed.update_seconds(cfg, sh, 1, DEVICE, wl) == pytest.approx(0.904040210432)
    # gradient checkpointing recomputes the forward: 4 x 0.281379078144 + 0.00704643072 +
    # 0.05285654528
    ckpt = load_config(None, [*SETTINGS, "rollout.prompts=4", "rollout.samples=2"])
    ckpt.optim.global_batch, ckpt.optim.micro_batch, ckpt.optim.micro_batch_tokens = 4, 2, 0
    ckpt.model.gradient_checkpointing = True
    assert speed.update_seconds(ckpt, sh, 1, DEVICE, wl) == pytest.approx(1.185419288576)


def test_offload_and_sync_seconds_by_hand():
    cfg = load_config(None, [*SETTINGS, 'fsdp.offload="phase"'])
    sh = shapes(SMALL)
    # 2 ranks: a shard of 94,386,688; 12 B each (float32 parameter, two AdamW moments) there and
    # back over 1e10 B/s: 2 x 12 x 94,386,688 / 1e10 = 0.226528051 s
    assert speed.offload_seconds(cfg, sh, 2, DEVICE) == pytest.approx(0.2265280512)
    # sync: bf16 all-gather 2 B x 94,386,688 x (2 - 1) / 1e10 = 0.0188773376 s; the engine wakes its
    # weights 2 B x 188,773,376 / 1e10 = 0.0377546752 s (TP 1); loads them, read and written at
    # 1e11 B/s: 2 x 377,546,752 / 1e11 = 0.00755093504 s
    assert speed.sync_seconds(cfg, sh, 2, DEVICE) == pytest.approx(0.06418298784)


def test_vllm_decode_is_memory_bound_by_hand():
    """One prompt of 1 token, 1 sample, 2 new tokens on 1 GPU: no prefill to speak of, two decode
    steps of one sequence, each reading the bf16 weights and a few tokens of KV cache."""
    cfg = load_config(
        None,
        [
            *SETTINGS,
            "rollout.prompts=1",
            "rollout.samples=1",
            "rollout.max_new_tokens=2",
            "sampler.sleep=false",
        ],
    )
    sh = shapes(SMALL)
    wl = speed.Workload(1, (1,), 2, "by hand")
    # prefill 2 x 188,772,352 x 1 token + attention 4 x 8 x 16 x 64 x 1 x 1 / 2 = 377,561,088 / 1e12
    prefill = 377_561_088 / 1e12
    # a decode step reads 2 B x 188,772,352 + 1 sequence x 2 tokens (context 1 + 2 / 2) x 8,192 B
    # of KV = 377,561,088 B at 1e11 B/s = 3.77561088 ms (its compute, 377,561,088 FLOP at 1e12, is
    # less), plus vLLM's 4 ms per step
    step = 377_561_088 / 1e11 + speed.VLLM_STEP_OVERHEAD_S
    assert speed.rollout_seconds(cfg, sh, 1, DEVICE, wl) == pytest.approx(prefill + 2 * step)


def test_offload_bytes_by_hand():
    sh = shapes(SMALL)
    # every dim 0 of SMALL is even: each of 2 ranks holds half, float32, and AdamW's two moments
    parts = offload_bytes(sh, 2, 1)
    assert parts == {
        "params": 4.0 * SMALL_PARAMS / 2,
        "exp_avg": 4.0 * SMALL_PARAMS / 2,
        "exp_avg_sq": 4.0 * SMALL_PARAMS / 2,
    }
    # 3 ranks: a dim 0 of 256 (k and v) splits 86 + 86 + 84, 1,024 splits 342 + 342 + 340; the
    # padded storage is rank 0's for every rank, the moments the rank's own rows
    assert local_elements(sh, 3, 0) == sh.shard(3)
    assert local_elements(sh, 3, 2) < sh.shard(3)
    assert sum(local_elements(sh, 3, r) for r in range(3)) == SMALL_PARAMS
    assert offload_bytes(sh, 3, 2)["params"] == 4.0 * sh.shard(3)


def test_nccl_communicators():
    """psyrl's own group, vLLM's world group and, with TP 2, its tp group twice (torch's and
    PyNccl's); one process holds none of several ranks."""
    cfg = load_config("configs/tgrpo/qwen2.5-3b.toml")
    assert sum(nccl_communicators(cfg, 4, "tgrpo").values()) == 4
    cfg.sampler.tensor_parallel = 1
    assert sum(nccl_communicators(cfg, 4, "tgrpo").values()) == 2
    assert nccl_communicators(cfg, 1, "tgrpo") == {}


def test_device_table_names_its_sources():
    for name, dev in DEVICES.items():
        assert dev.name == name
        assert "datasheet" in dev.source or "product brief" in dev.source
        assert dev.flops > 1e14 and dev.memory_bw > 5e11 and dev.host_link >= 32e9


@pytest.mark.slow
def test_calibration_bench_measures_and_predicts_every_phase():
    """bench/plan_calibration.py runs 2 steps of configs/tgrpo/tiny.toml on one core and reports,
    per phase, the model's seconds and the measured median, both positive. How close they are is a
    timing, which the suite's parallel workers would disturb: `python bench/plan_calibration.py
    --cores 1 --steps 3 --check 1.5` on an idle machine checks it (docs/measurements.md)."""
    result = subprocess.run(
        [sys.executable, "bench/plan_calibration.py", "--cores", "1", "--steps", "2", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TOKENIZERS_PARALLELISM": "false"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(x for x in result.stdout.splitlines() if x.startswith("RESULT "))
    r = json.loads(line[len("RESULT ") :])
    for phase in ("rollout", "experience", "update"):
        assert r["predicted"][phase] > 0 and r["measured"][phase] > 0, (phase, r)


def test_pinned_per_tensor_bytes_by_hand():
    """fsdp.offload = "always": FSDP2 pins each padded shard alone, rounded up to a power of two.
    SMALL on 3 ranks, float32, per layer: q 342 x 1024 x 4 = 1,400,832 -> 2^21, its bias 1,368 ->
    2,048; k and v 86 x 1024 x 4 = 352,256 -> 2^19, biases 344 -> 512; o -> 2^21; gate and up
    1,366 x 1024 x 4 and down 342 x 4096 x 4 (~5.6 MB) -> 2^23 each; two norms -> 2,048 each:
    30,415,872 a layer, x 8; the embedding 21,846 x 1024 x 4 = 89,481,216 -> 2^27, the final norm
    2,048."""
    from psyrl.plan.host_ram import pinned_per_tensor_bytes

    sh = shapes(SMALL)
    assert pinned_per_tensor_bytes(sh, 3, 4) == 8 * 30_415_872 + 2**27 + 2_048
    assert pinned_per_tensor_bytes(sh, 3, 4) > 4 * sh.shard(3)  # the rounding the plan now shows
