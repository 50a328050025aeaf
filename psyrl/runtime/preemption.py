"""Preemption: a scheduler's signal (SLURM: SIGTERM, then SIGKILL after the grace period; or an
early SIGUSR1 with `--signal=USR1@SECONDS`) turns into a checkpoint and a clean exit.

The handler only records the signal. The trainers ask `requested(dist)` at fixed points of a step,
on every rank in the same collective, so a signal that reached one rank stops all of them after the
same step, with nothing cut in the middle of a write.
"""

from __future__ import annotations

import signal
from collections.abc import Sequence

import torch

from psyrl.runtime.distributed import Dist, all_reduce


class Preemption:
    """Owns the handlers of `signals` (names, e.g. "SIGTERM") while the run trains, and restores the
    previous ones on close."""

    def __init__(self, signals: Sequence[str]):
        self.received = 0  # the last signal's number on this rank, 0 for none
        self._previous = {}
        for name in signals:
            number = getattr(signal, name)
            self._previous[number] = signal.signal(number, self._record)

    def _record(self, number: int, frame) -> None:
        self.received = number

    def requested(self, dist: Dist) -> str | None:
        """Collective: the name of a signal some rank received (the highest number when several
        did), or None."""
        number = int(all_reduce(torch.tensor(float(self.received)), dist, "max").item())
        return signal.Signals(number).name if number else None

    def close(self) -> None:
        for number, handler in self._previous.items():
            signal.signal(number, handler)
        self._previous = {}

    def __enter__(self) -> Preemption:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
