"""`psyrl plan --nodes N`: host RAM per node, the bytes each phase sends between nodes and their
seconds at --network-gbps, worked out by hand for SMALL, and whether the network or the compute
bounds the step; one node prints what it printed before; a vLLM tensor-parallel group larger
than a node, --nodes 0 and GPUs that do not divide over the nodes are refused with one message; and
the trainers' start-up check judges host RAM per node under torchrun across nodes."""

import os
import types

import pytest
import torch
from click.testing import CliRunner
from plan_models import SETTINGS, SMALL, SMALL_PARAMS

from psyrl.cli.main import main
from psyrl.core.config import load_config
from psyrl.plan import planner, speed
from psyrl.plan.architecture import shapes
from psyrl.plan.devices import DEVICES
from psyrl.plan.network import NETWORK_GBPS
from psyrl.plan.phases import GIB, MIB
from psyrl.plan.planner import plan
from psyrl.plan.speed import workload
from psyrl.plan.table import format_plan
from psyrl.run import launch
from psyrl.runtime.distributed import Dist

P = SMALL_PARAMS
# 4 GPUs on 2 nodes: every dim 0 of SMALL is a multiple of 4, so a shard is P / 4 with no padding
# and an all-gather's buffer is the whole model
HAND = [
    *SETTINGS,
    "loss.kl_coef=0.01",
    "rollout.prompts=8",
    "rollout.samples=4",
    "optim.global_batch=4",  # 2 mini-batches (updates) per step
    "optim.logprob_micro_batch_tokens=4096",
    "optim.micro_batch_tokens=2048",
    "optim.logprob_micro_batch=2",
    "data.valid_items=16",
    "checkpoint.export_dtype=bfloat16",
]


def small_plan(sets: list[str], gpus: int = 4, nodes: int = 2):
    cfg = load_config("configs/tgrpo/tiny.toml", [*HAND, *sets])
    # prompts of 512 tokens and responses of 512: 1,024 tokens a sequence
    wl = workload(cfg, 512, None, 512)
    return plan(cfg, SMALL, gpus, 48, None, "tgrpo", wl=wl, nodes=nodes)


def test_cross_node_bytes_by_hand():
    p = small_plan([])
    got = {(c.phase, c.op): (c.size, c.calls, c.node_bytes(4, 2)) for c in p.network}
    # a ring over W = 4 ranks: each node sends 3/4 of a collective's buffer
    assert got == {
        # the reference's forwards (one pass) and pi_old's of the second mini-batch (half a pass):
        # 8 rows a rank x 1,024 tokens / 4,096 = 2 micro-batches x 1.5 = 3 all-gathers of 2P (bf16)
        ("experience", "all-gather"): (2 * P, 3, 3 * 2 * P * 3 / 4),
        # 2 mini-batches of 4 rows a rank, 4 x 1,024 / 2,048 = 2 micro-batches each: 4, each
        # gathering in the forward and again in the backward
        ("update", "all-gather"): (2 * P, 8, 8 * 2 * P * 3 / 4),
        # float32 gradients reduce-scattered after every micro-batch
        ("update", "reduce-scatter"): (4 * P, 4, 4 * 4 * P * 3 / 4),
        # the weight sync's buckets: the whole model in bf16, once
        ("sync", "all-gather"): (2 * P, 1, 2 * P * 3 / 4),
        # 16 held-out items / 4 ranks / 2 rows a micro-batch: 2 forwards
        ("validation", "all-gather"): (2 * P, 2, 2 * 2 * P * 3 / 4),
        # the other node's half of the float32 shards into rank 0's node
        ("checkpoint", "gather"): (4 * P, 1, 4 * P / 2),
    }
    step = sum(
        b for (phase, _), (_, _, b) in got.items() if phase not in ("validation", "checkpoint")
    )
    assert step == 30 * P  # 4.5 P + 12 P + 12 P + 1.5 P
    # defer_grad_sync: one reduce-scatter per mini-batch; reshard_after_forward = false: one
    # all-gather per micro-batch
    deferred = small_plan(["fsdp.defer_grad_sync=true", "fsdp.reshard_after_forward=false"])
    by = {(c.phase, c.op): c.calls for c in deferred.network}
    assert by[("update", "reduce-scatter")] == 2 and by[("update", "all-gather")] == 4


