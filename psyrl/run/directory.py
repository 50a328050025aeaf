"""The `Run`: what both trainers (`train_sft.py`, `train_tgrpo.py`) do around their loop. It owns
the run directory, `runs/<name>/`: its checks, the resume, metrics.jsonl, the trackers and the
progress bar, the end of every step (validation, checkpoint, preemption), the sample files and the
final export."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import secrets
import shutil
import socket
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from psyrl.core.atomic import tidy
from psyrl.core.checkpoints import (
    checkpoint_problems,
    find_resumable,
    has_checksums,
    json_text,
    run_results,
)
from psyrl.core.config import Config, ConfigError, config_changes, dump_config, load_config
from psyrl.core.errors import Preempted, RunError
from psyrl.core.runlog import MetricsFile, last_step, read_metrics, step_line, truncate_metrics
from psyrl.run.samples import sample_rows, write_samples
from psyrl.runtime.checkpoint import export_hf, load_checkpoint, save_checkpoint, verify_files
from psyrl.runtime.distributed import (
    Dist,
    all_gather_lists,
    all_reduce,
    barrier,
    broadcast_object,
    print0,
)
from psyrl.runtime.optim import lr_factor
from psyrl.runtime.preemption import Preemption

# may change on --resume: same numbers
RESUME_FREE = (
    "run.name",
    "run.output_dir",
    "run.preempt_signals",
    "run.preempt_now",
    "run.resume",
    "run.extend",
    "log",
    "checkpoint",
    "fsdp",
)
# how long a rank looks for rank 0's nonce file: a shared filesystem may show a new file late
SHARED_WAIT_S = 10.0


def check_shared(directory: Path, dist: Dist, wait_s: float = SHARED_WAIT_S) -> None:
    """Collective: a RunError on every rank unless every rank sees `directory` as rank 0 does.
    Rank 0 writes a nonce file there, every rank reads it back, all compare, rank 0 removes it (and
    the directories it made for it). Without this a node with its own copy of the path writes its
    checkpoint shards where no other node finds them, unnoticed: DCP's writer makes the directory it
    is given (torch/distributed/checkpoint/filesystem.py:539-542, `mkdir(parents=True,
    exist_ok=True)`, called from `prepare_local_plan`, :651-652) and rank 0's manifest lists only
    the files it sees."""
    if not dist.sharded:
        return
    made, nonce, error = [], None, None
    if dist.is_main:
        try:
            made = [p for p in (directory, *directory.parents) if not p.exists()]  # deepest first
            directory.mkdir(parents=True, exist_ok=True)
            nonce = secrets.token_hex(16)
            (directory / f".shared-{nonce}").write_text(nonce, encoding="utf-8")
        except OSError as e:
            error = f"{type(e).__name__}: {e}"
    # one decision for every rank: none is left waiting in the gather below
    nonce, error = broadcast_object((nonce, error), dist)
    if error:
        raise RunError(f"rank 0 cannot write in the run directory {directory} ({error})")
    nonce_file = directory / f".shared-{nonce}"
    saw = _reads(nonce_file, nonce, wait_s)
    seen = all_gather_lists(
        [(dist.rank, socket.gethostname(), str(directory.absolute()), saw)], dist
    )
    if dist.is_main:
        nonce_file.unlink()
        for d in made:
            with contextlib.suppress(OSError):  # not empty: someone else writes there
                d.rmdir()
    blind = [(rank, host, path) for rank, host, path, ok in seen if not ok]
    if blind:
        _, host0, path0, _ = seen[0]
        who = "; ".join(f"rank {rank} on {host} (looked in {path})" for rank, host, path in blind)
        raise RunError(
            f"the run directory {directory} is not shared: rank 0 on {host0} wrote "
            f"{nonce_file.name} in {path0}, and {who} did not find it within {wait_s:g} s. "
            "Checkpoints written there could never be resumed (each node would keep its own "
            "part); set run.output_dir to an absolute path on a filesystem every node mounts at "
            "the same place"
        )


def _reads(path: Path, nonce: str, wait_s: float) -> bool:
    """Whether `path` holds `nonce`, looking again every 0.2 s for up to `wait_s`."""
    deadline = time.monotonic() + wait_s
    while True:
        with contextlib.suppress(OSError, UnicodeDecodeError):
            if path.read_text(encoding="utf-8") == nonce:
                return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.2)


def _listing(held: list[str], shown: int = 8) -> str:
    """`run_results`' entries for a message: the first `shown`, then how many more."""
    more = f" and {len(held) - shown} more" if len(held) > shown else ""
    return ", ".join(held[:shown]) + more


