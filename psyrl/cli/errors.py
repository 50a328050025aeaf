"""How a command ends on an error: one message, said once by rank 0, and an exit status.

The library raises psyrl's own errors (`psyrl.core.errors.PsyrlError` and its kinds) and
`Preempted`; nothing below the command line knows click. Under torchrun every rank runs the
command: an error about the user's input or settings reaches every rank alike, so only rank 0 says
it; any other error (a full disk, a broken file on one node) may be one rank's alone, so that rank
names itself.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import NoReturn

import click

from psyrl.core.errors import EXIT_PREEMPTED, Preempted, PsyrlError

# how long another rank waits for rank 0 to say an input error before it exits on its own
RANK0_GRACE_S = 30.0


def fail(error: Exception, prog: str) -> NoReturn:
    """End the command on `error` with the error's exit status: rank 0 prints `Error: <message>`;
    another rank exits quietly for a PsyrlError and says `prog: rank R: <message>` otherwise."""
    code = getattr(error, "exit_code", 1)
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        if isinstance(error, PsyrlError):
            wait_for_rank0()
        else:
            click.echo(f"{prog}: rank {rank}: {error}", err=True)
        raise SystemExit(code) from None
    exception = click.ClickException(str(error))
    exception.exit_code = code
    raise exception from None


def wait_for_rank0(grace_s: float = RANK0_GRACE_S) -> None:
    """Let rank 0 print the error first: torchrun stops every worker as soon as one has failed
    (torch/distributed/elastic/agent/server/api.py:940-954, polled every 0.1 s), so a rank that
    exited at once could cut rank 0 off before its message. When rank 0 fails, torchrun's SIGTERM
    ends this wait; the default action is restored so a preemption handler cannot hold it."""
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
