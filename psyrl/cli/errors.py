"""How a command ends on an error: one message per error, and an exit status.

The library raises psyrl's own errors (`psyrl.core.errors.PsyrlError` and its kinds) and
`Preempted`; nothing below the command line knows click. Under torchrun every rank runs the
command. An error about the user's input usually reaches every rank alike: rank 0 says it, and the
others wait for torchrun to end them once rank 0 has failed. But an input can be one node's alone (a
train file, tokenizer or checkpoint missing on one node): a rank still alive when the wait is over
says its own error, naming its rank and host, and exits, so that its node's torchrun (and, under
SLURM, `srun --kill-on-bad-exit=1`) ends the job instead of leaving rank 0 waiting in a collective.
Any other error (a full disk, a broken file) may be one rank's alone: that rank says it at once.

Exit statuses, the same for every psyrl command and entry script (docs/cli.md):
- 0: done; a check (`psyrl data check`, `psyrl checkpoint verify`) found nothing wrong.
- 1: failed, with one message saying why: a PsyrlError (a file's contents, a config key, a run
  directory, a damaged checkpoint, an API that refused), a write that failed, or a check that found
  something wrong. torchrun also exits 1 when a worker failed, whatever the worker's status.
- 2: the command line itself is wrong (an unknown option, a bad option value, a missing argument):
  click's usage errors, raised before anything is read or written.
- 3: `psyrl plan` and `psyrl experiment --plan`: the plan does not fit (an answer, not an error).
- 75 (EXIT_PREEMPTED, sysexits' EX_TEMPFAIL): preempted; a checkpoint was written and the same
  command with --resume continues. `psyrl experiment` passes it on.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from typing import NoReturn

import click

from psyrl.core.errors import EXIT_PREEMPTED, Preempted, PsyrlError

# how long another rank waits for rank 0 to fail on the same input error before it says its own
RANK0_GRACE_S = 30.0


def fail(error: Exception, prog: str) -> NoReturn:
    """End the command on `error` with the error's exit status: rank 0 prints `Error: <message>`;
    another rank says `prog: rank R on HOST: <message>`, for a PsyrlError only once it has waited
    for rank 0 to fail on the same error and still lives (the error is its node's alone)."""
    code = getattr(error, "exit_code", 1)
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        if isinstance(error, PsyrlError):
            wait_for_rank0()
        click.echo(f"{prog}: rank {rank} on {socket.gethostname()}: {error}", err=True)
        raise SystemExit(code) from None
    exception = click.ClickException(str(error))
    exception.exit_code = code
    raise exception from None


def wait_for_rank0(grace_s: float = RANK0_GRACE_S) -> None:
    """Let rank 0 print the error first: torchrun stops every worker as soon as one has failed
    (torch/distributed/elastic/agent/server/api.py:940-954, polled every 0.1 s), so a rank that
    exited at once could cut rank 0 off before its message. When rank 0 fails, torchrun's SIGTERM
    ends this wait (the default action is restored so a preemption handler cannot hold it); when it
    returns, rank 0 did not fail on this node's torchrun within `grace_s`."""
    with contextlib.suppress(ValueError):  # signal.signal only works in the main thread
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    time.sleep(grace_s)


@contextlib.contextmanager
def reported(prog: str, also: tuple[type[Exception], ...] = ()):
    """Run a command's body: a PsyrlError (or one of `also`, e.g. OSError for a file the command
    writes) ends it through `fail`; a Preempted run, whose rank 0 has said how to resume, exits with
    EXIT_PREEMPTED."""
    try:
        yield
    except Preempted:
        raise SystemExit(EXIT_PREEMPTED) from None
    except (PsyrlError, *also) as e:
        fail(e, prog)


@contextlib.contextmanager
def script_errors(prog: str):
    """`reported` for an entry script's body, which runs outside a click command: the same one
    message and exit status."""
    try:
        with reported(prog):
            yield
    except click.ClickException as e:
        e.show()
        raise SystemExit(e.exit_code) from None
