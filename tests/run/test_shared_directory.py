"""The run directory every rank must share (issue 39): at start-up rank 0 writes a nonce file in
it and every rank reads it back; where a rank does not see it (a node with its own copy of the
path) all ranks refuse. Simulated for real: two torchrun agents of one rank each (two "nodes" on
this machine, as tests/test_multinode.py starts them), each started from its own working directory
with a relative run.output_dir, so each sees a directory of its own. And perf/restart: the maximum
of torchrun's restart count over the ranks."""

import json
import os
import subprocess
from pathlib import Path

import pytest
from test_restarts import ROOT, TORCHRUN, free_port, node_args

from psyrl.core.config import load_config
from psyrl.run.directory import Run, check_shared
from psyrl.runtime.distributed import ONE_PROCESS

# one rank of the job: opens the Run as a trainer does (after the process group), reports what it
# saw. RESTARTS = "r0,r1": the TORCHELASTIC_RESTART_COUNT each rank's agent would have given it.
DRIVER = """
import json, os, sys
from psyrl.core.config import load_config
from psyrl.core.errors import RunError
from psyrl.run.directory import Run
from psyrl.runtime.distributed import cleanup, init_distributed
rank = int(os.environ["RANK"])
if os.environ.get("RESTARTS"):
    os.environ["TORCHELASTIC_RESTART_COUNT"] = os.environ["RESTARTS"].split(",")[rank]
dist = init_distributed("cpu")
for output_dir in sys.argv[1:]:
    cfg = load_config(None, [f"run.output_dir={json.dumps(output_dir)}", "run.name=sft"])
    try:
        run = Run(cfg, dist, "sft", [], overwrite=False, resume="off")
        said = f"restart {run.restart}"
    except RunError as e:
        said = f"refused: {e}"
    os.write(1, f"rank {rank}: {said}\\n".encode())  # one write: the ranks share the pipe
cleanup(dist)  # exit 0 either way: no rank is ended by torchrun before it has spoken
"""


def launch(args: list[str], cwd: Path, restarts: str = "") -> subprocess.Popen:
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": path, "RESTARTS": restarts}
    env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"  # as tests/test_restarts.py's agents
    return subprocess.Popen(
        args, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def test_one_process_checks_nothing_and_logs_its_own_restart_count(tmp_path, monkeypatch):
    check_shared(tmp_path / "never-made", ONE_PROCESS)
    assert not (tmp_path / "never-made").exists()  # one process writes no nonce
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "2")
    cfg = load_config(None, [f"run.output_dir={json.dumps(str(tmp_path))}"])
    assert Run(cfg, ONE_PROCESS, "sft", [], False, "off").restart == 2


@pytest.mark.slow
def test_two_ranks_that_share_the_directory_pass_and_log_the_highest_restart_count(tmp_path):
    # first an output_dir under a file, which rank 0 cannot create: both ranks refuse, none waits;
    # then runs/: rank 1's agent restarted 3 times (its node failed), rank 0's never: both log 3
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    (tmp_path / "file").write_text("")
    args = [*TORCHRUN, "--standalone", "--nproc_per_node", "2", str(driver), "file/runs", "runs"]
    proc = launch(args, tmp_path, restarts="0,3")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err[-3000:]
    lines = sorted(out.splitlines())
    assert [line for line in lines if "restart" in line] == [
        "rank 0: restart 3",
        "rank 1: restart 3",
    ], out
    for rank, line in zip((0, 1), [line for line in lines if "refused" in line]):
        assert line.startswith(
            f"rank {rank}: refused: rank 0 cannot write in the run directory file/runs/sft "
            "(NotADirectoryError"
        ), line
    # the nonce and the directories rank 0 made for it are gone again
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_two_nodes_that_do_not_share_the_directory_are_refused_on_both(tmp_path):
    # each node's working directory is its own: runs/sft is node0/runs/sft on one, node1/runs/sft
    # on the other, as two hosts with node-local disks at the same path
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER)
    port, cwds = free_port(), [tmp_path / "node0", tmp_path / "node1"]
    for cwd in cwds:
        cwd.mkdir()
    nodes = [
        launch([*node_args(port, node, 0), str(driver), "runs"], cwds[node]) for node in (0, 1)
    ]
    said = [node.communicate(timeout=300) for node in nodes]
    assert [node.returncode for node in nodes] == [0, 0], [out + err[-3000:] for out, err in said]
    out = said[0][0] + said[1][0]
    for rank in (0, 1):
        line = next(line for line in out.splitlines() if line.startswith(f"rank {rank}: refused"))
        # the same message on every rank: the directory, who wrote, who did not see it, the fix
        assert "the run directory runs/sft is not shared: rank 0 on " in line, line
        assert f"in {cwds[0] / 'runs' / 'sft'}, and rank 1 on " in line, line
        assert f"(looked in {cwds[1] / 'runs' / 'sft'}) did not find it within 10 s" in line, line
        assert "set run.output_dir to an absolute path on a filesystem every node" in line, line
    # rank 0 removed its nonce and the directories it made; rank 1 made none
    assert not (cwds[0] / "runs").exists() and not (cwds[1] / "runs").exists()