class Run:
    """One training run's directory, `runs/<name>/`, from the checks before the first write to the
    final export (torchtitan's checkpointer, picotron's CheckpointManager). Used in this order:
    `Run(...)` refuses to clobber a run or to resume nothing and finds the checkpoint to resume;
    `check_data` ties the checkpoint to its data; `start` writes the resolved config; `resume`
    restores the model, optimiser and metrics; inside `with run:` (metrics.jsonl, trackers, progress
    bar and signal handlers open), the loops end each step with its parts in plain lines
    (`should_save`, `log`, `save`, `preempted_after`, `advance`, `stop`) and `write_samples` dumps a
    T-GRPO step's responses; `finish` exports the final model."""

    def __init__(
        self,
        cfg: Config,
        dist: Dist,
        name: str,
        line_fields: list,
        overwrite: bool,
        resume: str,
    ):
        """`resume`: run.resume (`off`, `on`, `auto`), which --resume sets."""
        self.cfg, self.dist, self.name, self.line_fields = cfg, dist, name, line_fields
        self.dir = Path(cfg.run.output_dir) / cfg.run.name
        # before any rank reads it: every rank must see the directory rank 0 sees
        check_shared(self.dir, dist)
        # rank 0 looks: the nodes of a job may see a shared filesystem at different moments
        metrics, held = broadcast_object(
            ((self.dir / "metrics.jsonl").exists(), run_results(self.dir)), dist
        )
        # checkpoints or an export without metrics are a run too: never written over as new
        exists = metrics or bool(held)
        if exists and not (overwrite or resume != "off"):
            raise RunError(
                f"{self.dir} already holds a run; pass --resume to continue it or "
                "--overwrite to start over"
            )
        if resume == "on" and not exists:
            raise RunError(f"--resume: {self.dir} holds no run")
        flag = "--resume" if resume == "on" else "--resume auto"
        if exists and not metrics and not overwrite:
            raise RunError(
                f"{flag}: {self.dir} holds {_listing(held)} but no metrics.jsonl, so it cannot "
                "be continued, and nothing was deleted; put its metrics.jsonl back, or pass "
                "--overwrite to delete the whole run and start over"
            )
        self.wipe = overwrite and exists
        self.checkpoint = None
        self.planned = cfg.run.steps  # the run.steps of the checkpoint resumed (less: --extend)
        if cfg.run.extend and resume == "off":
            raise RunError("--extend (run.extend) continues a run: pass --resume with it")
        if resume == "on" or (resume == "auto" and exists):
            self.checkpoint = self._resumable(required=resume == "on")
        # a run that holds checkpoints is never deleted here: `_resumable` refuses when none passes
        if resume == "auto" and exists and self.checkpoint is None:
            if held:  # what no checkpoint check recognises (renamed, moved, a file) or an export
                raise RunError(
                    f"--resume auto: {self.dir} holds {_listing(held)} but no checkpoint to "
                    "resume from (checkpoints/step-N), and nothing was deleted; restore its "
                    "checkpoints, move what it holds out of the run directory, or pass "
                    "--overwrite to delete the whole run and start over"
                )
            self._start_over()
        # torchrun's count of this job's worker restarts (0 outside torchrun), in every row: the
        # maximum over ranks, as each agent counts only its own workers' failures (a restart
        # another node caused, or a node's new agent, counts 0 there: torch/distributed/elastic/
        # agent/server/api.py:940-970, local_elastic_agent.py:403 and :426)
        restart = float(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        self.restart = int(all_reduce(torch.tensor(restart), dist, "max").item())
        self.state: dict = {}  # trainer.json of the checkpoint resumed
        self.first = 1  # the first step this process runs
        self.data: dict = {}
        self.resolved = ""
        self.metrics: MetricsFile | None = None
        self.trackers = None  # psyrl.run.trackers.Trackers, when log.report_to names any
        self.sent = -1  # on --resume: the last step metrics.jsonl held before it was rewound
        self.bar = None
        self.preemption: Preemption | None = None
        self.saved = -1  # the step of the newest checkpoint, -1 for none
        # (step, planned steps) of every --extend of this run, in order (trainer.json)
        self.extensions: list[list[int]] = []

    def _changed(self, saved_config: Path, what: str) -> list[str]:
        """The keys in which this config differs from the run's `saved_config` in a way that
        matters (RESUME_FREE aside; run.steps growing under --extend, which sets `planned`)."""
        try:
            saved = load_config(saved_config)
        except ConfigError as e:
            raise RunError(
                f"{what}: cannot read the config the run was started with ({e}); a run "
                "started by an older psyrl may use keys this version no longer has"
            ) from None
        changed = [
            k
            for k in config_changes(saved, self.cfg)
            if k not in RESUME_FREE and k.split(".")[0] not in RESUME_FREE
        ]
        if self.cfg.run.extend and "run.steps" in changed:
            if self.cfg.run.steps < saved.run.steps:
                raise RunError(
                    f"--extend lets run.steps grow, not shrink: {saved_config} planned "
                    f"{saved.run.steps} steps, this config {self.cfg.run.steps}"
                )
            changed.remove("run.steps")
            self.planned = saved.run.steps
        return changed

    def _resumable(self, required: bool = True) -> Path | None:
        """The checkpoint to resume from, after checking the run's config has not changed in a way
        that matters. `required` (--resume): the newest checkpoint, else a RunError. Not required
        (--resume auto): the newest that passes its checks, the damaged ones skipped with a
        warning; None only when the run has no checkpoint directory at all; a RunError naming each
        checkpoint and why when it has some and none passes (nothing is deleted)."""
        dist = self.dist
        corrupted: dict[Path, str] = {}  # checkpoint -> the checksum it failed
        while True:
            found = None
            if dist.is_main:
                found = find_resumable(self.dir, lambda line: print0(line, dist), corrupted)
            # rank 0 decides: nodes may see a shared filesystem differently
            checkpoint = broadcast_object(found, dist)
            if checkpoint is None or not (problem := verify_files(checkpoint, dist)):
                break
            # its files are complete but not the bytes written (bit rot, a bad copy)
            message = f"{checkpoint}: damaged checkpoint ({problem})"
            if required:
                raise RunError(
                    f"--resume: {message}; --resume auto would skip it and continue from the "
                    "checkpoint before it"
                )
            print0(f"warning: skipping {message}", dist)
            corrupted[checkpoint] = problem
        # the checkpoints newer than the one found (all when none was): why each was passed over
        passed = None
        if dist.is_main:
            passed = checkpoint_problems(self.dir, corrupted, after=checkpoint)
        passed = broadcast_object(passed, dist)
        if required and passed:
            newest, why = passed[-1]
            raise RunError(
                f"--resume: {newest}: damaged checkpoint ({why}); --resume auto would skip it and "
                "continue from the checkpoint before it"
            )
        if checkpoint is None and passed:
            reasons = "; ".join(f"{d} ({why})" for d, why in passed)
            raise RunError(
                f"--resume{'' if required else ' auto'}: no checkpoint of {self.dir} passes its "
                f"checks, and nothing was deleted: {reasons}. Repair them (`psyrl checkpoint "
                "verify` names every problem) or move them out of the run directory; --overwrite "
                "deletes the whole run and starts over"
            )
        if checkpoint is not None and not has_checksums(checkpoint):
            print0(
                f"note: {checkpoint} was written before psyrl recorded checksums: its files' "
                "sizes were checked, not their contents",
                dist,
            )
        if checkpoint is None:
            if not required:
                return None
            raise RunError(
                f"--resume: {self.dir} holds no complete checkpoint with a training state "
                "(checkpoint.every = 0 saves none; checkpoint.keep_state prunes older ones)"
            )
        changed = self._changed(checkpoint / "config.resolved.toml", "--resume")
        if changed:
            extend = "" if self.cfg.run.extend else " (--extend lets run.steps grow)"
            raise RunError(
                f"--resume: the config differs from {checkpoint / 'config.resolved.toml'} "
                f"in {', '.join(changed)}; resuming would not continue the same run{extend}"
            )
        return checkpoint

    def _start_over(self) -> None:
        """run.resume = auto on a run that holds steps but nothing in checkpoints/ and no export
        (cut short before its first checkpoint): start over when the steps are this config's, else
        refuse."""
        saved = self.dir / "config.resolved.toml"
        # rank 0 reads: one answer for every node
        readable = broadcast_object(saved.is_file(), self.dist)
        changed = self._changed(saved, "--resume auto") if readable else ["(no config)"]
        self.planned = self.cfg.run.steps  # a start over extends nothing
        if changed:
            raise RunError(
                f"--resume auto: {self.dir} holds a run with no complete checkpoint and its "
                f"config differs from this one in {', '.join(changed)}; pass --overwrite to "
                "start over"
            )
        print0(
            f"{self.name}: {self.dir} holds steps of this config but no complete checkpoint "
            "(cut short before the first); starting over",
            self.dist,
        )
        self.wipe = True

    def check_data(self, data_path: str, count: int) -> None:
        """Fingerprint the training data; resuming on other data at the same path is refused: the
        saved data position would point into a different list."""
        self.data = {
            "sha256": hashlib.sha256(Path(data_path).read_bytes()).hexdigest(),
            "examples": count,
        }
        if self.checkpoint:
            self.state = json.loads((self.checkpoint / "trainer.json").read_text(encoding="utf-8"))
            if self.state.get("data") != self.data:
                raise RunError(
                    f"--resume: {data_path} is not the data {self.checkpoint} was trained "
                    f"on ({self.state.get('data')}, now {self.data}): its data position is "
                    "void"
                )

    def start(self, train_records, valid_records) -> None:
        """Warn about legal but suspicious inputs, then create the run directory (emptied first on
        --overwrite of an existing run) with its resolved config: the first write."""
        cfg, dist = self.cfg, self.dist
        if cfg.fsdp.offload == "always" and not dist.sharded:
            print0(
                "note: fsdp.offload = 'always' applies under torchrun with 2 or more ranks; one "
                "process keeps the model in place",
                dist,
            )
        shared = {r.id for r in train_records} & {r.id for r in valid_records}
        if shared:
            print0(
                f"warning: {len(shared)} validation id(s) are also training ids (e.g. "
                f"{min(shared)}): not held out",
                dist,
            )
        self.resolved = dump_config(cfg)
        if dist.is_main:
            if self.wipe:  # only ever delete what a run wrote
                shutil.rmtree(self.dir)
            self.dir.mkdir(parents=True, exist_ok=True)
            tidy(self.dir)
            (self.dir / "config.resolved.toml").write_text(self.resolved, encoding="utf-8")
        barrier(dist)

    def resume(self, policy, optimizer) -> dict:
        """Load the checkpoint's model and optimiser state and drop the metrics rows after its step
        (they are redone); returns its trainer.json ({} when starting afresh)."""
        if self.checkpoint is None:
            return {}
        dist = self.dist
        load_checkpoint(
            self.checkpoint,
            policy,
            optimizer,
            dist,
            lambda line: print(f"rank {dist.rank}: {line}", flush=True),
        )
        self.first = self.state["step"] + 1
        self.saved = self.state["step"]
        self.extensions = list(self.state.get("lr_extensions", []))
        if self.planned != self.cfg.run.steps:
            self.extensions.append([self.state["step"], self.planned])
        if dist.is_main:
            self.sent = last_step(self.dir / "metrics.jsonl")
            broken = truncate_metrics(self.dir / "metrics.jsonl", self.state["step"])
            if broken:
                print0(
                    f"warning: dropped {broken} unreadable line(s) of metrics.jsonl (cut short by "
                    "the crash)",
                    dist,
                )
        return self.state

    def lr_factor(self, update: int, per_step: int = 1) -> float:
        """The learning-rate factor of the 0-based `update` (`per_step` updates a step) over
        run.steps, with this run's extensions (`psyrl.runtime.optim.lr_factor`)."""
        extensions = [(step * per_step, planned * per_step) for step, planned in self.extensions]
        return lr_factor(update, self.cfg.optim, self.cfg.run.steps * per_step, extensions)

    def banner(self, text: str) -> None:
        """The start-up line: `text`, then the run directory and where a resume starts."""
        resuming = ""
        if self.checkpoint:
            resuming = f"; resuming after step {self.first - 1} from {self.checkpoint}"
        if self.planned != self.cfg.run.steps:
            schedule = (
                "stays constant"
                if self.cfg.optim.schedule == "constant"
                else "decays on from its last rate to 0 at the new end, with no jump"
            )
            resuming += (
                f"; extended from {self.planned} to {self.cfg.run.steps} steps (--extend): the "
                f"learning rate {schedule} (after the warm-up first planned); the data position "
                f"and the trajectory cache continue from step {self.first - 1}"
            )
        print0(f"{self.name}: {text}; run directory {self.dir}{resuming}", self.dist)

    def __enter__(self) -> Run:
        """Open metrics.jsonl (rank 0, appended and flushed per row) and the progress bar of the
        run's steps."""
        cfg = self.cfg
        if self.dist.is_main:
            self.metrics = MetricsFile(self.dir / "metrics.jsonl")
            if cfg.log.report_to:  # the trackers' adapters, imported for a run that has some
                from psyrl.run.trackers import TrackedRun, Trackers

                self.trackers = Trackers(
                    cfg.log.report_to,
                    TrackedRun(
                        self.dir,
                        cfg.run.name,
                        cfg.log.project,
                        dataclasses.asdict(cfg),
                        self.resolved,
                        self.first,
                        self.sent,
                    ),
                )
        self.bar = tqdm(
            total=self.cfg.run.steps,
            initial=self.first - 1,
            desc=self.name,
            unit="step",
            file=sys.stdout,
            disable=not (self.cfg.log.progress and self.dist.is_main),
        )
        self.preemption = Preemption(cfg.run.preempt_signals)
        return self

    def __exit__(self, *exc) -> None:
        self.preemption.close()
        self.bar.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.trackers is not None:
            self.trackers.close()

    def log(self, row: dict, echo: bool = False) -> None:
        """Append a row to metrics.jsonl, then send it to the trackers; `echo`: also print its
        console line."""
        row = {**row, "perf/restart": self.restart}
        if self.metrics is not None:
            self.metrics.write(row)
        if self.trackers is not None:
            self.trackers.log(row)
        if echo:
            print0(step_line(row, self.line_fields), self.dist)

    def should_save(self, step: int) -> bool:
        """A checkpoint every checkpoint.every steps and at the last (none when every = 0)."""
        every = self.cfg.checkpoint.every
        return every > 0 and (step % every == 0 or step == self.cfg.run.steps)

    def save(
        self,
        step: int,
        policy,
        optimizer,
        tokenizer,
        state: dict,
        files: dict[str, str],
        validation=None,
    ) -> None:
        """`checkpoints/step-N/`: model, optimiser and RNG (`psyrl.runtime.checkpoint`), the
        resolved config, trainer.json (step, data fingerprint, `state`), `files`, and
        validation.json (every held-out set's metrics) and one responses file per set
        (validation.jsonl for data.valid_file, validation-<stem>.jsonl for each data.valid_files
        entry; with data.valid_samples > 1 a row per response, numbered by "sample") when
        `validation` is (`psyrl.run.validation.ValidSet`s, metrics, each set's outputs); a failed
        write raises CheckpointError (the previous checkpoints are intact)."""
        files = {
            "config.resolved.toml": self.resolved,
            "trainer.json": json_text(
                {
                    "step": step,
                    "data": self.data,
                    **({"lr_extensions": self.extensions} if self.extensions else {}),
                    **state,
                }
            ),
            **files,
        }
        if validation is not None:
            sets, metrics, outputs = validation
            files["validation.json"] = json_text({"step": step, **metrics})
            n = self.cfg.data.valid_samples
            for held_out, completions in zip(sets, outputs):
                files[held_out.responses_file] = "".join(
                    json.dumps(
                        {
                            "id": r.id,
                            **({"sample": j % n} if n > 1 else {}),
                            "answer": r.answer,
                            "response": s.text,
                            "tokens": len(s.token_ids),
                            "finish_reason": s.finish_reason,
                        }
                    )
                    + "\n"
                    for j, (r, s) in enumerate(
                        zip((r for r in held_out.records for _ in range(n)), completions)
                    )
                )
        keep, dtype = self.cfg.checkpoint.keep_state, self.cfg.checkpoint.export_dtype
        save_checkpoint(self.dir, step, policy, optimizer, tokenizer, files, self.dist, keep, dtype)
        self.saved = step

    def preempted(self) -> str | None:
        """Collective (every rank at the same point): the preemption signal some rank received
        (run.preempt_signals), or None."""
        return self.preemption.requested(self.dist)

    def preempted_after(self, step: int) -> str | None:
        """`preempted()` at the end of `step` (and again after its checkpoint): None after the last
        step, which finishes the run instead."""
        return self.preempted() if step < self.cfg.run.steps else None

    def stop(self, signal: str) -> Preempted:
        """The exception that ends a preempted run, saying what was kept and how to resume."""
        if self.saved < 1:
            return Preempted(
                f"{self.name}: preempted by {signal} before any checkpoint; nothing to resume: "
                "run the same command with --overwrite to start again"
            )
        return Preempted(
            f"{self.name}: preempted by {signal}; checkpoint of step {self.saved} in "
            f"{self.dir / 'checkpoints' / f'step-{self.saved}'}; run the same command with "
            "--resume to continue"
        )

    def write_samples(
        self, step: int, samples: list, components: dict, advantages, means: dict, records: list
    ) -> None:
        """Every log.samples_every steps, on rank 0: samples/step-N.jsonl and .md (`records`: the
        step's prompts in step order; `means`: the step's reward metrics), also sent to the
        trackers."""
        every = self.cfg.log.samples_every
        if not (every and step % every == 0 and self.dist.is_main):
            return
        rows = sample_rows(samples, components, advantages)
        shown, variant = self.cfg.log.samples_prompts, self.cfg.reward.variant
        markdown = write_samples(self.dir / "samples", step, rows, means, records, shown, variant)
        if self.trackers is not None:
            self.trackers.samples(step, rows, markdown)

    def advance(self, step: int, row: dict) -> None:
        """The step is done: move the bar, and print its line every log.every steps and at the
        last."""
        self.bar.update(1)
        if step % self.cfg.log.every == 0 or step == self.cfg.run.steps:
            print0(step_line(row, self.line_fields), self.dist)

    def finish(self, policy, tokenizer) -> None:
        """The final HF export `runs/<name>/hf/` in checkpoint.export_dtype, with its model card."""
        from psyrl.run.card import model_card  # read at the end only: not the loop's

        card = None
        if self.dist.is_main:
            card = model_card(
                self.cfg,
                self.name,
                self.resolved,
                self.data,
                read_metrics(self.dir / "metrics.jsonl"),
            )
        files = {"README.md": card} if card else None
        export_hf(
            policy, tokenizer, self.dir / "hf", self.dist, self.cfg.checkpoint.export_dtype, files
        )
        print0(f"{self.name}: done; final model in {self.dir / 'hf'}", self.dist)
