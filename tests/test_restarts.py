"""Restarts that resume on their own (run.resume = "auto" under torchrun's --max-restarts), with
real faults, and two torchrun agents of one rank each (two "nodes" on this machine, c10d
rendezvous on 127.0.0.1) losing one node: each run ends bit-identical to one uninterrupted run of
1 agent x 2 ranks.

Each agent is pinned to its own core(s): psyrl gives a rank the cores of its node divided by the
node's ranks (`set_threads`), so two agents on one machine would each take every core, and the
matmuls' thread count, hence their last bits, would differ from the 2-rank reference."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from psyrl.core.runlog import read_metrics

# PSYRL_TEST_FAULT = "KIND:N:RANK:ATTEMPT,...": in torchrun's restart ATTEMPT
# (TORCHELASTIC_RESTART_COUNT) the worker of global RANK (* for any) meets the fault at the start
# of its N-th optimiser step in this process (SFT's clipped_step, T-GRPO's update): raise (an
# error, as a CUDA error would), kill (SIGKILL, as the OOM killer sends), hang (stops answering: the
# other ranks wait in the step's collective until fsdp.timeout_minutes), lose (SIGKILL to its
# torchrun agent and itself: the node is gone).
DRIVER = """
import os, signal, sys, time
program_name = sys.argv.pop(1)
if program_name == "tgrpo":
    import psyrl.recipes.tgrpo as program
    from psyrl.cli.train import train_tgrpo as command
    step_name = "update"
else:
    import psyrl.recipes.sft as program
    from psyrl.cli.train import train_sft as command
    step_name = "clipped_step"
faults = [f.split(":") for f in os.environ.get("PSYRL_TEST_FAULT", "").split(",") if f]
attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
rank = os.environ.get("RANK", "0")
step, calls = getattr(program, step_name), [0]

def faulty(*args, **kwargs):
    calls[0] += 1
    for kind, n, who, when in faults:
        if int(n) == calls[0] and who in (rank, "*") and when == attempt:
            print(f"fault: {kind} on rank {rank} in attempt {attempt}", flush=True)
            if kind == "raise":
                raise RuntimeError("injected fault")
            if kind == "lose":
                os.kill(os.getppid(), signal.SIGKILL)
            if kind in ("kill", "lose"):
                os.kill(os.getpid(), signal.SIGKILL)
            while kind == "hang":
                time.sleep(60)
    return step(*args, **kwargs)

