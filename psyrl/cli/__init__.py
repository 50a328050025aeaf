"""The `psyrl` command group (SPEC §9): the three programs (train-sft, train-tgrpo, evaluate) and
the tools around them.

This module imports click and the config layer only, and each command imports what it runs when it
runs: `psyrl --help` and `psyrl CMD --help` answer in well under a second (bench/cli_startup.py),
where torch alone takes about two.
"""

from __future__ import annotations

import importlib
import re
import sys
import textwrap
from pathlib import Path

import click

from psyrl.core.config import ConfigError, config_reference, dump_config, load_config
from psyrl.core.records import DataError, load_records

README_START, README_END = "<!-- config-reference:start -->", "<!-- config-reference:end -->"


class LazyGroup(click.Group):
    """A click group whose commands in `lazy` (name: ("module:attribute", short help)) are imported
    when one runs or shows its --help; the group's own --help lists their short help from the table
    (tests/test_cli.py checks it against each command's docstring)."""

    def __init__(self, *args, lazy: dict[str, tuple[str, str]], **kwargs):
        super().__init__(*args, **kwargs)
        self.lazy = lazy

    def list_commands(self, ctx):
        return sorted([*super().list_commands(ctx), *self.lazy])

    def get_command(self, ctx, name):
        if name not in self.lazy:
            return super().get_command(ctx, name)
        module, _, attribute = self.lazy[name][0].partition(":")
        return getattr(importlib.import_module(module), attribute)

    def format_commands(self, ctx, formatter):
        # click's own would import every command for its short help
        names = [
            name
            for name in self.list_commands(ctx)
            if name in self.lazy or not self.commands[name].hidden
        ]
        limit = formatter.width - 6 - max(map(len, names))
        rows = [(name, self.listed_help(name, limit)) for name in names]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def listed_help(self, name: str, limit: int) -> str:
        if name not in self.lazy:
            return self.commands[name].get_short_help_str(limit)
        text = self.lazy[name][1]
        return text if len(text) <= limit else textwrap.shorten(text, limit, placeholder="...")


COMMANDS = {
    "train-sft": (
        "psyrl.cli.commands:train_sft",
        "Supervised fine-tuning on StimuliQA-format records (SFT target: "
        "<think>reasoning</think><answer>…).",
    ),
    "train-tgrpo": (
        "psyrl.cli.commands:train_tgrpo",
        "T-GRPO on StimuliQA-format records: the trajectory cache and the bilateral "
        'reward of "From Stimuli to Minds".',
    ),
    "evaluate": (
        "psyrl.cli.commands:evaluate",
        "Evaluate a checkpoint on the OOD benchmarks: F1 (x100) and F1-accuracy (%) per "
        "benchmark and per task, format rate, E choices and response length "
        "(results.md, results.json, predictions.jsonl).",
    ),
    "build": (
        "psyrl.cli.build:build_group",
        "Build StimuliQA-format data with the paper's prompts (appendix A.1) and quality "
        "control (appendix B), from any local model directory: QA pairs from labelled "
        "stimuli (qa), topic expansion (topics), LlamaQA-style comparison sets "
        "(comparison), reasoning samples for SFT (reasoning).",
    ),
    "experiment": (
        "psyrl.experiment.runner:experiment_command",
        "Run an experiment file (experiments/*.toml): its runs in dependency order, "
        "finished ones skipped, interrupted ones resumed; then its tables with 95 % "
        "bootstrap intervals over seeds and items, in experiments/<name>/results.md and "
        "results.json.",
    ),
    "demo-data": (
        "psyrl.dataset.demo_data:demo_data_command",
        "Write the SYNTHETIC StimuliQA-format demo set (for the CPU demo and tests; NOT "
        "the paper's data).",
    ),
}
DATA_COMMANDS = {
    "convert": (
        "psyrl.dataset.convert:convert_command",
        "Convert SOURCE into psyrl's StimuliQA or benchmark JSONL, every row validated.",
    ),
}


@click.group(cls=LazyGroup, lazy=COMMANDS, context_settings={"help_option_names": ["-h", "--help"]})
def main():
    """psyrl: T-GRPO with the bilateral reward ("From Stimuli to Minds"), in pure PyTorch."""


