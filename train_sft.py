"""SFT / knowledge injection (paper §4.1 "Implementation Details", appendix A.4, appendix B).

    python train_sft.py --config configs/sft/tiny.toml [--set table.key=value ...]

Loss on response tokens only (the SFT target of SPEC §6 plus the end-of-turn token), normalised by
the response-token count of the whole optimiser step; AdamW; linear warm-up then cosine; gradient
clipping; a non-finite gradient norm skips the update and is logged. Every `checkpoint.every` steps
the model is validated on held-out items (F1, format, loss) and exported to
`runs/<name>/checkpoints/step-N/hf/`; appendix B starts GRPO from the checkpoint with the median F1
(`psyrl select-checkpoint runs/<name>`). The final export is `runs/<name>/hf/`.
Departures from the paper's stack (LLaMA-Factory + DeepSpeed ZeRO-3): the loss is a token mean over
the whole optimiser step rather than per micro-batch; over-long examples are dropped, not truncated.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import sys
import time
from pathlib import Path

import click
import torch
import transformers
from tqdm import tqdm

from psyrl.checkpoint import export_hf, json_text, save_checkpoint, select_checkpoint, tidy
from psyrl.config import ConfigError, dump_config, load_config
from psyrl.data import Cursor, DataError, load_stimuliqa, next_indices
from psyrl.model import autocast, load_model, load_tokenizer
from psyrl.optim import build_optimizer, clipped_step, lr_factor, set_lr
from psyrl.runlog import MetricsFile, peak_memory_gib, step_line
from psyrl.sft import build_examples, micro_batch_losses, response_tokens
from psyrl.validation import sample_items, validate

LINE_FIELDS = [("loss", "train/loss", ".4f"), ("grad", "train/grad_norm", ".3f"), ("lr", "train/lr", ".2e"),
               ("tok/s", "perf/tokens_per_s", ".0f"), ("peak GiB", "perf/peak_mem_gib", ".2f"),
               ("valid f1", "valid/f1", ".4f"), ("valid loss", "valid/loss", ".4f")]


def say(line: str) -> None:
    """One console line that does not break the progress bar, flushed (logs are read while a run goes)."""
    tqdm.write(line, file=sys.stdout)
    sys.stdout.flush()


def resolve_device(choice: str) -> torch.device:
    if choice == "cuda" and not torch.cuda.is_available():
        raise ConfigError("run.device = 'cuda' but no CUDA device is available")
    return torch.device("cuda" if choice == "cuda" or (choice == "auto" and torch.cuda.is_available()) else "cpu")


def validation_lines(records, outputs) -> str:
    """What the model wrote for each held-out item, one JSON object per line, for people to read."""
    return "".join(json.dumps({"id": r.id, "answer": r.answer, "response": text, "tokens": len(ids)}) + "\n"
                   for r, (ids, text) in zip(records, outputs))


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--config", "config_path", type=click.Path(dir_okay=False), required=True,
              help="TOML run config, e.g. configs/sft/tiny.toml.")
@click.option("--set", "overrides", multiple=True, metavar="TABLE.KEY=VALUE", help="Override one key; repeatable.")
@click.option("--overwrite", is_flag=True, help="Delete an existing runs/<name>/ and start over.")
def main(config_path, overrides, overwrite):
    """Supervised fine-tuning on StimuliQA-format records (SFT target: <think>reasoning</think><answer>…)."""
    transformers.utils.logging.disable_progress_bar()  # no per-save bars inside psyrl's own progress bar
    # ---------------------------------------------------------------- setup: everything checked before any write
    try:
        cfg = load_config(config_path, overrides)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    if (run_dir / "metrics.jsonl").exists() and not overwrite:
        raise click.ClickException(f"{run_dir} already holds a run; pass --overwrite to start over")
    try:
        device = resolve_device(cfg.run.device)
        train_records = load_stimuliqa(cfg.data.train_file)
        valid_records = load_stimuliqa(cfg.data.valid_file) if cfg.data.valid_file else []
        tokenizer = load_tokenizer(cfg.model)
        model = load_model(cfg.model, tokenizer, seed=cfg.run.seed, device=device)
    except (ConfigError, DataError, OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    examples, counts = build_examples(train_records, tokenizer, cfg.prompt, cfg.data.max_length)
    if not examples:
        raise click.ClickException(f"{cfg.data.train_file}: no usable training example ({counts})")
    valid_records = sample_items(valid_records, cfg.data.valid_items, cfg.run.seed)
    shared = {r.id for r in train_records} & {r.id for r in valid_records}
    if shared:
        say(f"warning: {len(shared)} validation id(s) are also training ids (e.g. {min(shared)}): not held out")
    if overwrite and (run_dir / "metrics.jsonl").exists():  # only ever delete what a run wrote
        shutil.rmtree(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    tidy(run_dir)
    resolved = dump_config(cfg)
    (run_dir / "config.resolved.toml").write_text(resolved, encoding="utf-8")

    model.train()
    optimizer = build_optimizer(model, cfg.optim)
    amp = autocast(cfg.model, device)
    steps, batch, micro = cfg.run.steps, cfg.optim.global_batch, cfg.optim.micro_batch
    params = sum(p.numel() for p in model.parameters())
    say(f"sft: {params / 1e6:.2f}M parameters on {device}; {counts['kept']} training examples "
        f"(skipped: {counts['no_reasoning']} without reasoning, {counts['too_long']} over "
        f"{cfg.data.max_length} tokens); {len(valid_records)} validation items; {steps} steps of {batch} "
        f"sequences; run directory {run_dir}")

    with contextlib.ExitStack() as stack:  # the metrics file and the bar close on any exit
        metrics_file = stack.enter_context(contextlib.closing(MetricsFile(run_dir / "metrics.jsonl")))
        bar = stack.enter_context(tqdm(total=steps, desc="sft", unit="step", disable=not cfg.log.progress,
                                       file=sys.stdout))
        cursor, skipped_updates = Cursor(), 0
        if valid_records:  # the untrained model's scores: the baseline every later row is compared with
            metrics, _ = validate(model, tokenizer, valid_records, cfg, device, cfg.log.progress)
            metrics_file.write({"step": 0, "steps": steps, **metrics})
            say(step_line({"step": 0, "steps": steps, **metrics}, LINE_FIELDS))

        for step in range(1, steps + 1):
            # ---------------------------------------------------------------- one optimiser step
            t0 = time.perf_counter()
            lr = cfg.optim.lr * lr_factor(step - 1, cfg.optim, steps)
            set_lr(optimizer, lr)
            indices, cursor = next_indices(cursor, len(examples), batch, cfg.run.seed, cfg.data.shuffle)
            step_examples = [examples[i] for i in indices]
            normalizer = response_tokens(step_examples)  # global: the gradient does not depend on micro-batching
            loss_sum = torch.zeros((), device=device)
            for loss in micro_batch_losses(model, step_examples, micro, tokenizer.pad_token_id, normalizer, device,
                                           amp):
                loss.backward()
                loss_sum += loss.detach()  # read once per step: .item() per micro-batch would sync a GPU each time
            grad_norm, applied = clipped_step(model, optimizer, cfg.optim.grad_clip)
            if not applied:
                skipped_updates += 1
                say(f"step {step}: non-finite gradient norm {grad_norm}; update skipped")
            elapsed = time.perf_counter() - t0

            # ---------------------------------------------------------------- log, validate, checkpoint
            row = {"step": step, "steps": steps, "train/loss": loss_sum.item(), "train/grad_norm": grad_norm,
                   "train/lr": lr, "train/tokens": sum(len(e.input_ids) for e in step_examples),
                   "train/response_tokens": normalizer, "train/skipped_updates": skipped_updates,
                   "data/epoch": cursor.epoch, "perf/step_s": elapsed, "perf/peak_mem_gib": peak_memory_gib(device)}
            row["perf/tokens_per_s"] = row["train/tokens"] / elapsed
            save = cfg.checkpoint.every > 0 and (step % cfg.checkpoint.every == 0 or step == steps)
            if valid_records and (save or step == steps):
                metrics, outputs = validate(model, tokenizer, valid_records, cfg, device, cfg.log.progress)
                row.update(metrics)
            if save:
                files = {"config.resolved.toml": resolved}
                if valid_records:
                    files["validation.json"] = json_text({"step": step, **metrics})
                    files["validation.jsonl"] = validation_lines(valid_records, outputs)
                save_checkpoint(run_dir, step, model, tokenizer, files)
            metrics_file.write(row)
            bar.update(1)
            if step % cfg.log.every == 0 or step == steps:
                say(step_line(row, LINE_FIELDS))

    # ---------------------------------------------------------------- final export
    export_hf(model, tokenizer, run_dir / "hf")
    say(f"sft: done; final model in {run_dir / 'hf'}")
    if valid_records and cfg.checkpoint.every:
        step, score, path = select_checkpoint(run_dir, "median")
        say(f"sft: median-F1 checkpoint (appendix B): step {step}, valid F1 {score:.4f}, {path / 'hf'}")


if __name__ == "__main__":
    main()