setattr(program, step_name, faulty)
command(prog_name=program_name)
"""

SFT_SETS = [
    "run.name=sft",
    "run.steps=6",
    'data.valid_file=""',
    "checkpoint.every=2",
    "log.progress=false",
    "optim.global_batch=8",
    "optim.micro_batch=4",
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.intermediate_size=128",
]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
TIME_KEYS = ("time/", "perf/")
ROOT = Path(__file__).resolve().parents[1]


def cores(count: int) -> list[set[int]]:
    """`count` disjoint sets of this process's cores (one core each, shared when there are too
    few)."""
    mine = sorted(os.sched_getaffinity(0))
    return [{mine[i % len(mine)]} for i in range(count)]


def pinned(cpus: set[int]):
    return lambda: os.sched_setaffinity(0, cpus)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def program_args(tmp_path: Path, program: str, sets: list[str]) -> list[str]:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    config = f"configs/{program}/tiny.toml"
    return [str(driver), program, "--config", config, *(a for s in sets for a in ("--set", s))]


def agent(args: list[str], cpus: set[int], fault: str = "") -> subprocess.Popen:
    # the driver lives in tmp_path: psyrl from this checkout, not from wherever it is installed
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PSYRL_TEST_FAULT": fault, "PYTHONPATH": path}
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # see psyrl.run.launch.check_restarts
    return subprocess.Popen(
        args,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=pinned(cpus),
    )


def one_node(tmp_path: Path, program: str, sets: list[str], restarts: int = 0, fault: str = ""):
    """1 torchrun agent x 2 ranks; (returncode, stdout, stderr)."""
    args = [*TORCHRUN, "--standalone", "--nproc_per_node", "2", "--max-restarts", str(restarts)]
    proc = agent([*args, *program_args(tmp_path, program, sets)], set().union(*cores(2)), fault)
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def node_args(port: int, node: int, restarts: int) -> list[str]:
    """One of 2 nodes of 1 rank, as a host would start it; node 0 hosts the rendezvous store (by
    hostname a host would find out itself: on one machine both names match 127.0.0.1, and the
    second agent to bind the port would be its client; torch/distributed/elastic/rendezvous/
    c10d_rendezvous_backend.py:137-145)."""
    return [
        *TORCHRUN,
        "--nnodes",
        "2",
        "--nproc_per_node",
        "1",
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-conf",
        f"is_host={'true' if node == 0 else 'false'}",
        "--node-rank",
        str(node),
        "--max-restarts",
        str(restarts),
    ]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "hf" / "model.safetensors")


def rows_without_timing(run: Path) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not k.startswith(TIME_KEYS)}
        for r in read_metrics(run / "metrics.jsonl")
    ]


def assert_same_run(whole: Path, cut: Path) -> None:
    a, b = weights(whole), weights(cut)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])]
    assert rows_without_timing(whole) == rows_without_timing(cut)


def restarts_logged(run: Path) -> list[int]:
    return [r["perf/restart"] for r in read_metrics(run / "metrics.jsonl")]


def sft_sets(out: Path, *extra: str) -> list[str]:
    return [f"run.output_dir={json.dumps(str(out))}", *SFT_SETS, *extra]


@pytest.fixture(scope="module")
def whole(tmp_path_factory) -> Path:
    """The uninterrupted run: 1 agent x 2 ranks, 6 SFT steps, checkpoints at 2, 4, 6."""
    tmp = tmp_path_factory.mktemp("whole")
    code, out, err = one_node(tmp, "sft", sft_sets(tmp))
    assert code == 0, out[-2000:] + err[-3000:]
    assert restarts_logged(tmp / "sft") == [0] * 6
    return tmp / "sft"


@pytest.mark.slow
def test_an_error_then_a_hang_restart_the_workers_which_resume_bitwise(whole, tmp_path):
    # attempt 0: rank 1 raises in step 3 (a checkpoint of step 2 exists); attempt 1 resumes after
    # step 2, and rank 0 stops answering in step 5: rank 1 waits in the step's collective for
    # fsdp.timeout_minutes (0.25: 15 s), fails, and torchrun's SIGTERM to rank 0 is only recorded
    # (psyrl's preemption handler) until its SIGKILL 30 s later; attempt 2 resumes after step 4
    sets = sft_sets(tmp_path, "fsdp.timeout_minutes=0.25", "run.resume=auto")
    code, out, err = one_node(tmp_path, "sft", sets, restarts=2, fault="raise:3:1:0,hang:3:0:1")
    assert code == 0, out[-2000:] + err[-3000:]
    assert (
        "fault: raise on rank 1 in attempt 0" in out and "fault: hang on rank 0 in attempt 1" in out
    )
    assert "resuming after step 2" in out and "resuming after step 4" in out
    assert restarts_logged(tmp_path / "sft") == [0, 0, 1, 1, 2, 2]
    assert_same_run(whole, tmp_path / "sft")


@pytest.mark.slow
def test_two_nodes_lose_one_and_resume_bitwise_after_a_killed_worker(whole, tmp_path):
    # two agents of one rank (as two hosts start them); --resume auto on the command line; in
    # attempt 0 the rank of node 1 is SIGKILLed in step 3 (as the OOM killer would): both agents
    # restart their workers, which resume after step 2; in attempt 1 node 1 is lost in step 5
    # (agent and worker SIGKILLed): node 0's worker fails, its agent restarts it and waits
    # in the rendezvous until node 1's agent is started again, as a scheduler would; all resume
    # after step 4
    port, (cpu0, cpu1) = free_port(), cores(2)
    program = [*program_args(tmp_path, "sft", sft_sets(tmp_path)), "--resume", "auto"]
    node0 = agent([*node_args(port, 0, 2), *program], cpu0)
    node1 = agent([*node_args(port, 1, 2), *program], cpu1, fault="kill:3:*:0,lose:3:*:1")
    out1, err1 = node1.communicate(timeout=600)
    assert node1.returncode == -signal.SIGKILL, out1[-2000:] + err1[-3000:]
    time.sleep(1)
    again = agent([*node_args(port, 1, 2), *program], cpu1)
    out0, err0 = node0.communicate(timeout=600)
    out2, err2 = again.communicate(timeout=600)
    said = out0 + out1 + out2
    assert node0.returncode == 0 and again.returncode == 0, (
        said[-3000:] + err0[-3000:] + err2[-3000:]
    )
    assert "fault: kill" in out1 and "fault: lose" in out1
    assert "resuming after step 2" in said and "resuming after step 4" in said
    assert_same_run(whole, tmp_path / "sft")
    # perf/restart is the maximum over ranks of TORCHELASTIC_RESTART_COUNT, each agent's count of
    # its own workers' failures: an agent whose workers were still healthy when another node came
    # back restarts them without counting (torch/distributed/elastic/agent/server/api.py:957-970),
    # and a node's new agent starts at 0. Steps 3-4: node 1's agent counted its killed worker,
    # whichever node holds global rank 0; steps 5-6: node 1's agent is new, node 0's counted the
    # lost node and, if its worker failed before node 1 came back, the kill too (measured: 1)
    logged = restarts_logged(tmp_path / "sft")
    assert logged[:4] == [0, 0, 1, 1] and logged[4:] in ([1, 1], [2, 2]), logged
