"""Experiment trackers (`log.report_to`): TensorBoard, Weights & Biases and Trackio get every
`metrics.jsonl` row, the resolved config and the T-GRPO samples, on rank 0.

`metrics.jsonl` stays the record: it is written first, and a tracker that fails (no network, a bad
key, a missing package) prints one warning and is dropped for the rest of the run. Each library is
imported only when named. On `--resume` a tracker continues its run: TensorBoard rewinds to the
checkpoint (`purge_step`: its readers drop the events the crashed attempt wrote after it) and gets
the redone rows; wandb and Trackio cannot drop history, so they keep the rows they already hold and
get only the steps after the last one sent (on a CPU in float32 the redone rows are equal anyway).
"""

from __future__ import annotations

import json
import math
import secrets
import sys
from dataclasses import dataclass
from pathlib import Path

from psyrl.core.atomic import write_text

IDS_FILE = "trackers.json"  # runs/<name>/trackers.json: the wandb run id, kept for --resume


@dataclass
class TrackedRun:
    """What every tracker is told about the run at its start."""

    directory: Path  # runs/<name>/
    name: str
    project: str
    config: dict  # the resolved config, table by table
    config_text: str  # the same as TOML
    first: int  # the first step this process logs (1, or the checkpoint's step + 1)
    sent: int  # on --resume: the last step logged before the crash (-1 when starting afresh)


def scalars(row: dict) -> dict[str, float]:
    """The row's finite numbers (a tracker plots numbers; `step` is the x axis)."""
    return {
        k: float(v)
        for k, v in row.items()
        if k != "step"
        and isinstance(v, (int, float))
        and not isinstance(v, bool)
        and math.isfinite(v)
    }


class TensorBoard:
    """Scalars, the config and each sampled step's Markdown as text, in runs/<name>/tensorboard/."""

    rewinds = True

    def __init__(self, run: TrackedRun):
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        # purge_step writes a session-start marker; TensorBoard takes every start after the first
        # for a restart and drops the older events from its step on (plugin_event_accumulator.py,
        # _CheckForRestartAndMaybePurge), so a fresh run writes one at step 0 too
        self.writer = SummaryWriter(
            str(run.directory / "tensorboard"), purge_step=run.first if run.sent >= 0 else 0
        )
        if run.sent < 0:
            self.writer.add_text("config", "```toml\n" + run.config_text + "\n```", 0)

    def log(self, step: int, values: dict[str, float]) -> None:
        for key, value in values.items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()

    def samples(self, step: int, rows: list[dict], markdown: str) -> None:
        self.writer.add_text("samples", markdown, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class Wandb:
    """A wandb run (runs/<name>/wandb/) whose id is kept in trackers.json so --resume continues it;
    the samples as a wandb.Table. WANDB_MODE=offline keeps it on disk (`wandb sync` uploads it)."""

    rewinds = False

    def __init__(self, run: TrackedRun):
        import wandb

        self.wandb = wandb
        ids = _read_ids(run.directory)
        if "wandb" not in ids:  # a new run, or one whose first attempt never reached wandb
            ids["wandb"] = secrets.token_hex(4)  # a wandb run id: lowercase letters, digits
            write_text(run.directory / IDS_FILE, json.dumps(ids, indent=1) + "\n")
        (run.directory / "wandb").mkdir(exist_ok=True)
        self.run = wandb.init(
            project=run.project,
            name=run.name,
            id=ids["wandb"],
            dir=str(run.directory),
            config=run.config,
            resume="allow",
        )

    def log(self, step: int, values: dict[str, float]) -> None:
        self.run.log(values, step=step)

    def samples(self, step: int, rows: list[dict], markdown: str) -> None:
        columns = list(rows[0])
        table = self.wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])
        self.run.log({"samples": table}, step=step)

    def close(self) -> None:
        self.run.finish()


class Trackio:
    """A Trackio run named after the psyrl run (resumed by that name) in Trackio's own local
    database (TRACKIO_DIR, else ~/.cache/huggingface/trackio; `trackio show` opens it)."""

    rewinds = False

    def __init__(self, run: TrackedRun):
        import trackio

        self.trackio = trackio
        self.run = trackio.init(
            project=run.project,
            name=run.name,
            config=run.config,
            resume="allow" if run.sent >= 0 else "never",
            embed=False,
            auto_log_cpu=False,
            auto_log_gpu=False,
        )

    def log(self, step: int, values: dict[str, float]) -> None:
        self.trackio.log(values, step=step)

    def samples(self, step: int, rows: list[dict], markdown: str) -> None:
        self.trackio.log({"samples": self.trackio.Table(data=rows)}, step=step)

    def close(self) -> None:
        self.trackio.finish()


KINDS = {"tensorboard": TensorBoard, "wandb": Wandb, "trackio": Trackio}
EXTRAS = {"tensorboard": "psyrl[tensorboard]", "wandb": "psyrl[wandb]", "trackio": "psyrl[trackio]"}


def _read_ids(directory: Path) -> dict:
    path = directory / IDS_FILE
    return json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}


class Trackers:
    """The run's trackers; each call goes to every live one, and one that raises is warned about
    once and dropped (training goes on: metrics.jsonl has every row)."""

    def __init__(self, names: list[str], run: TrackedRun):
        self.sent = run.sent
        self.live: dict[str, object] = {}
        for name in names:
            try:
                self.live[name] = KINDS[name](run)
            except ImportError as e:
                self._warn(name, f'{e}; pip install "{EXTRAS[name]}"')
            except Exception as e:  # a tracker must never stop training
                self._warn(name, f"{type(e).__name__}: {e}")

    def _warn(self, name: str, why: str) -> None:
        print(
            f"warning: tracker {name} is off for the rest of the run ({why}); "
            "metrics.jsonl has every row",
            file=sys.stderr,
            flush=True,
        )
        self.live.pop(name, None)

    def _call(self, step: int, method: str, *args) -> None:
        for name, tracker in list(self.live.items()):
            if step <= self.sent and not tracker.rewinds:
                continue  # it already holds this step from the attempt before the crash
            try:
                getattr(tracker, method)(step, *args)
            except Exception as e:
                self._warn(name, f"{type(e).__name__}: {e}")

    def log(self, row: dict) -> None:
        self._call(row["step"], "log", scalars(row))

    def samples(self, step: int, rows: list[dict], markdown: str) -> None:
        if rows:
            self._call(step, "samples", rows, markdown)

    def close(self) -> None:
        for name, tracker in list(self.live.items()):
            try:
                tracker.close()
            except Exception as e:
                self._warn(name, f"{type(e).__name__}: {e}")
        self.live = {}
