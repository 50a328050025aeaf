"""An input error on one node only (issue 39): two torchrun agents of one rank each (two "nodes" on
this machine, as tests/test_restarts.py starts them), each in its own working directory; the
relative train file exists beside node 0 only. Node 1's rank says its own error, with its rank and
host, and its agent exits non-zero (what `srun --kill-on-bad-exit=1` turns into the end of the
job) while rank 0, which read its file, waits in a collective."""

import json
import os
import shutil
import socket
import subprocess
import time

import pytest
from test_restarts import ROOT, SFT_SETS, free_port, node_args

from psyrl.cli.errors import RANK0_GRACE_S


@pytest.mark.slow
def test_a_train_file_missing_on_one_node_is_said_by_that_node(tmp_path):
    runs = tmp_path / "shared" / "runs"  # one run directory both nodes see
    nodes = [tmp_path / "node0", tmp_path / "node1"]
    for node in nodes:
        node.mkdir()
    shutil.copy(ROOT / "data" / "demo" / "train.jsonl", nodes[0] / "train.jsonl")
    port = free_port()
    sets = [*SFT_SETS, f"run.output_dir={json.dumps(str(runs))}", "data.train_file=train.jsonl"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1"}
    agents = []
    for node, cwd in enumerate(nodes):
        args = [*node_args(port, node, restarts=0), str(ROOT / "train_sft.py")]
        args += ["--config", str(ROOT / "configs" / "sft" / "tiny.toml")]
        args += [a for s in sets for a in ("--set", s)]
        agents.append(
            subprocess.Popen(
                args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
        )
    try:
        start = time.monotonic()
        _, err = agents[1].communicate(timeout=RANK0_GRACE_S + 240)
        assert agents[1].returncode != 0
        # it waited for rank 0 to fail on the same error first, which rank 0 did not
        assert time.monotonic() - start >= RANK0_GRACE_S
        said = [line for line in err.splitlines() if line.startswith("train-sft: rank 1 on ")]
        assert len(said) == 1, err[-3000:]
        assert said[0].startswith(
            f"train-sft: rank 1 on {socket.gethostname()}: train.jsonl: no such data file"
        )
        assert agents[0].poll() is None  # rank 0 still waits: ending it is the job's to do
    finally:
        for agent in agents:
            agent.kill()
            agent.communicate()
