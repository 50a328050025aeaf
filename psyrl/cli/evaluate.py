"""`evaluate.py` / `psyrl evaluate` (a checkpoint or an API model on the OOD benchmarks) with its
sub-commands `compare` (Tables 2 and 3) and `lengths` (RQ5 / Figure 6), and `psyrl self-label`
(continual self-training's labels). The evaluation itself is `psyrl.recipes.evaluate`."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import click

from psyrl.cli.errors import fail, reported
from psyrl.cli.options import generation_options
from psyrl.core.generation_options import GenerationOptions, option_problems
from psyrl.core.presets import benchmarks_dir
from psyrl.eval.benchmarks import EXTRA_BENCHMARKS, HALVES, PAPER_BENCHMARKS


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
    default=str(benchmarks_dir()),
    show_default="the benchmarks shipped with psyrl",
    help="Where the benchmark names are looked up (<dir>/<name>/*.jsonl); `psyrl data benchmarks "
    "--out DIR` copies the shipped ones out to read or edit.",
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
@click.option(
    "--accuracy",
    "accuracy",
    multiple=True,
    type=click.Choice(["semantic", "judge"]),
    help="Beside the paper's metrics (issue 41): an accuracy signal of the extracted answer "
    "against the gold answer, each row's accuracy/NAME and a column after the paper's (mean "
    "x100); repeatable. semantic: all-MiniLM-L6-v2 cosine (pip install 'psyrl[semantic]'); judge: "
    "the LLM judge of --signal-config's [judge] table (scores cached in --out/judge_cache).",
)
@click.option(
    "--choose-by",
    type=click.Choice(["f1", "similarity"]),
    default="f1",
    show_default=True,
    help="A multiple-choice answer's option: f1, the option of highest token F1 (SPEC §7, the "
    "paper), or similarity, the option of highest semantic similarity; a tie is E either way. "
    "Recorded in eval.json and results.json; `compare` refuses to mix the two.",
)
@click.option(
    "--signal-config",
    metavar="FILE",
    default=None,
    help="A psyrl config (file or preset) whose [semantic] and [judge] tables configure "
    "--accuracy and --choose-by similarity; its other tables are ignored. Default: the defaults "
    "(the judge has no default endpoint).",
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
    accuracy,
    choose_by,
    signal_config,
):
    """Evaluate a checkpoint on the OOD benchmarks: F1 (x100) and F1-accuracy (%) per benchmark and
    per task, format rate, E choices and response length (results.md, results.json,
    predictions.jsonl); optionally accuracy signals beside them (--accuracy) and options chosen by
    similarity (--choose-by). Sub-commands compare runs and draw the RQ5 length analysis."""
    if click_ctx.invoked_subcommand is not None:
        if gen.model is not None:
            raise click.UsageError("--model evaluates; it does not go with a sub-command")
        return
    api = None
    if gen.engine == "openai":
        from psyrl.eval.openai_engine import ApiOptions  # http.client and ssl: not for --help

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
    from psyrl.recipes.evaluate import Selection, main
    from psyrl.signals.evaluation import Scoring

    chosen = Selection(benchmarks, benchmark_dir, mode, limit, half, split_seed, out_dir, overwrite)
    scoring = Scoring(tuple(dict.fromkeys(accuracy)), choose_by, signal_config)
    with reported("evaluate", also=(OSError, ValueError)):
        main(gen, chosen, api, scoring)


def api_problems(gen: GenerationOptions, api) -> None:
    """--engine openai's refusals (`api`: its ApiOptions), before anything is read."""
    from psyrl.eval.openai_engine import url_problem

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


labels_option = click.option(
    "--label",
    "labels",
    multiple=True,
    help="A label per run, in order (default: the folder names).",
)


def run_labels(labels, run_dirs) -> list[str]:
    """One --label per run, in order, or the folder names."""
    if labels and len(labels) != len(run_dirs):
        raise click.UsageError(f"{len(labels)} --label for {len(run_dirs)} runs")
    return list(labels) or [Path(d).name for d in run_dirs]


@evaluate.command("compare")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True))
@labels_option
def compare_command(run_dirs, labels):
    """Compare evaluate.py runs (their --out directories): Table 3's layout (F1 and accuracy per
    benchmark) and Table 2's (F1 per StimuliQA subdimension), one row per run, deltas against the
    first."""
    from psyrl.eval.report import compare_markdown, load_results

    with reported("psyrl evaluate compare", also=(ValueError,)):
        results = [load_results(d) for d in run_dirs]
        click.echo(compare_markdown(run_labels(labels, run_dirs), results))


