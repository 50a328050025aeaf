"""psyrl's own error types. The library raises them; the command line (`psyrl.cli.errors`) turns
each into one message (rank 0's, or that of the rank whose node alone has the error) and an exit
status: no traceback, since each is about
the user's files, settings or run directory (never a bug) and its message says what to change."""

from __future__ import annotations

EXIT_PREEMPTED = 75  # sysexits.h EX_TEMPFAIL: a temporary failure, to be retried (here: resumed)


class PsyrlError(Exception):
    """An error the user can act on: the command line prints `Error: <message>` and exits with
    `exit_code`."""

    exit_code = 1


class RunError(PsyrlError):
    """A training run that cannot start or go on: its run directory, a resume, batch sizes that do
    not divide, a memory plan that does not fit."""


class Preempted(Exception):
    """A run stopped on a preemption signal after writing what it keeps; the message says how to
    resume. Not an error: rank 0 prints the message and the process exits with EXIT_PREEMPTED."""