@main.group()
def config():
    """Check, print and document run configurations."""


@config.command("show")
@click.option(
    "--config",
    "path",
    type=click.Path(dir_okay=False),
    default=None,
    help="TOML config file (default: all defaults).",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="TABLE.KEY=VALUE",
    help="Override one key; repeatable.",
)
def show(path, overrides):
    """Validate a config and print it resolved (defaults and overrides applied), as TOML."""
    try:
        click.echo(dump_config(load_config(path, overrides)), nl=False)
    except ConfigError as e:
        raise click.ClickException(str(e)) from None


@config.command("reference")
@click.option(
    "--write-readme",
    type=click.Path(exists=True, dir_okay=False),
    default=None,
    help=f"Replace the text between {README_START} and {README_END} in this file instead of "
    "printing.",
)
def reference(write_readme):
    """Print the Markdown reference of every config table and key (generated from the code)."""
    text = config_reference()
    if write_readme is None:
        click.echo(text)
        return
    path = Path(write_readme)
    readme = path.read_text(encoding="utf-8")
    pattern = re.compile(re.escape(README_START) + ".*?" + re.escape(README_END), re.DOTALL)
    if not pattern.search(readme):
        raise click.ClickException(f"{path}: markers {README_START} ... {README_END} not found")
    path.write_text(
        pattern.sub(lambda _: f"{README_START}\n{text}\n{README_END}", readme), encoding="utf-8"
    )
    click.echo(f"wrote the config reference into {path}", err=True)


@main.group(cls=LazyGroup, lazy=DATA_COMMANDS)
def data():
    """Validate data files (StimuliQA records, benchmark items) and convert other formats."""


@data.command("check")
@click.argument("paths", nargs=-1, required=True, type=click.Path(dir_okay=False))
def data_check(paths):
    """Validate JSONL files line by line (schema from the first record); print the record count of
    each."""
    failed = False
    for path in paths:
        try:
            records = load_records(path)
        except DataError as e:
            click.echo(str(e), err=True)
            failed = True
            continue
        click.echo(f"{path}: {len(records)} {type(records[0]).__name__} records, all valid")
    if failed:
        raise SystemExit(1)


@main.command("select-checkpoint")
@click.argument("run_dir", type=click.Path(exists=True, file_okay=False))
@click.option(
    "--rule",
    type=click.Choice(["median", "best", "last"]),
    default="median",
    show_default=True,
    help="median = appendix B's choice for the GRPO start: the checkpoint with the median valid "
    "F1.",
)
def select_checkpoint_command(run_dir, rule):
    """Print the HF directory of the chosen SFT checkpoint (by validation F1) of a train_sft.py
    run."""
    from psyrl.runtime.checkpoint import select_checkpoint

    try:
        step, score, path = select_checkpoint(run_dir, rule)
    except FileNotFoundError as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"step {step}: valid F1 {score:.4f}", err=True)
    click.echo(path / "hf")


@main.command("tiny-tokenizer")
@click.option(
    "--demo-dir",
    default="data/demo",
    show_default=True,
    type=click.Path(file_okay=False),
    help="Demo set whose texts train the BPE.",
)
@click.option(
    "--out",
    default=None,
    type=click.Path(file_okay=False),
    help="Output directory (default: the copy shipped in psyrl/assets/tokenizers/tiny).",
)
def tiny_tokenizer_command(demo_dir, out):
    """Rebuild psyrl's small tokenizer: Qwen2.5's special tokens and chat template, a few thousand
    BPE tokens trained on data/demo/train.jsonl."""
    from psyrl.runtime.tiny_tokenizer import build_shipped  # trains a BPE: only when asked

    click.echo(f"wrote {build_shipped(demo_dir, out)}")


