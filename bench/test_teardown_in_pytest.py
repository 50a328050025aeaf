"""The torchrun teardown abort, counted inside pytest (where CI met it): LAUNCHES torchrun jobs of
bench/teardown_aborts.py's worker (2 gloo ranks, a tiny FSDP2 model, 200 all-reduces), each leaving
through psyrl's `cleanup`; each must exit 0 without "terminate called without an active exception".
A benchmark, not part of `make test` (pytest's testpaths is tests/); result in docs/measurements.md:

    .venv/bin/python -m pytest -q bench/test_teardown_in_pytest.py
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

ABORT = "terminate called without an active exception"
WORKER = Path(__file__).with_name("teardown_aborts.py")
LAUNCHES = int(os.environ.get("LAUNCHES", "200"))


@pytest.mark.parametrize("launch", range(LAUNCHES))
def test_a_launch_exits_cleanly(launch):
    torchrun = Path(sys.executable).parent / "torchrun"
    result = subprocess.run(
        [
            str(torchrun),
            "--standalone",
            "--nproc_per_node",
            "2",
            str(WORKER),
            "--worker",
            "--exit",
            "cleanup",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert ABORT not in result.stderr
    assert result.returncode == 0, result.stderr[-2000:]
