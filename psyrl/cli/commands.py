"""The command lines of the three programs (`train_sft.py`, `train_tgrpo.py`, `evaluate.py`, and
`psyrl train-sft`, `train-tgrpo`, `evaluate`): click and the config layer only. A command imports
its program (torch, transformers) when it runs, so `--help` answers at once."""

from __future__ import annotations

import os
import re
from collections.abc import Callable
from pathlib import Path

import click

from psyrl.cli import compare_command, lengths_command
from psyrl.core.generation_options import GenerationOptions, generation_options, option_problems
from psyrl.eval.benchmarks import EXTRA_BENCHMARKS, HALVES, PAPER_BENCHMARKS
from psyrl.eval.openai_engine import ApiOptions, url_problem

# the checkout's data/benchmarks (psyrl/recipes/ is two folders down)
BENCHMARK_DIR = Path(__file__).resolve().parents[2] / "data" / "benchmarks"


def entry_command(example_config: str, state: str):
    """The click command of an entry script with the options both take: --config, --set,
    --overwrite, --resume (`state`: what a checkpoint restores, for --resume's help)."""
    options = [
        click.option(
            "--config",
            "config_path",
            type=click.Path(dir_okay=False),
            required=True,
            help=f"TOML run config, e.g. {example_config}.",
        ),
        click.option(
            "--set",
            "overrides",
            multiple=True,
            metavar="TABLE.KEY=VALUE",
            help="Override one key; repeatable.",
        ),
        click.option(
            "--overwrite", is_flag=True, help="Delete an existing runs/<name>/ and start over."
        ),
        click.option(
            "--resume",
            is_flag=True,
            help=f"Continue runs/<name>/ from its newest complete "
            f"checkpoint ({state}); the config may differ only in run.name, run.output_dir and "
            "the log, checkpoint and fsdp tables.",
        ),
    ]

    def decorate(main: Callable) -> click.Command:
        for option in reversed(options):  # listed in --help in this order
            main = option(main)
        return click.command(context_settings={"help_option_names": ["-h", "--help"]})(main)

    return decorate


@entry_command("configs/sft/tiny.toml", "model, optimiser, data position, RNG")
def train_sft(config_path, overrides, overwrite, resume):
    """Supervised fine-tuning on StimuliQA-format records (SFT target:
    <think>reasoning</think><answer>…). Run it with python (one process) or under torchrun (FSDP2
    over all ranks)."""
    from psyrl.recipes.sft import train
    from psyrl.run.directory import run_entry

    run_entry(train, config_path, overrides, overwrite, resume)


@entry_command("configs/tgrpo/tiny.toml", "model, optimiser, trajectory cache, data position, RNG")
def train_tgrpo(config_path, overrides, overwrite, resume):
    """T-GRPO on StimuliQA-format records: the trajectory cache and the bilateral reward of "From
    Stimuli to Minds". Starts from model.path (appendix B: the median-F1 SFT checkpoint). Run it
    with python (one process) or under torchrun (FSDP2 over all ranks)."""
    from psyrl.recipes.tgrpo import train
    from psyrl.run.directory import run_entry

    run_entry(train, config_path, overrides, overwrite, resume)