@main.command("plot")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="PNG to write (default: RUN_DIR/curves.png for one run, curves.png here for several).",
)
@click.option(
    "--smooth",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Trailing mean over this many steps for the per-step curves (1 = raw only).",
)
def plot_command(run_dirs, out, smooth):
    """Training curves of one or several runs overlaid, as one PNG: reward components, held-out F1,
    response length and KL over steps (the paper's Fig. 5 compares the base and bilateral rewards
    this way). Needs matplotlib: pip install -e '.[plot]'."""
    try:
        from psyrl.report.plot import plot_runs

        out = out or (
            Path(run_dirs[0]) / "curves.png" if len(run_dirs) == 1 else Path("curves.png")
        )
        panels = plot_runs(run_dirs, out, smooth)
    except ModuleNotFoundError as e:
        if e.name != "matplotlib":
            raise
        raise click.ClickException(
            "psyrl plot needs matplotlib: pip install -e '.[plot]'"
        ) from None
    except (OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"wrote {out} ({len(panels)} panels: {', '.join(panels)})")


@main.command("summary")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--window",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Steps averaged at the start and at the end of the per-step metrics.",
)
def summary_command(run_dirs, window):
    """A Markdown table comparing the start and the end of T-GRPO runs: held-out F1 and final reward
    at the first and the last validation, and the mean training reward, F1 and response length over
    the first and the last WINDOW steps."""
    from psyrl.report.summary import summary_table

    try:
        click.echo(summary_table(run_dirs, window))
    except (OSError, ValueError) as e:
        raise click.ClickException(str(e)) from None


@main.command("report")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="HTML file to write (default: RUN_DIR/report.html for one run, report.html here for "
    "several).",
)
@click.option(
    "--smooth",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Trailing mean over this many steps for the per-step curves (1 = raw only).",
)
@click.option(
    "--window",
    type=click.IntRange(min=1),
    default=5,
    show_default=True,
    help="Steps averaged at the start and at the end in the summary table.",
)
@click.option(
    "--sample-steps",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Embed at most this many sample steps per run, evenly spaced, first and last included "
    "(0 = all): bounds the file size of a long run.",
)
def report_command(run_dirs, out, smooth, window, sample_steps):
    """One self-contained HTML page (no network: open it anywhere) on one or several train_sft.py /
    train_tgrpo.py runs: each resolved config, the start -> end table of `psyrl summary`, the curves
    of `psyrl plot` overlaid, held-out scores per checkpoint, the tables of every evaluate.py output
    inside the run directory (RUN_DIR/*/results.json), and a browser over the T-GRPO rollout samples
    (samples/step-N.jsonl) with their stories and gold answers, filtered by step, reward, F1,
    format, finish reason and text. The filters can be given in the URL, e.g.
    report.html#step=20&min_reward=0.5&finish=length&q=angry."""
    from psyrl.report.html_report import write_report  # reads runs: torch's checkpoints module

    out = out or (Path(run_dirs[0]) / "report.html" if len(run_dirs) == 1 else Path("report.html"))
    try:
        path = write_report(run_dirs, out, smooth, window, sample_steps)
    except (OSError, ValueError) as e:  # DataError is a ValueError
        raise click.ClickException(str(e)) from None
    size = path.stat().st_size / 2**20
    click.echo(f"wrote {path} ({size:.1f} MiB)")


@main.command("plan")
@click.option(
    "--config",
    "path",
    type=click.Path(dir_okay=False),
    required=True,
    help="TOML run config, e.g. configs/tgrpo/qwen2.5-3b.toml.",
)
@click.option(
    "--set",
    "overrides",
    multiple=True,
    metavar="TABLE.KEY=VALUE",
    help="Override one key; repeatable.",
)
@click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=4,
    show_default=True,
    help="GPUs of the run (torchrun ranks), all on one node.",
)
@click.option(
    "--gpu-memory-gib",
    type=click.FloatRange(min=0, min_open=True),
    default=48.0,
    show_default=True,
    help="Memory of one GPU in GiB (48: RTX A6000).",
)
@click.option(
    "--host-memory-gib",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    help="Host RAM of the node in GiB; without it the need is printed but not judged.",
)
@click.option(
    "--trainer",
    type=click.Choice(["auto", "tgrpo", "sft"]),
    default="auto",
    show_default=True,
    help="Which entry script runs the config: auto = sft when the config's path has a folder named "
    "`sft` (configs/sft/...), else tgrpo. SFT has no rollout, experience or weight sync.",
)
def plan_command(path, overrides, gpus, gpu_memory_gib, host_memory_gib, trainer):
    """The memory a run needs, before it starts: one table of GiB per GPU by part (FSDP2 shards,
    AdamW, gathered layers, gradient buffers, activations, log-probs, reference, sampler, transfers,
    CUDA context) for each phase of a step (rollout, experience log-probs, update, weight sync,
    validation, checkpoint), whether it fits, host RAM per node, and for a phase that does not fit
    the setting that makes it fit (planned again with it, not guessed). Also the suggested
    sampler.gpu_memory_utilization and what fsdp.defer_grad_sync costs.

    The architecture comes from model.path's config.json, else psyrl's copy for a path naming
    Qwen2.5-0.5B/1.5B/3B-Instruct, else (empty path) the tiny model of [model]. Every sequence is
    taken at its maximum length. Exit status: 0 when everything fits, 3 when something does not, 1
    on an error."""
    from psyrl.plan.memory import format_plan, load_architecture, plan

    if trainer == "auto":
        trainer = "sft" if "sft" in Path(path).parts else "tgrpo"
    try:
        cfg = load_config(path, overrides)
        architecture, source = load_architecture(cfg.model)
        result = plan(cfg, architecture, gpus, gpu_memory_gib, host_memory_gib, trainer=trainer)
    except (ConfigError, ValueError, OSError) as e:
        raise click.ClickException(str(e)) from None
    click.echo(f"psyrl plan: {path} ({trainer}); architecture from {source}")
    click.echo(format_plan(result))
    if not result.fits:
        sys.exit(3)


