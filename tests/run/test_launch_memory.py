"""The start-up memory check's host RAM: the job's cgroup limit read from hand-made cgroup trees
(v2, v1, both, none), and the smaller of it and the physical RAM judged against the plan."""

import os
import types
from pathlib import Path

import torch

from psyrl.core.config import load_config
from psyrl.plan.phases import GIB
from psyrl.run import launch
from psyrl.run.launch import job_memory_limit
from psyrl.runtime.distributed import Dist


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


def test_cgroup_v2_takes_the_smallest_limit_up_the_tree(tmp_path):
    """SLURM's cgroup/v2 plugin sets --mem on the job's cgroup; its tasks run in a child whose own
    memory.max reads "max"."""
    job = tmp_path / "system.slice" / "slurmstepd.scope" / "job_7"
    write(job / "memory.max", "137438953472\n")  # 128 GiB
    write(job / "step_0" / "user" / "task_0" / "memory.max", "max\n")
    proc = "0::/system.slice/slurmstepd.scope/job_7/step_0/user/task_0\n"
    assert job_memory_limit(proc, tmp_path) == 128 * GIB
    # a tighter limit below the job's wins
    write(job / "step_0" / "memory.max", str(100 * GIB))
    assert job_memory_limit(proc, tmp_path) == 100 * GIB
    # "max" everywhere, or no file at all (the root cgroup has none): no limit
    write(tmp_path / "a" / "memory.max", "max")
    assert job_memory_limit("0::/a\n", tmp_path) is None
    assert job_memory_limit("0::/not/there\n", tmp_path) is None


def test_cgroup_v1_and_a_namespace_root(tmp_path):
    """v1: the memory controller's own line and folder. A container's /proc/self/cgroup may name
    folders above its mount's root: the missing ones are skipped, the root's file is read."""
    write(tmp_path / "memory" / "slurm" / "uid_0" / "job_9" / "memory.limit_in_bytes", "2048\n")
    write(tmp_path / "memory" / "memory.limit_in_bytes", "9223372036854771712\n")  # no limit
    proc = "12:pids:/slurm\n4:memory:/slurm/uid_0/job_9\n0::/\n"
    assert job_memory_limit(proc, tmp_path) == 2048
    assert job_memory_limit("4:cpu,memory:/docker/abc\n", tmp_path) == 9223372036854771712
    # hybrid: v1's memory line and v2's root, whose memory.max is not there
    write(tmp_path / "memory" / "m" / "memory.limit_in_bytes", "4096")
    assert job_memory_limit("4:memory:/m\n0::/\n", tmp_path) == 4096
    # no cgroup file system (macOS, or /proc not readable): nothing
    assert job_memory_limit("", tmp_path) is None
    assert job_memory_limit("garbage line\n", tmp_path) is None


def test_the_check_judges_the_cgroup_limit(monkeypatch, tmp_path, capsys):
    """A node of 512 GiB in a job limited to 16 GiB: the 3B plan's host RAM does not fit, and the
    check says which figure it judged; with the limit above the RAM, the RAM is judged."""
    cfg = load_config("configs/tgrpo/qwen2.5-3b.toml")
    gpu = types.SimpleNamespace(total_memory=48 * GIB)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda device: gpu)
    pages = {"SC_PAGE_SIZE": 4096, "SC_PHYS_PAGES": 512 * GIB // 4096}
    monkeypatch.setattr(os, "sysconf", lambda name: pages[name])
    write(tmp_path / "proc", "0::/job\n")
    write(tmp_path / "cg" / "job" / "memory.max", str(16 * GIB))
    monkeypatch.setattr(launch, "PROC_CGROUP", tmp_path / "proc")
    monkeypatch.setattr(launch, "CGROUP_ROOT", tmp_path / "cg")
    dist = Dist(rank=0, world=4, local_rank=0, local_world=4, device=torch.device("cuda", 0))
    launch.check_memory_plan(cfg, dist, "tgrpo")
    out = capsys.readouterr().out
    assert "this job may use 16.0 GiB of the node's 512.0 GiB of RAM (its cgroup's" in out
    assert "memory plan: host RAM needs 87.2 GiB of 16 per node" in out
    write(tmp_path / "cg" / "job" / "memory.max", str(1024 * GIB))
    launch.check_memory_plan(cfg, dist, "tgrpo")
    out = capsys.readouterr().out
    assert "this job may use" not in out and "memory plan: fits 4 x 48 GiB" in out