def test_host_ram_per_node_by_hand():
    """The first node's 2 ranks of 4 (sleep: vLLM's bf16 weights to the host, TP 1)."""
    stays = small_plan(["fsdp.offload=phase"]).host
    assert stays == {
        "baseline (3 GiB per rank, assumption)": 2 * 3 * GIB,
        # float32 shard + AdamW's two moments, 12 B x P / 4 per rank
        "actor shards + AdamW, pinned, exact": 2 * 12 * P / 4,
        "reference model (bfloat16, CPU offload, padded shards)": 2 * 2 * P / 4,
        # 450 MiB of pinned blocks per rank for 2 P of weights (tests/plan/test_host_ram.py)
        "vLLM weights asleep, pinned, rounded up per segment": 2 * 450 * MIB,
    }
    one = small_plan(["fsdp.offload=phase"], nodes=1)
    assert {k: v / 2 for k, v in one.host.items()} == stays  # one node holds all 4 ranks
    # rank 0's gather of the checkpoint (float32 + bf16 export) stays on the first node
    assert small_plan([]).host_transient == one.host_transient
    assert max(one.host_transient.values()) == 6 * P
    assert one.network == []  # nothing crosses a network on one node


def test_one_node_prints_what_it_did():
    args = ["plan", "--config", "configs/tgrpo/qwen2.5-3b.toml"]
    before = CliRunner().invoke(main, args)
    one = CliRunner().invoke(main, [*args, "--nodes", "1"])
    assert one.exit_code == before.exit_code == 0
    assert one.output == before.output
    assert "(one node)" in one.output and "network between" not in one.output
    two = CliRunner().invoke(main, [*args, "--gpus", "8", "--nodes", "2"])
    assert two.exit_code == 0, two.output
    assert "on 2 nodes x 4 x 48 GiB GPUs" in two.output
    assert "host RAM per node (4 ranks: the first node's, with rank 0)" in two.output
    assert "network between the 2 nodes" in two.output
    assert "all-gather of the parameters in bfloat16 (sync_buckets)" in two.output
    assert "memory plan: fits 8 x 48 GiB on 2 nodes" in two.output


def test_a_tensor_parallel_group_larger_than_a_node_is_refused():
    with pytest.raises(ValueError, match="= 2 is larger than a node's 1 GPUs: a vLLM"):
        small_plan(["sampler.tensor_parallel=2"], gpus=2, nodes=2)
    result = CliRunner().invoke(
        main,
        ["plan", "--config", "configs/tgrpo/qwen2.5-3b.toml", "--gpus", "4", "--nodes", "4"],
    )
    assert result.exit_code == 1
    assert result.output.count("Error:") == 1 and "Traceback" not in result.output
    assert (
        "sampler.tensor_parallel = 2 is larger than a node's 1 GPUs: a vLLM tensor-parallel "
        "group never spans two nodes" in result.output
    )
    with pytest.raises(ValueError, match="= 3 must divide a node's 4 GPUs"):
        small_plan(["sampler.tensor_parallel=3"], gpus=8, nodes=2)


def test_bad_node_counts_are_one_error():
    args = ["plan", "--config", "configs/tgrpo/qwen2.5-3b.toml"]
    zero = CliRunner().invoke(main, [*args, "--nodes", "0"])
    assert zero.exit_code == 2 and "Invalid value for '--nodes'" in zero.output
    uneven = CliRunner().invoke(main, [*args, "--gpus", "6", "--nodes", "4"])
    assert uneven.exit_code == 1 and uneven.output.count("Error:") == 1
    assert "--gpus 6 does not divide over --nodes 4" in uneven.output
    with pytest.raises(ValueError, match="--nodes must be >= 1, got 0"):
        small_plan([], nodes=0)
    help_text = CliRunner().invoke(main, ["plan", "--help"]).output
    assert "--nodes" in help_text and "cross the network" in help_text


def test_start_up_judges_host_ram_per_node(monkeypatch, capsys):
    """Under torchrun on 2 nodes of 2 ranks, the check plans per node and judges this node's RAM
    (the OS's) against the first node's need; the GPUs' verdict alone decides whether to start."""
    cfg = load_config(
        "configs/tgrpo/qwen2.5-0.5b.toml", ["fsdp.offload=phase", "sampler.tensor_parallel=1"]
    )
    seen = {}
    real = planner.plan

    def recording(*args, **kwargs):
        seen["plan"] = real(*args, **kwargs)
        return seen["plan"]

    monkeypatch.setattr(planner, "plan", recording)  # the start-up check looks it up at each call
    gpu = types.SimpleNamespace(total_memory=48 * GIB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: gpu)
    # a node of one 4 KiB page: its RAM cannot fit, and the run still starts (a warning only)
    monkeypatch.setattr(os, "sysconf", lambda name: 4096 if name == "SC_PAGE_SIZE" else 1)
    dist = Dist(rank=0, world=4, local_rank=0, local_world=2, device=torch.device("cuda", 0))
    launch.check_memory_plan(cfg, dist, "tgrpo")
    p = seen["plan"]
    assert p.nodes == 2 and p.gpus == 4 and p.gpus_fit and p.host_fits is False
    assert p.host["baseline (3 GiB per rank, assumption)"] == 2 * 3 * GIB
    assert "memory plan: host RAM needs" in capsys.readouterr().out