@click.group(
    "evaluate",
    invoke_without_command=True,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@generation_options(
    omit=("samples",),
    model_required=False,
    engines=("openai",),
    notes={
        "model": "A psyrl export (runs/<name>/hf, a checkpoint's hf/) or any Qwen2.5 checkpoint. "
        "Not with --engine openai.",
        "temperature": "The paper's validation: 0.5 (A.3).",
        "seed": "Each item draws with its own seed, derived from this and its id.",
        "batch": "On a CPU, 64 was at most 22% faster than 16 on short prompts and up to 4.8x "
        "slower on the benchmarks' long ones; on a GPU take more.",
        "engine": "The two draw differently: a resume keeps the engine. openai (evaluate only): an "
        "OpenAI-compatible chat-completions server or API, --base-url and --api-model; one "
        "process, no --model (--batch, --dtype, --device, --tokenizer do not apply).",
    },
)
@click.option(
    "--benchmarks",
    multiple=True,
    metavar="NAME|FILE[,...]",
    help=f"Benchmark names ({', '.join(PAPER_BENCHMARKS)}; extra: "
    f"{', '.join(EXTRA_BENCHMARKS)}) or JSONL files in the benchmark or StimuliQA schema; "
    "repeatable or comma-separated. Default: the paper's five.",
)
@click.option(
    "--benchmark-dir",
    type=click.Path(file_okay=False),
    default=str(BENCHMARK_DIR),
    show_default="data/benchmarks of the psyrl checkout",
    help="Where the benchmark names are looked up (<dir>/<name>/*.jsonl).",
)
@click.option(
    "--prompt",
    "mode",
    type=click.Choice(["cot", "direct"]),
    default="cot",
    show_default=True,
    help="Appendix A.1 instruction: think then answer, or answer only.",
)
@click.option(
    "--limit",
    type=int,
    default=0,
    show_default=True,
    help="At most N items per benchmark task (StimuliQA: per subdimension), a seeded choice; "
    "0 = all.",
)
@click.option(
    "--split",
    "half",
    type=click.Choice(HALVES),
    default="all",
    show_default=True,
    help="SPEC §8: `selftrain` or `eval` half of every benchmark (a seeded hash of the item id), "
    "or all.",
)
@click.option(
    "--split-seed", type=int, default=0, show_default=True, help="Seed of the --split hash."
)
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False),
    default=None,
    help="Output directory (predictions.jsonl, results.json, results.md). Default: "
    "runs/eval/<model name>.",
)
@click.option(
    "--overwrite",
    is_flag=True,
    help="Delete --out's earlier evaluate.py files (predictions, results) "
    "instead of resuming them; other files there are left alone.",
)
@click.option(
    "--base-url",
    metavar="URL",
    default=None,
    help="--engine openai: the API root, /chat/completions appended (vllm serve: "
    "http://HOST:PORT/v1; OpenAI: https://api.openai.com/v1).",
)
@click.option(
    "--api-model",
    metavar="NAME",
    default=None,
    help="--engine openai: the `model` of every request (e.g. gpt-4.1-nano).",
)
@click.option(
    "--api-key-env",
    metavar="VAR",
    default="OPENAI_API_KEY",
    show_default=True,
    help="--engine openai: the environment variable holding the API key (unset: no "
    "key, as a local server takes it). Only the variable's name is ever recorded.",
)
@click.option(
    "--concurrency",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="--engine openai: requests in flight at once.",
)
@click.option(
    "--request-timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=600.0,
    show_default=True,
    help="--engine openai: seconds a request waits to connect, and for each read of "
    "its answer, before it is retried.",
)
@click.option(
    "--retries",
    type=click.IntRange(min=0),
    default=6,
    show_default=True,
    help="--engine openai: further attempts after a 429, a 5xx, a malformed answer, a "
    "connection error or a timeout (other 4xx fail at once).",
)
@click.option(
    "--retry-wait",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="--engine openai: the first backoff in seconds, doubled per attempt (at most "
    "60 s), with jitter; a longer Retry-After is honoured.",
)
@click.pass_context
def evaluate(
    click_ctx,
    gen: GenerationOptions,
    benchmarks,
    benchmark_dir,
    mode,
    limit,
    half,
    split_seed,
    out_dir,
    overwrite,
    base_url,
    api_model,
    api_key_env,
    concurrency,
    request_timeout,
    retries,
    retry_wait,
):
    """Evaluate a checkpoint on the OOD benchmarks: F1 (x100) and F1-accuracy (%) per benchmark and
    per task, format rate, E choices and response length (results.md, results.json,
    predictions.jsonl). Sub-commands compare runs and draw the RQ5 length analysis."""
    if click_ctx.invoked_subcommand is not None:
        if gen.model is not None:
            raise click.UsageError("--model evaluates; it does not go with a sub-command")
        return
    api = None
    if gen.engine == "openai":
        api = ApiOptions(
            base_url or "",
            api_model or "",
            api_key_env,
            concurrency,
            request_timeout,
            retries,
            retry_wait,
        )
        api_problems(gen, api)
    elif base_url is not None or api_model is not None:
        raise click.UsageError("--base-url and --api-model go with --engine openai")
    elif gen.model is None:
        raise click.UsageError("--model DIR is required (or a sub-command: compare, lengths)")
    problems = option_problems(gen) + ([] if limit >= 0 else ["--limit must be >= 0"])
    if problems:
        raise click.UsageError("; ".join(problems))
    from psyrl.recipes.evaluate import main

    main(gen, benchmarks, benchmark_dir, mode, limit, half, split_seed, out_dir, overwrite, api)


def api_problems(gen: GenerationOptions, api: ApiOptions) -> None:
    """--engine openai's refusals, before anything is imported or read."""
    if gen.model is not None:
        raise click.UsageError(
            "--model is a local checkpoint; --engine openai evaluates "
            "--api-model NAME at --base-url URL"
        )
    if not api.model:
        raise click.UsageError("--engine openai needs --api-model NAME (the model the API serves)")
    if not api.base_url:
        raise click.UsageError(
            "--engine openai needs --base-url URL (e.g. http://127.0.0.1:8000/v1 for vllm serve)"
        )
    if problem := url_problem(api.base_url):
        raise click.UsageError(problem)
    # a key passed where its variable's name goes would be written to eval.json: never echo it
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", api.key_env):
        raise click.UsageError(
            "--api-key-env takes the NAME of an environment variable (e.g. "
            "OPENAI_API_KEY), not the key itself"
        )
    # one process sends every request (--concurrency in flight): ranks would only repeat them
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise click.UsageError(
            f"--engine openai runs in one process (WORLD_SIZE={os.environ['WORLD_SIZE']}): run it "
            "with python, not torchrun; --concurrency sets the requests in flight"
        )


evaluate.add_command(compare_command, "compare")
evaluate.add_command(lengths_command, "lengths")