@evaluate.command("lengths")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@labels_option
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="PNG to write (default: RUN_DIR/lengths.png for one run, lengths.png here for several).",
)
@click.option(
    "--by",
    type=click.Choice(("index", "benchmark")),
    default="index",
    show_default=True,
    help="index: ToMbench's Unexpected Outcome Test by question index (Figure 6); benchmark: by "
    "file evaluated (the testbed's levels, test-k1/2/3.jsonl).",
)
def lengths_command(run_dirs, labels, out, by):
    """RQ5 / Figure 6: response lengths by question index (1-3) on ToMbench's Unexpected Outcome
    Test (or, with --by benchmark, by file evaluated), non-zero-F1 samples only, one box per group
    and run (e.g. a base and a bilateral run side by side); the counts of valid samples, and how far
    the last group's median length lies from the first's, with a bootstrap interval (printed, and
    written beside the figure as OUT with .md). Needs evaluate.py runs (with tombench for --by
    index), and matplotlib."""
    from psyrl.eval.benchmarks import read_predictions
    from psyrl.eval.lengths import (
        counts_markdown,
        lengths_by_benchmark,
        lengths_by_index,
        plot_lengths,
    )

    group = lengths_by_index if by == "index" else lengths_by_benchmark
    labels = run_labels(labels, run_dirs)
    out = out or (Path(run_dirs[0]) / "lengths.png" if len(run_dirs) == 1 else Path("lengths.png"))
    with reported("psyrl evaluate lengths", also=(ValueError,)):
        groups = [group(read_predictions(Path(d) / "predictions.jsonl")[0]) for d in run_dirs]
        if any(list(g[0]) != list(groups[0][0]) for g in groups):
            raise ValueError(
                "the runs evaluated different benchmarks: "
                + "; ".join(f"{d}: {', '.join(g[0])}" for d, g in zip(run_dirs, groups))
            )
        table = counts_markdown(labels, groups)
        click.echo(table)
        figure = plot_lengths(labels, groups, out)
        figure.with_suffix(".md").write_text(table + "\n", encoding="utf-8")
        click.echo(f"wrote {figure} and {figure.with_suffix('.md')}")


@click.command("self-label")
@click.argument("eval_dir", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    required=True,
    help="The SFT data set to write (StimuliQA JSONL: data.train_file of train_sft.py).",
)
@click.option(
    "--tau",
    type=float,
    default=0.4,
    show_default=True,
    help="Keep a prediction iff confidence > tau (the paper: 0.4 on the F1 confidence).",
)
@click.option(
    "--confidence",
    type=click.Choice(["f1", "logprob"]),
    default="f1",
    show_default=True,
    help="f1: F1 of the extracted answer to its best-matching option (the paper); logprob: "
    "exp(mean token log-probability) of the response under the sampler.",
)
@click.option(
    "--seed", type=int, default=0, show_default=True, help="Seed of the random option on an E tie."
)
@click.option(
    "--any-split",
    is_flag=True,
    help="Also label predictions of the eval half or of whole benchmarks "
    "(the paper's transductive setting: it then reports on the items it trained on).",
)
@click.option(
    "--include-tombench",
    is_flag=True,
    help="Also label ToMbench items (its licence says: evaluation "
    "only; left out and counted by default).",
)
@click.option(
    "--benchmark",
    "benchmarks",
    multiple=True,
    metavar="NAME",
    help="Label only the predictions of this benchmark (repeatable): one SFT set per benchmark, "
    "for the paper's dataset-specific models (appendix B).",
)
def self_label_command(
    eval_dir, out, tau, confidence, seed, any_split, include_tombench, benchmarks
):
    """Continual self-training (SPEC §8): from an evaluate.py run on the self-train half (--split
    selftrain), keep each format-valid prediction whose confidence exceeds tau, relabel it with its
    best-matching option (gold answers are never read) and write an SFT set that train_sft.py takes
    as it is."""
    from psyrl.core.records import write_jsonl
    from psyrl.eval.benchmarks import read_predictions, resolve_sources
    from psyrl.eval.self_label import self_label

    try:
        settings_path = Path(eval_dir) / "eval.json"
        if not settings_path.is_file():
            raise ValueError(
                f"{settings_path}: missing (is {eval_dir} an evaluate.py --out directory?)"
            )
        settings = json.loads(settings_path.read_text(encoding="utf-8"))
        if not (Path(eval_dir) / "results.json").is_file():
            raise ValueError(
                f"{eval_dir} has no results.json: the evaluation did not finish (run it again to "
                "resume it)"
            )
        if settings["split"] != "selftrain" and not any_split:
            raise ValueError(
                f"{eval_dir} evaluated the {settings['split']!r} split: self-labelling it trains "
                "on items that are reported. Evaluate with --split selftrain (or pass --any-split)"
            )
        sources = resolve_sources([s["path"] for s in settings["sources"]], ".")
        if any(s.schema != "benchmark" for s in sources):
            raise ValueError("self-labelling needs multiple-choice (benchmark-schema) predictions")
        records = {r.id: r for s in sources for r in s.records}
        rows, _ = read_predictions(Path(eval_dir) / "predictions.jsonl")
        if benchmarks:
            missing = sorted(set(benchmarks) - {r["benchmark"] for r in rows})
            if missing:
                raise ValueError(f"{eval_dir} has no prediction of {', '.join(missing)}")
            rows = [r for r in rows if r["benchmark"] in benchmarks]
        kept, counts = self_label(
            rows,
            records,
            tau,
            confidence,
            seed,
            settings["prompt"],
            settings["options"],
            include_tombench,
        )
        if not kept:
            raise ValueError(f"no prediction kept at tau = {tau} ({counts}); no data set written")
        write_jsonl(out, kept)
    except (OSError, ValueError, KeyError) as e:
        fail(e, "psyrl self-label")
    click.echo(
        f"self-label: kept {counts['kept']} of {counts['predictions']} predictions (ToMbench, "
        f"evaluation only: {counts['evaluation_only']}; no context {counts['no_context']}; "
        f"format-invalid {counts['format_invalid']}; confidence <= {tau} "
        f"{counts['low_confidence']}; no matching option {counts['no_matching_option']}); wrote "
        f"{out}"
        + (
            ""
            if settings["prompt"] == "cot"
            else ' (direct prompt: no reasoning; SFT it with prompt.mode = "direct")'
        )
    )
