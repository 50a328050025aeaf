"""What both entry scripts (`train_sft.py`, `train_tgrpo.py`) do around their loop: the click entry that fails
once on rank 0, the run directory, `--resume` checks, the policy and its sampler, the weight sync."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

import click
import torch
import transformers
from tqdm import tqdm

from psyrl.core.atomic import tidy
from psyrl.core.config import ConfigError, config_changes, dump_config, load_config
from psyrl.core.runlog import MetricsFile, truncate_metrics
from psyrl.runtime.checkpoint import CheckpointError, export_hf, find_resumable, json_text, save_checkpoint
from psyrl.runtime.distributed import (
    DTYPES,
    Dist,
    barrier,
    broadcast_object,
    cast_parameters,
    cleanup,
    init_distributed,
    load_sharded,
    print0,
    sync_buckets,
    unsharded_copy,
)
from psyrl.runtime.memory_plan import load_architecture, plan
from psyrl.runtime.model import Policy, load_model, model_config
from psyrl.runtime.sampler import TorchSampler
from psyrl.runtime.vllm_sampler import (  # imports no vLLM
    VLLMSampler,
    VLLMUnavailable,
    check_tensor_parallel,
    engine_model_dir,
    import_vllm,
)

RESUME_FREE = ("run.name", "run.output_dir", "log", "checkpoint", "fsdp")  # may change on --resume: same numbers


def entry_command(example_config: str, state: str):
    """The click command of an entry script with the options both take: --config, --set, --overwrite, --resume
    (`state`: what a checkpoint restores, for --resume's help)."""
    options = [
        click.option("--config", "config_path", type=click.Path(dir_okay=False), required=True,
                     help=f"TOML run config, e.g. {example_config}."),
        click.option("--set", "overrides", multiple=True, metavar="TABLE.KEY=VALUE",
                     help="Override one key; repeatable."),
        click.option("--overwrite", is_flag=True, help="Delete an existing runs/<name>/ and start over."),
        click.option("--resume", is_flag=True, help=f"Continue runs/<name>/ from its newest complete checkpoint "
                     f"({state}); the config may differ only in run.name, run.output_dir and the log, checkpoint "
                     "and fsdp tables."),
    ]

    def decorate(main: Callable) -> click.Command:
        for option in reversed(options):  # listed in --help in this order
            main = option(main)
        return click.command(context_settings={"help_option_names": ["-h", "--help"]})(main)

    return decorate


def run_entry(train: Callable, config_path, overrides, overwrite: bool, resume: bool) -> None:
    """Load the config, join the process group, call train(cfg, dist, overwrite, resume); every error is one
    click message, said once by rank 0 (the other ranks fail the same way and exit quietly)."""
    try:
        transformers.utils.logging.disable_progress_bar()  # no per-save bars inside psyrl's own progress bar
        if overwrite and resume:
            raise click.ClickException("--overwrite and --resume exclude each other")
        try:
            cfg = load_config(config_path, overrides)
            host_shards = cfg.fsdp.offload != "none" or cfg.fsdp.ref_offload  # CPU tensors need gloo beside nccl
            check_sampler(cfg)
            dist = init_distributed(cfg.run.device, host_shards, cfg.fsdp.timeout_minutes)
            if cfg.sampler.engine == "vllm":
                check_tensor_parallel(cfg.sampler.tensor_parallel, dist.world)
        except (ConfigError, ValueError, VLLMUnavailable) as e:
            raise click.ClickException(str(e)) from None
        try:
            train(cfg, dist, overwrite, resume)
        except OSError as e:  # e.g. a full disk while logging: say which file, not a traceback (checkpoints are atomic)
            raise click.ClickException(f"file error: {e}") from None
        cleanup(dist)  # on a normal exit only: after an error, NCCL work may be in flight and the process just ends
    except click.ClickException as e:
        if int(os.environ.get("RANK", "0")) != 0:
            raise SystemExit(e.exit_code) from None
        raise


def check_sampler(cfg) -> None:
    """Before anything starts: `sampler.engine = "vllm"` needs vLLM installed (a torch run never imports it)."""
    if cfg.sampler.engine == "vllm":
        import_vllm()


def check_run_dir(run_dir: Path, overwrite: bool, resume: bool) -> bool:
    """Whether `run_dir` already holds a run, after refusing to clobber it or to resume nothing."""
    exists = (run_dir / "metrics.jsonl").exists()
    if exists and not (overwrite or resume):
        raise click.ClickException(f"{run_dir} already holds a run; pass --resume to continue it or --overwrite "
                                   "to start over")
    if resume and not exists:
        raise click.ClickException(f"--resume: {run_dir} holds no run")
    return exists


def open_run_dir(run_dir: Path, cfg, dist: Dist, wipe: bool) -> str:
    """Create `run_dir` (emptied first when `wipe`: --overwrite of an existing run) with its resolved config;
    returns that config's TOML text."""
    resolved = dump_config(cfg)
    if dist.is_main:
        if wipe:  # only ever delete what a run wrote
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        tidy(run_dir)
        (run_dir / "config.resolved.toml").write_text(resolved, encoding="utf-8")
    barrier(dist)
    return resolved


def check_resume(run_dir: Path, cfg, dist: Dist) -> Path:
    """The checkpoint to resume from, after checking the run's config has not changed in a way that matters."""
    found = find_resumable(run_dir, lambda line: print0(line, dist)) if dist.is_main else None
    checkpoint = broadcast_object(found, dist)  # rank 0 decides: nodes may see a shared filesystem differently
    if checkpoint is None:
        raise click.ClickException(f"--resume: {run_dir} holds no complete checkpoint with a training state "
                                   "(checkpoint.every = 0 saves none; checkpoint.keep_state prunes older ones)")
    try:
        saved = load_config(checkpoint / "config.resolved.toml")
    except ConfigError as e:
        raise click.ClickException(f"--resume: cannot read the config the run was started with ({e}); a run started "
                                   "by an older psyrl may use keys this version no longer has") from None
    changed = [k for k in config_changes(saved, cfg) if k not in RESUME_FREE and k.split(".")[0] not in RESUME_FREE]
    if changed:
        raise click.ClickException(f"--resume: the config differs from {checkpoint / 'config.resolved.toml'} in "
                                   f"{', '.join(changed)}; resuming would not continue the same run")
    return checkpoint


def check_memory_plan(cfg, dist: Dist, trainer: str) -> None:
    """On CUDA: print `psyrl plan`'s verdict for this config on these GPUs (their memory read from the device, the
    node's RAM from the OS), and refuse a config it predicts will not fit, unless run.memory_check is false."""
    if dist.device.type != "cuda":
        return
    try:
        architecture, _ = load_architecture(cfg.model)
        gpu_gib = torch.cuda.get_device_properties(dist.device).total_memory / 2**30
        one_node = dist.world == dist.local_world  # the host figures are per node, with every rank on it
        host_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30 if one_node else None
        memory = plan(cfg, architecture, dist.world, gpu_gib, host_gib, trainer)
    except ValueError as e:  # e.g. an architecture the planner does not model
        print0(f"memory plan: not available ({e})", dist)
        return
    print0(memory.verdict() + ("" if memory.fits else " (`psyrl plan --config ...` prints the whole table)"), dist)
    gpus_fit = all(p.fits for p in memory.phases) and (memory.pool is None or memory.pool.sequences >= 1)
    if not gpus_fit and cfg.run.memory_check:  # host RAM rests on a per-rank assumption: a warning only
        raise click.ClickException(f"{memory.verdict()}; set run.memory_check = false to start anyway")


def warn_about_inputs(cfg, dist: Dist, train_records, valid_records) -> None:
    """Console warnings about settings or data that are legal but probably not what was meant."""
    if cfg.fsdp.offload == "always" and not dist.sharded:
        print0("note: fsdp.offload = 'always' applies under torchrun with 2 or more ranks; one process keeps the model "
               "in place", dist)
    shared = {r.id for r in train_records} & {r.id for r in valid_records}
    if shared:
        print0(f"warning: {len(shared)} validation id(s) are also training ids (e.g. {min(shared)}): not held out", dist)


@contextlib.contextmanager
def step_log(run_dir: Path, cfg, dist: Dist, first: int, desc: str):
    """(log, bar): `log(row)` appends a row to metrics.jsonl (rank 0, flushed), `bar` counts the run's steps on
    rank 0; both are closed on any exit."""
    with contextlib.ExitStack() as stack:
        metrics = stack.enter_context(contextlib.closing(MetricsFile(run_dir / "metrics.jsonl"))) \
            if dist.is_main else None
        bar = stack.enter_context(tqdm(total=cfg.run.steps, initial=first - 1, desc=desc, unit="step", file=sys.stdout,
                                       disable=not (cfg.log.progress and dist.is_main)))
        yield (metrics.write if metrics else lambda row: None), bar


def save_step(run_dir: Path, step: int, policy, optimizer, tokenizer, files: dict[str, str], validation, cfg,
              dist: Dist) -> None:
    """`checkpoints/step-N/` with `files`, plus validation.json and validation.jsonl when `validation` is
    (records, metrics, outputs); a failed write is one message."""
    if validation is not None:
        records, metrics, outputs = validation
        files = {**files, "validation.json": json_text({"step": step, **metrics}),
                 "validation.jsonl": validation_lines(records, outputs)}
    try:
        save_checkpoint(run_dir, step, policy, optimizer, tokenizer, files, dist, cfg.checkpoint.keep_state,
                        cfg.checkpoint.export_dtype)
    except CheckpointError as e:
        raise click.ClickException(str(e)) from None


def export_final(policy, tokenizer, run_dir: Path, cfg, dist: Dist, name: str) -> None:
    """The final HF export `runs/<name>/hf/`, in checkpoint.export_dtype."""
    try:
        export_hf(policy, tokenizer, run_dir / "hf", dist, cfg.checkpoint.export_dtype)
    except CheckpointError as e:
        raise click.ClickException(str(e)) from None
    print0(f"{name}: done; final model in {run_dir / 'hf'}", dist)


def read_trainer_state(checkpoint: Path | None, data_path: str, count: int) -> tuple[dict, dict]:
    """(trainer.json of `checkpoint` or {}, the training data's fingerprint). Resuming on other data at the same
    path is refused: the saved data position would point into a different list."""
    fingerprint = {"sha256": hashlib.sha256(Path(data_path).read_bytes()).hexdigest(), "examples": count}
    trainer = json.loads((checkpoint / "trainer.json").read_text(encoding="utf-8")) if checkpoint else {}
    if checkpoint and trainer.get("data") != fingerprint:
        raise click.ClickException(f"--resume: {data_path} is not the data {checkpoint} was trained on "
                                   f"({trainer.get('data')}, now {fingerprint}): its data position is void")
    return trainer, fingerprint


def rewind_metrics(run_dir: Path, step: int, dist: Dist) -> None:
    """On resume, drop metrics rows after the checkpoint's step (they are redone)."""
    if dist.is_main:
        broken = truncate_metrics(run_dir / "metrics.jsonl", step)
        if broken:
            print0(f"warning: dropped {broken} unreadable line(s) of metrics.jsonl (cut short by the crash)", dist)


def build_policy(cfg, tokenizer, dist: Dist) -> Policy:
    """The policy that trains: one process holds the whole model; under torchrun rank 0 reads it and FSDP2 shards
    it, float32 master weights, on the host throughout when fsdp.offload = "always" (FSDP2 CPUOffloadPolicy)."""
    if not dist.sharded:
        return Policy(load_model(cfg.model, tokenizer, seed=cfg.run.seed, device=dist.device))
    build = lambda empty: Policy(load_model(cfg.model, tokenizer, seed=cfg.run.seed, empty=empty))  # noqa: E731
    return load_sharded(build, dist, cfg.model.dtype, cfg.fsdp.offload == "always", cfg.fsdp.reshard_after_forward)


def build_reference(cfg, tokenizer, dist: Dist) -> Policy:
    """pi_ref (eq. 1's KL term): the starting checkpoint, frozen, held in the compute dtype (model.dtype; verl and
    EasyR1 load theirs in bf16), under torchrun sharded with FSDP2 CPU offload when fsdp.ref_offload (A.3)."""
    if not dist.sharded:
        model = load_model(cfg.model, tokenizer, seed=cfg.run.seed, device=dist.device)
        cast_parameters(model, cfg.model.dtype)
        reference = Policy(model)
    else:
        build = lambda empty: Policy(load_model(cfg.model, tokenizer, seed=cfg.run.seed, empty=empty))  # noqa: E731
        reference = load_sharded(build, dist, cfg.model.dtype, cfg.fsdp.ref_offload, cfg.fsdp.reshard_after_forward,
                                 storage_dtype=cfg.model.dtype)
    return reference.eval().requires_grad_(False)


def build_sampler(policy: Policy, cfg, tokenizer, dist: Dist, temperature: float | None = None,
                  longest_prompt: int = 0):
    """The sampler of `sampler.engine`, holding the policy's current weights. `torch`: its own unsharded copy of the
    policy in the compute dtype, filled one tensor at a time from the (possibly sharded) policy. `vllm`: a colocated
    engine started on dummy weights, then given the policy's by a first weight sync, whose log-probs are exact at
    `temperature` (default rollout.temperature; see `psyrl.runtime.vllm_sampler.logprobs_mode`), whose sequences hold the
    longer of rollout.max_prompt_tokens and `longest_prompt` (validation prompts are not filtered) plus
    rollout.max_new_tokens: vLLM's KV cache must hold one such sequence, not the model's 32k positions. Collective
    under torchrun."""
    if cfg.sampler.engine == "vllm":
        architecture = model_config(cfg.model, tokenizer)
        with engine_model_dir(architecture) as model_dir:
            sampler = VLLMSampler(model_dir, tokenizer, dist, dtype=cfg.model.dtype,
                                  max_model_len=max(cfg.rollout.max_prompt_tokens, longest_prompt)
                                  + cfg.rollout.max_new_tokens,
                                  batch=cfg.sampler.max_num_seqs,
                                  tensor_parallel=cfg.sampler.tensor_parallel,
                                  gpu_memory_utilization=cfg.sampler.gpu_memory_utilization, sleep=cfg.sampler.sleep,
                                  temperature=cfg.rollout.temperature if temperature is None else temperature,
                                  enforce_eager=cfg.sampler.enforce_eager,
                                  disable_custom_all_reduce=cfg.sampler.disable_custom_all_reduce,
                                  seed=cfg.run.seed)
        sync_weights(sampler, policy, cfg, dist)
        return sampler
    lm = unsharded_copy(policy, load_model(cfg.model, tokenizer, empty=True), dist, cfg.model.dtype)
    return TorchSampler(lm, tokenizer, dist.device, cfg.sampler.batch)


def sync_weights(sampler, policy: Policy, cfg, dist: Dist) -> None:
    """The weight sync: every parameter of the trainer, cast to model.dtype on the device and all-gathered in buckets
    of sampler.sync_bucket_mib (`psyrl.runtime.distributed.sync_buckets`), streamed into the sampler. Collective."""
    sampler.load_weights(sync_buckets(policy, dist.device, DTYPES[cfg.model.dtype], cfg.sampler.sync_bucket_mib << 20,
                                      prefix="lm."))


def validation_lines(records, outputs) -> str:
    """What the model wrote for each held-out item, one JSON object per line, for people to read."""
    return "".join(json.dumps({"id": r.id, "answer": r.answer, "response": s.text, "tokens": len(s.token_ids),
                               "finish_reason": s.finish_reason}) + "\n" for r, s in zip(records, outputs))
