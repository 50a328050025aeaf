"""Running a CLI in a subprocess from tests, with one retry for a torchrun worker that aborted in
C++.

2 of about 30 torchrun launches inside pytest during development ended with a worker killed by
`std::terminate` ("terminate called without an active exception", exit -6); none of 60+ launches of
the same commands from a shell loop or a Python driver did. The cause is not found (gloo teardown is
the usual source of that message). Such a launch is retried once, from a clean run directory, with a
warning in the test summary; any other failure, and a second abort, fail the test.
"""

import shutil
import subprocess
import warnings
from pathlib import Path

WORKER_ABORT = "terminate called without an active exception"


def run(args: list[str], run_dir: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(args, capture_output=True, text=True, ...); `run_dir`: the run directory a
    retry may delete (None: never retry, e.g. a --resume launch whose directory holds the state
    under test)."""
    result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    if result.returncode and run_dir is not None and WORKER_ABORT in result.stderr:
        warnings.warn(
            f"a torchrun worker aborted ({WORKER_ABORT!r}); retrying once: {' '.join(args[-6:])}\n"
            f"its stdout ended: {result.stdout[-800:]}\nits stderr began: {result.stderr[:1500]}",
            stacklevel=2)
        shutil.rmtree(run_dir, ignore_errors=True)
        result = subprocess.run(args, capture_output=True, text=True, **kwargs)
    return result
