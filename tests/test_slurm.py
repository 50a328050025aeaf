"""examples/slurm/: the sbatch scripts pass shellcheck (bash -n where it is not installed), ask for
what psyrl's restarts and preemption need, and the N-node script's torchrun line trains on this
machine with the SLURM_* variables a one-node allocation sets (srun and scontrol stubbed: srun runs
its command once, as on one node; scontrol names this host)."""

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "examples" / "slurm").glob("*.sbatch"))


def test_the_scripts_are_clean_shell_and_ask_for_restarts_and_preemption():
    assert [s.name for s in SCRIPTS] == ["multi-node.sbatch", "one-node.sbatch"]
    check = ["shellcheck"] if shutil.which("shellcheck") else ["bash", "-n"]
    for script in SCRIPTS:
        result = subprocess.run([*check, str(script)], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
        text = script.read_text()
        # SIGUSR1 before the time limit, forwarded by torchrun, a grace to checkpoint in
        assert "#SBATCH --signal=USR1@600" in text
        assert "--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in text
        assert "--shutdown-timeout 540" in text
        assert '--max-restarts "$RESTARTS"' in text and "--resume auto" in text
        assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in text


@pytest.mark.slow
def test_the_multi_node_scripts_torchrun_line_trains_here(tmp_path):
    stubs = tmp_path / "bin"
    stubs.mkdir()
    (stubs / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    (stubs / "scontrol").write_text("#!/bin/bash\necho 127.0.0.1\n")
    for stub in stubs.iterdir():
        stub.chmod(0o755)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(stubs), str(Path(sys.executable).parent), os.environ["PATH"]]),
        # what SLURM sets in a job of one node
        "SLURM_JOB_ID": "4242",
        "SLURM_NNODES": "1",
        "SLURM_JOB_NODELIST": "localhost",
        "SLURM_GPUS_ON_NODE": "1",
        "SLURM_NODEID": "0",
        "SLURM_PROCID": "0",
        "PORT": str(port),
        "CONFIG": "configs/sft/tiny.toml",
        "ENTRY": "train_sft.py",
        "OMP_NUM_THREADS": "1",
    }
    sets = [
        f"run.output_dir={json.dumps(str(tmp_path))}",
        "run.steps=2",
        'data.valid_file=""',
        "checkpoint.every=1",
        "log.progress=false",
        "optim.global_batch=4",
        "optim.micro_batch=4",
        "model.hidden_size=64",
        "model.num_layers=2",
        "model.intermediate_size=128",
    ]
    args = ["bash", str(ROOT / "examples" / "slurm" / "multi-node.sbatch")]
    args += [a for s in sets for a in ("--set", s)]
    result = subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "sft: done" in result.stdout
    assert (tmp_path / "tiny-sft" / "hf" / "model.safetensors").is_file()
