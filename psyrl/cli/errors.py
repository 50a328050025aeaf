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
from typing import NoReturn

import click

from psyrl.core.errors import EXIT_PREEMPTED, Preempted, PsyrlError


def fail(error: Exception, prog: str) -> NoReturn:
    """End the command on `error` with the error's exit status: rank 0 prints `Error: <message>`;
    another rank exits quietly for a PsyrlError and says `prog: rank R: <message>` otherwise."""
    code = getattr(error, "exit_code", 1)
    rank = int(os.environ.get("RANK", "0"))
    if rank != 0:
        if not isinstance(error, PsyrlError):
            click.echo(f"{prog}: rank {rank}: {error}", err=True)
        raise SystemExit(code) from None
    exception = click.ClickException(str(error))
    exception.exit_code = code
    raise exception from None


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
