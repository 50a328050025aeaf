"""examples/slurm/: the sbatch scripts pass shellcheck (bash -n where it is not installed), ask for
what psyrl's restarts and preemption need, end the job when one node fails, pass the CPUs to srun,
size --mem and the preemption lead from psyrl plan's figures for the default config, and the
N-node script's torchrun line trains on this machine with the SLURM_* variables a one-node
allocation sets (srun and scontrol stubbed: srun runs its command once, as on one node; scontrol
names this host)."""

import json
import os
import re
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
        assert "#SBATCH --signal=USR1@1800" in text
        assert "--signals-to-handle SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1" in text
        assert "--shutdown-timeout 1740" in text  # the lead less 60 s for SLURM's own kill
        assert '--max-restarts "$RESTARTS"' in text and "--resume auto" in text
        assert "export TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in text
        # one node's failure ends the job; srun (SLURM >= 22.05) does not inherit the CPUs
        srun = next(line for line in text.splitlines() if line.startswith("srun "))
        assert "--kill-on-bad-exit=1" in srun and "--kill-on-bad-exit=0" not in text
        assert '--cpus-per-task="$SLURM_CPUS_PER_TASK"' in srun
        assert re.search(r"^#SBATCH --mem=\d+G$", text, re.MULTILINE)


# the layout each script plans for: (GPUs, nodes, --network-gbps its lead is sized at)
LAYOUTS = {"one-node.sbatch": (4, 1, 25.0), "multi-node.sbatch": (8, 2, 10.0)}


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_mem_and_the_lead_cover_the_plan_of_the_default_config(name):
    """--mem holds psyrl plan's host RAM per node for the default config (3B) with 10-25 % to
    spare; the preemption lead holds its worst case: a whole step, the validation that may end it
    and the checkpoint (4 x A6000 a node)."""
    from psyrl.core.config import load_config
    from psyrl.plan.architecture import load_architecture
    from psyrl.plan.devices import device
    from psyrl.plan.phases import GIB
    from psyrl.plan.planner import plan
    from psyrl.plan.speed import workload

    text = (ROOT / "examples" / "slurm" / name).read_text()
    assert "CONFIG=${CONFIG:-configs/tgrpo/qwen2.5-3b.toml}" in text
    gpus, nodes, gbps = LAYOUTS[name]
    cfg = load_config(ROOT / "configs" / "tgrpo" / "qwen2.5-3b.toml")
    architecture, _ = load_architecture(cfg.model)
    dev, wl = device("a6000"), workload(cfg)
    p = plan(cfg, architecture, gpus, 48, None, "tgrpo", dev, wl, nodes, network_gbps=gbps)
    mem = int(re.search(r"^#SBATCH --mem=(\d+)G$", text, re.MULTILINE).group(1))  # GiB
    assert 1.10 * p.host_total <= mem * GIB <= 1.25 * p.host_total, (mem, p.host_total / GIB)
    lead = int(re.search(r"^#SBATCH --signal=USR1@(\d+)$", text, re.MULTILINE).group(1))
    worst = p.times.step_total + p.times.validation + p.times.checkpoint
    assert worst <= lead - 60 - 120, (lead, worst)  # 60 s for SLURM's kill, 2 min to spare


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
        "SLURM_CPUS_PER_TASK": "2",
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
