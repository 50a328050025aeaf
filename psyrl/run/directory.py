"""What both trainers (`train_sft.py`, `train_tgrpo.py`) do around their loop: the click entry that
fails once on rank 0, and the `Run`, which owns the run directory: its checks, the resume,
metrics.jsonl and the progress bar, the checkpoints and the final export."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import click
import torch
import transformers
from tqdm import tqdm

import psyrl
from psyrl.core.atomic import tidy
from psyrl.core.config import ConfigError, config_changes, dump_config, load_config
from psyrl.core.runlog import (
    MetricsFile,
    last_step,
    read_metrics,
    step_line,
    truncate_metrics,
)
from psyrl.plan.memory import load_architecture, plan
from psyrl.run.trackers import TrackedRun, Trackers
from psyrl.runtime.checkpoint import (
    CheckpointError,
    export_hf,
    find_resumable,
    json_text,
    load_checkpoint,
    save_checkpoint,
)
from psyrl.runtime.distributed import (
    Dist,
    barrier,
    broadcast_object,
    cleanup,
    init_distributed,
    print0,
)
from psyrl.runtime.preemption import EXIT_PREEMPTED, Preempted, Preemption
from psyrl.runtime.vllm_sampler import (  # imports no vLLM
    VLLMUnavailable,
    check_tensor_parallel,
    import_vllm,
)

# may change on --resume: same numbers
RESUME_FREE = (
    "run.name",
    "run.output_dir",
    "run.preempt_signals",
    "run.preempt_now",
    "log",
    "checkpoint",
    "fsdp",
)


def run_entry(train: Callable, config_path, overrides, overwrite: bool, resume: bool) -> None:
    """Load the config, join the process group, call train(cfg, dist, overwrite, resume); every
    error is one click message, said once by rank 0 (the other ranks fail the same way and exit
    quietly)."""
    try:
        # no per-save bars inside psyrl's own progress bar
        transformers.utils.logging.disable_progress_bar()
        if overwrite and resume:
            raise click.ClickException("--overwrite and --resume exclude each other")
        try:
            cfg = load_config(config_path, overrides)
            # CPU tensors: gloo beside nccl
            host_shards = cfg.fsdp.offload != "none" or cfg.fsdp.ref_offload
            if cfg.sampler.engine == "vllm":
                import_vllm()  # before anything starts: a torch run never imports it
            dist = init_distributed(cfg.run.device, host_shards, cfg.fsdp.timeout_minutes)
            if cfg.sampler.engine == "vllm":
                check_tensor_parallel(cfg.sampler.tensor_parallel, dist.world)
        except (ConfigError, ValueError, VLLMUnavailable) as e:
            raise click.ClickException(str(e)) from None
        try:
            train(cfg, dist, overwrite, resume)
        # e.g. a full disk while logging: which file, not a traceback (checkpoints are atomic)
        except OSError as e:
            raise click.ClickException(f"file error: {e}") from None
        except Preempted as e:
            print0(str(e), dist)
            cleanup(dist)
            raise SystemExit(EXIT_PREEMPTED) from None
        # on a normal exit only: after an error, NCCL work may be in flight and the process just
        # ends
        cleanup(dist)
    except click.ClickException as e:
        if int(os.environ.get("RANK", "0")) != 0:
            raise SystemExit(e.exit_code) from None
        raise


def check_memory_plan(cfg, dist: Dist, trainer: str) -> None:
    """On CUDA: print `psyrl plan`'s verdict for this config on these GPUs (their memory read from
    the device, the node's RAM from the OS), and refuse a config it predicts will not fit, unless
    run.memory_check is false."""
    if dist.device.type != "cuda":
        return
    try:
        architecture, _ = load_architecture(cfg.model)
        gpu_gib = torch.cuda.get_device_properties(dist.device).total_memory / 2**30
        # the host figures are per node, with every rank on it
        one_node = dist.world == dist.local_world
        host_gib = (
            os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if one_node else None
        )
        memory = plan(cfg, architecture, dist.world, gpu_gib, host_gib, trainer)
    except ValueError as e:  # e.g. an architecture the planner does not model
        print0(f"memory plan: not available ({e})", dist)
        return
    print0(
        memory.verdict()
        + ("" if memory.fits else " (`psyrl plan --config ...` prints the whole table)"),
        dist,
    )
    gpus_fit = all(p.fits for p in memory.phases) and (
        memory.pool is None or memory.pool.sequences >= 1
    )
    # host RAM rests on a per-rank assumption: a warning only
    if not gpus_fit and cfg.run.memory_check:
        raise click.ClickException(
            f"{memory.verdict()}; set run.memory_check = false to start anyway"
        )


class Run:
    """One training run's directory, `runs/<name>/`, from the checks before the first write to the
    final export (torchtitan's checkpointer, picotron's CheckpointManager). Used in this order:
    `Run(...)` refuses to clobber a run or to resume nothing and finds the checkpoint to resume;
    `check_data` ties the checkpoint to its data; `start` writes the resolved config; `resume`
    restores the model, optimiser and metrics; inside `with run:`, `log` / `should_save` / `save` /
    `advance` each step (and `preempted` / `stop` when a scheduler's signal came); `finish` exports
    the final model."""

    def __init__(
        self, cfg, dist: Dist, name: str, line_fields: list, overwrite: bool, resume: bool
    ):
        self.cfg, self.dist, self.name, self.line_fields = cfg, dist, name, line_fields
        self.dir = Path(cfg.run.output_dir) / cfg.run.name
        exists = (self.dir / "metrics.jsonl").exists()
        if exists and not (overwrite or resume):
            raise click.ClickException(
                f"{self.dir} already holds a run; pass --resume to continue it or "
                "--overwrite to start over"
            )
        if resume and not exists:
            raise click.ClickException(f"--resume: {self.dir} holds no run")
        self.wipe = overwrite and exists
        self.checkpoint = self._resumable() if resume else None
        self.state: dict = {}  # trainer.json of the checkpoint resumed
        self.first = 1  # the first step this process runs
        self.data: dict = {}
        self.resolved = ""
        self.metrics: MetricsFile | None = None
        self.trackers: Trackers | None = None
        self.sent = -1  # on --resume: the last step metrics.jsonl held before it was rewound
        self.bar = None
        self.preemption: Preemption | None = None
        self.saved = -1  # the step of the newest checkpoint, -1 for none

    def _resumable(self) -> Path:
        """The checkpoint to resume from, after checking the run's config has not changed in a way
        that matters."""
        dist = self.dist
        found = find_resumable(self.dir, lambda line: print0(line, dist)) if dist.is_main else None
        # rank 0 decides: nodes may see a shared filesystem differently
        checkpoint = broadcast_object(found, dist)
        if checkpoint is None:
            raise click.ClickException(
                f"--resume: {self.dir} holds no complete checkpoint with a training state "
                "(checkpoint.every = 0 saves none; checkpoint.keep_state prunes older ones)"
            )
        try:
            saved = load_config(checkpoint / "config.resolved.toml")
        except ConfigError as e:
            raise click.ClickException(
                f"--resume: cannot read the config the run was started with ({e}); a run "
                "started by an older psyrl may use keys this version no longer has"
            ) from None
        changed = [
            k
            for k in config_changes(saved, self.cfg)
            if k not in RESUME_FREE and k.split(".")[0] not in RESUME_FREE
        ]
        if changed:
            raise click.ClickException(
                f"--resume: the config differs from {checkpoint / 'config.resolved.toml'} "
                f"in {', '.join(changed)}; resuming would not continue the same run"
            )
        return checkpoint

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
                raise click.ClickException(
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

    def banner(self, text: str) -> None:
        """The start-up line: `text`, then the run directory and where a resume starts."""
        resuming = ""
        if self.checkpoint:
            resuming = f"; resuming after step {self.first - 1} from {self.checkpoint}"
        print0(f"{self.name}: {text}; run directory {self.dir}{resuming}", self.dist)

    def __enter__(self) -> Run:
        """Open metrics.jsonl (rank 0, appended and flushed per row) and the progress bar of the
        run's steps."""
        cfg = self.cfg
        if self.dist.is_main:
            self.metrics = MetricsFile(self.dir / "metrics.jsonl")
            if cfg.log.report_to:
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
        if self.metrics is not None:
            self.metrics.write(row)
        if self.trackers is not None:
            self.trackers.log(row)
        if echo:
            print0(step_line(row, self.line_fields), self.dist)

    def log_samples(self, step: int, rows: list[dict], markdown: str) -> None:
        """A step's samples (as written to samples/step-N.jsonl and .md) to the trackers."""
        if self.trackers is not None:
            self.trackers.samples(step, rows, markdown)

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
        validation.json / validation.jsonl when `validation` is (records, metrics, outputs); a
        failed write is one message."""
        files = {
            "config.resolved.toml": self.resolved,
            "trainer.json": json_text({"step": step, "data": self.data, **state}),
            **files,
        }
        if validation is not None:
            records, metrics, outputs = validation
            files["validation.json"] = json_text({"step": step, **metrics})
            files["validation.jsonl"] = "".join(
                json.dumps(
                    {
                        "id": r.id,
                        "answer": r.answer,
                        "response": s.text,
                        "tokens": len(s.token_ids),
                        "finish_reason": s.finish_reason,
                    }
                )
                + "\n"
                for r, s in zip(records, outputs)
            )
        try:
            save_checkpoint(
                self.dir,
                step,
                policy,
                optimizer,
                tokenizer,
                files,
                self.dist,
                self.cfg.checkpoint.keep_state,
                self.cfg.checkpoint.export_dtype,
            )
        except CheckpointError as e:
            raise click.ClickException(str(e)) from None
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

    def advance(self, step: int, row: dict) -> None:
        """The step is done: move the bar, and print its line every log.every steps and at the
        last."""
        self.bar.update(1)
        if step % self.cfg.log.every == 0 or step == self.cfg.run.steps:
            print0(step_line(row, self.line_fields), self.dist)

    def finish(self, policy, tokenizer) -> None:
        """The final HF export `runs/<name>/hf/` in checkpoint.export_dtype, with its model card."""
        card = None
        if self.dist.is_main:
            card = model_card(
                self.cfg,
                self.name,
                self.resolved,
                self.data,
                read_metrics(self.dir / "metrics.jsonl"),
            )
        try:
            export_hf(
                policy,
                tokenizer,
                self.dir / "hf",
                self.dist,
                self.cfg.checkpoint.export_dtype,
                {"README.md": card} if card else None,
            )
        except CheckpointError as e:
            raise click.ClickException(str(e)) from None
        print0(f"{self.name}: done; final model in {self.dir / 'hf'}", self.dist)


def psyrl_commit() -> str:
    """The git commit of the psyrl checkout this runs from, or why there is none."""
    try:
        found = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
            cwd=Path(psyrl.__file__).parent,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no git)"
    return found.stdout.strip() if found.returncode == 0 else "unknown (not a git checkout)"


def model_card(cfg, trainer: str, resolved: str, data: dict, rows: list[dict]) -> str:
    """hf/README.md: where the model comes from (base model, trainer, psyrl version and commit), the
    data it saw (paths and sha256), its last held-out scores, and the resolved config."""
    base = cfg.model.path or f"none: a tiny model built from [model] (seed {cfg.run.seed})"
    valid = [r for r in rows if any(k.startswith("valid/") for k in r)]
    files = [("train", cfg.data.train_file, data.get("sha256", ""), data.get("examples", ""))]
    if cfg.data.valid_file:
        digest = hashlib.sha256(Path(cfg.data.valid_file).read_bytes()).hexdigest()
        files.append(("validation", cfg.data.valid_file, digest, cfg.data.valid_items or "all"))
    lines = [
        "---",
        f"base_model: {json.dumps(cfg.model.path) if cfg.model.path else 'null'}",
        "library_name: transformers",
        f"tags: [psyrl, {trainer}]",
        "---",
        "",
        f"# {cfg.run.name}",
        "",
        f"Trained with psyrl {psyrl.__version__} (commit {psyrl_commit()}): `{trainer}`, "
        f"{cfg.run.steps} steps{'' if trainer == 'sft' else f', reward {cfg.reward.variant}'}; "
        f"weights in {cfg.checkpoint.export_dtype}. Base model: {base}.",
        "",
        "## Data",
        "",
        "| split | file | sha256 | items used |",
        "| --- | --- | --- | ---: |",
        *[f"| {split} | `{path}` | `{digest}` | {n} |" for split, path, digest, n in files],
        "",
    ]
    if valid:
        last = valid[-1]
        lines += [
            f"## Held-out scores (validation at step {last['step']})",
            "",
            "| metric | value |",
            "| --- | ---: |",
            *[
                f"| {k} | {v:.4f} |"
                for k, v in last.items()
                if k.startswith("valid/") and isinstance(v, float)
            ],
            "",
        ]
    lines += [
        "## Configuration (config.resolved.toml)",
        "",
        "```toml",
        resolved.rstrip(),
        "```",
        "",
    ]
    return "\n".join(lines)