def test_network_seconds_by_hand():
    """Each node's bytes (test_cross_node_bytes_by_hand) at 10 Gbit/s = 1.25e9 B/s, line rate."""
    cfg = load_config("configs/tgrpo/tiny.toml", HAND)
    wl = workload(cfg, 512, None, 512)
    p = plan(cfg, SMALL, 4, 48, None, "tgrpo", wl=wl, nodes=2, network_gbps=10)
    assert p.network_seconds == pytest.approx(
        {
            "experience": 4.5 * P / 1.25e9,  # 0.680 s
            "update": 24 * P / 1.25e9,  # 12 P all-gathered + 12 P reduce-scattered: 3.624 s
            "sync": 1.5 * P / 1.25e9,
            "validation": 3 * P / 1.25e9,
            "checkpoint": 2 * P / 1.25e9,
        },
        rel=1e-12,
    )
    assert p.network_seconds["update"] == pytest.approx(3.6244488192)
    # one node: nothing on a network, whatever its speed
    one = plan(cfg, SMALL, 4, 48, None, "tgrpo", wl=wl, nodes=1, network_gbps=10)
    assert one.network_seconds == {}


def test_network_or_compute_bounds_the_step():
    """A100s (NVLink) on 2 nodes: at 1 Gbit/s the update's 24 P of network (36.2 s) exceeds its
    compute, and the time model runs the update at the network's speed; at 10,000 Gbit/s the
    network is faster than NVLink and the step is predicted as on one fabric."""
    cfg = load_config("configs/tgrpo/tiny.toml", HAND)
    wl = workload(cfg, 512, None, 512)
    dev = DEVICES["a100-80"]
    sh = shapes(SMALL)
    slow = plan(cfg, SMALL, 4, 48, None, "tgrpo", dev=dev, wl=wl, nodes=2, network_gbps=1)
    assert slow.network_seconds["update"] == pytest.approx(24 * P / 1.25e8)
    compute = speed.update_parts(cfg, sh, 4, dev, wl)["compute"]
    assert slow.compute_seconds["update"] == compute < slow.network_seconds["update"]
    assert slow.network_bound("update")
    u = speed.update_parts(cfg, sh, 4, dev, wl)
    assert slow.times.step["update"] == pytest.approx(
        slow.network_seconds["update"] + u["overhead"] + u["adamw"]
    )
    text = format_plan(slow)
    assert "update: 36.2 s of network against" in text
    assert "the network bounds the step (in the " in text
    fast = plan(cfg, SMALL, 4, 48, None, "tgrpo", dev=dev, wl=wl, nodes=2, network_gbps=10_000)
    assert not fast.network_bound("update") and not fast.network_bound("experience")
    assert fast.times == speed.step_times(cfg, sh, 4, dev, wl)  # NVLink is the slower link
    assert "compute bounds the step; predicted" in format_plan(fast)


def test_the_issues_3b_figures():
    """Issue 39: the 3B update moves ~1.2 TiB per node per step: at 25 Gbit/s at least 415 s
    against ~399 s of compute on A6000s, at 10 Gbit/s ~2.6 x the compute."""
    args = ["plan", "--config", "configs/tgrpo/qwen2.5-3b.toml", "--gpus", "8", "--nodes", "2"]
    out = CliRunner().invoke(main, args).output
    assert (
        "update: 414.8 s of network against 398.8 s of compute (1.04x): the network bounds" in out
    )
    assert "s at 25 Gbit/s" in out and "default 25: 25 GbE" in out
    ten = CliRunner().invoke(main, [*args, "--network-gbps", "10"]).output
    assert "update: 1,036.9 s of network against 398.8 s of compute (2.60x)" in ten


def test_bad_network_speeds_are_refused():
    args = ["plan", "--config", "configs/tgrpo/qwen2.5-3b.toml", "--gpus", "8", "--nodes", "2"]
    for bad in ("0", "-25", "inf", "fast"):
        result = CliRunner().invoke(main, [*args, "--network-gbps", bad])
        assert result.exit_code == 2 and "Invalid value for '--network-gbps'" in result.output
    nan = CliRunner().invoke(main, [*args, "--network-gbps", "nan"])  # click's range lets nan by
    assert nan.exit_code == 1 and nan.output.count("Error:") == 1
    assert "--network-gbps must be a positive number of Gbit/s, got nan" in nan.output
    with pytest.raises(ValueError, match="--network-gbps must be a positive number"):
        plan(load_config("configs/tgrpo/tiny.toml", HAND), SMALL, 4, 48, network_gbps=0)
    # the option's default is the module's, and --help says it
    option = next(o for o in main.commands["plan"].params if o.name == "network_gbps")
    assert option.default == NETWORK_GBPS == 25.0
    assert "25 GbE" in CliRunner().invoke(main, ["plan", "--help"]).output