def run_labels(labels, run_dirs) -> list[str]:
    """One --label per run, in order, or the folder names."""
    if labels and len(labels) != len(run_dirs):
        raise click.UsageError(f"{len(labels)} --label for {len(run_dirs)} runs")
    return list(labels) or [Path(d).name for d in run_dirs]


@main.command("compare")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True))
@click.option(
    "--label",
    "labels",
    multiple=True,
    help="A row label per run, in order (default: the folder names).",
)
def compare_command(run_dirs, labels):
    """Compare evaluate.py runs (their --out directories): Table 3's layout (F1 and accuracy per
    benchmark) and Table 2's (F1 per StimuliQA subdimension), one row per run, deltas against the
    first."""
    from psyrl.eval.report import compare_markdown, load_results

    try:
        results = [load_results(d) for d in run_dirs]
        click.echo(compare_markdown(run_labels(labels, run_dirs), results))
    except ValueError as e:
        raise click.ClickException(str(e)) from None


@main.command("lengths")
@click.argument("run_dirs", nargs=-1, required=True, type=click.Path(exists=True, file_okay=False))
@click.option(
    "--label",
    "labels",
    multiple=True,
    help="A label per run, in order (default: the folder names).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    default=None,
    help="PNG to write (default: RUN_DIR/lengths.png for one run, lengths.png here for several).",
)
def lengths_command(run_dirs, labels, out):
    """RQ5 / Figure 6: response lengths by question index (1-3) on ToMbench's Unexpected Outcome
    Test, non-zero-F1 samples only, one box per index and run (e.g. a base and a bilateral run side
    by side), and the counts of valid samples. Needs evaluate.py runs that include tombench, and
    matplotlib."""
    from psyrl.eval.benchmarks import read_predictions
    from psyrl.eval.lengths import counts_markdown, lengths_by_index, plot_lengths

    labels = run_labels(labels, run_dirs)
    try:
        groups = [
            lengths_by_index(read_predictions(Path(d) / "predictions.jsonl")[0]) for d in run_dirs
        ]
        out = out or (
            Path(run_dirs[0]) / "lengths.png" if len(run_dirs) == 1 else Path("lengths.png")
        )
        click.echo(counts_markdown(labels, groups))
        click.echo(f"wrote {plot_lengths(labels, groups, out)}")
    except ValueError as e:
        raise click.ClickException(str(e)) from None


@main.command("self-label")
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
def self_label_command(eval_dir, out, tau, confidence, seed, any_split, include_tombench):
    """Continual self-training (SPEC §8): from an evaluate.py run on the self-train half (--split
    selftrain), keep each format-valid prediction whose confidence exceeds tau, relabel it with its
    best-matching option (gold answers are never read) and write an SFT set that train_sft.py takes
    as it is."""
    import json

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
        raise click.ClickException(str(e)) from None
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


if __name__ == "__main__":
    sys.exit(main())
