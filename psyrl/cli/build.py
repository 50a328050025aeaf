"""`psyrl build`: the StimuliQA builder's command line (the pipeline: psyrl.dataset.builder,
psyrl.dataset.topics, psyrl.dataset.reasoning, psyrl.dataset.run).

    psyrl build qa --catalogue C --table T --model DIR --out DIR     (one process, torch sampler)
    torchrun --nproc_per_node 4 -m psyrl build qa ... --engine vllm --tensor-parallel 4  (GPU node)
"""

from __future__ import annotations

import functools
from pathlib import Path

import click

from psyrl.cli.errors import reported
from psyrl.cli.options import generation_options
from psyrl.core.generation_options import GenerationOptions, option_problems
from psyrl.dataset.prompts import DIALOGUES, PAPER_REASONING, PAPER_TOPICS, SHORT_WORDS
from psyrl.dataset.quality_control import NEAR_DUPLICATE

# The builder and the model code (torch, transformers) are imported when a command runs, not at
# import: `psyrl build ... --help` stays instant.


@click.group("build", context_settings={"help_option_names": ["-h", "--help"]})
def build_group():
    """Build StimuliQA-format data with the paper's prompts (appendix A.1) and quality control
    (appendix B), from any local model directory: QA pairs from labelled stimuli (qa), topic
    expansion (topics), LlamaQA-style comparison sets (comparison), reasoning samples for SFT
    (reasoning). Each command writes into its --out: generations.jsonl (resumable: run the same
    command again after an interruption), its results, dropped.jsonl, report.md and report.json."""


def build_options(samples: int = 1, max_new_tokens: int = 512):
    """The options every build command shares, --out and the generation options (the builder's
    sampling defaults), around `run_build`."""

    def decorate(body):
        command = run_build(body)
        command = generation_options(
            temperature=0.7,
            top_p=0.95,
            max_new_tokens=max_new_tokens,
            samples=samples,
            notes={
                "model": "The generator: e.g. an Instruct model.",
                "seed": "Each prompt draws with its own, from this and its key.",
            },
        )(command)
        overwrite = click.option(
            "--overwrite",
            is_flag=True,
            help="Delete --out's earlier build files (generations included) "
            "instead of resuming; other files there are left alone.",
        )
        out = click.option(
            "--out",
            "out_dir",
            required=True,
            type=click.Path(file_okay=False),
            help="Output directory; a second run with the same settings resumes it.",
        )
        return out(overwrite(command))

    return decorate


def run_build(body):
    """Wrap a build command: check the generation options, then `psyrl.dataset.run.build` (join
    torchrun, run `body` on a BuildRun, print the report); errors as one message from rank 0."""

    @functools.wraps(body)
    def command(gen: GenerationOptions, out_dir, overwrite, **kwargs):
        problems = option_problems(gen)
        if problems:
            raise click.UsageError("; ".join(problems))
        from psyrl.dataset.run import build

        with reported("psyrl build", also=(OSError, ValueError)):
            report = build(body, gen, Path(out_dir), overwrite, kwargs)
        if report is not None:
            click.echo(report)

    return command


def catalogue_option(help_text: str):
    """--catalogue, the variable catalogue every command but `reasoning` reads."""
    return click.option(
        "--catalogue",
        "catalogue_path",
        required=True,
        type=click.Path(dir_okay=False),
        help=help_text,
    )


def qc_and_split_options(command):
    for option in reversed(
        [
            click.option(
                "--near-duplicate",
                type=click.FloatRange(0, 1, min_open=True),
                default=NEAR_DUPLICATE,
                show_default=True,
                help="Content-word Jaccard similarity from which a pair duplicates an "
                "earlier one of its group (psyrl.dataset.quality_control).",
            ),
            click.option(
                "--train",
                "n_train",
                type=click.IntRange(min=0),
                default=200,
                show_default=True,
                help="Training pairs per variable (paper §4.1).",
            ),
            click.option(
                "--test",
                "n_test",
                type=click.IntRange(min=0),
                default=100,
                show_default=True,
                help="Test pairs per variable (paper §4.1).",
            ),
            click.option(
                "--min-count",
                type=click.IntRange(min=0),
                default=None,
                help="Variables with fewer kept pairs are excluded and listed (default: --train + "
                "--test).",
            ),
            click.option(
                "--split-seed", type=int, default=0, show_default=True, help="Seed of the split."
            ),
        ]
    ):
        command = option(command)
    return command


@build_group.command("qa")
@catalogue_option("Variable catalogue, TOML or JSON (see data/build/catalogue.toml).")
@click.option(
    "--table",
    "table_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="Labelled stimuli, CSV or JSONL: an id, the text, one column per variable.",
)
@click.option(
    "--id-column", default=None, help="The table's id column (default: `id`, in any case)."
)
@click.option(
    "--text-column",
    default=None,
    help="The table's stimulus column (default: the first of stimuli, "
    "stimulus, text, story, in any case).",
)
@click.option(
    "--ignore-column",
    "ignore_columns",
    multiple=True,
    help="A table column that is not a variable; repeatable.",
)
@qc_and_split_options
@build_options()
def qa_command(run, **kwargs):
    """QA pairs from expert-labelled stimuli: the dataset-generation prompt for every (stimulus,
    coded variable), quality control, then the §4.1 split into train.jsonl and test.jsonl (StimuliQA
    records that train_sft.py, train_tgrpo.py and evaluate.py take)."""
    from psyrl.dataset.builder import build_qa

    build_qa(run, **kwargs)


@build_group.command("comparison")
@catalogue_option("Variable catalogue, TOML or JSON.")
@click.option(
    "--topics",
    "topics_path",
    default=None,
    type=click.Path(dir_okay=False),
    help="topics.jsonl of `psyrl build topics` (default: the catalogue's seed topics).",
)
@click.option(
    "--dialogue",
    type=click.Choice(DIALOGUES),
    default="one-turn",
    show_default=True,
    help="one-turn: the dataset prompt and the comparison prompt in one user turn. "
    'two-turn (appendix B\'s "multi-turn dialogue generation"): the dataset prompt, '
    "the generator's own reply to it (generated first, one per topic), then the "
    "comparison prompt as the second user turn.",
)
@qc_and_split_options
@build_options()
def comparison_command(run, **kwargs):
    """A comparison set in the manner of the paper's LlamaQA and MistralQA: for every (variable,
    topic) the generator writes a stimulus and its QA pair (comparison prompt, in one turn or as the
    second turn of a dialogue: --dialogue), then quality control and the §4.1 split."""
    from psyrl.dataset.builder import build_comparison

    build_comparison(run, **kwargs)


@build_group.command("topics")
@catalogue_option("Variable catalogue, TOML or JSON, with `topics = [...]` seeds.")
@click.option(
    "--max-topics",
    type=click.IntRange(min=1),
    default=PAPER_TOPICS,
    show_default=True,
    help="Topics per variable, seeds included (appendix B: up to 200).",
)
@build_options(samples=4, max_new_tokens=1024)
def topics_command(run, **kwargs):
    """Expand each variable's seed topics with the topic-generation prompt: --samples generations
    per variable, duplicates dropped, at most --max-topics kept (topics.jsonl, the input of `psyrl
    build comparison`)."""
    from psyrl.dataset.topics import build_topics

    build_topics(run, **kwargs)


@build_group.command("reasoning")
@click.option(
    "--data",
    "data_path",
    required=True,
    type=click.Path(dir_okay=False),
    help="A StimuliQA JSONL file (e.g. the train.jsonl of `psyrl build qa`).",
)
@click.option(
    "--short",
    "n_short",
    type=click.IntRange(min=0),
    default=PAPER_REASONING,
    show_default=True,
    help="Short rationales to keep (appendix B: 500).",
)
@click.option(
    "--long",
    "n_long",
    type=click.IntRange(min=0),
    default=PAPER_REASONING,
    show_default=True,
    help="Long rationales to keep (appendix B: 500).",
)
@click.option(
    "--short-words",
    type=click.IntRange(min=1),
    default=SHORT_WORDS,
    show_default=True,
    help="A rationale of at most this many words is short.",
)
@build_options()
def reasoning_command(run, **kwargs):
    """Reasoning samples for knowledge injection (appendix B): the reasoning-CoT prompt turns each
    (QA, expected answer) into a rationale without the answer, records visited in a seeded order
    until --short and --long are kept. reasoning.jsonl: StimuliQA records with `reasoning`,
    train_sft.py's `cot` input (<think>reasoning</think><answer>answer</answer>)."""
    from psyrl.dataset.reasoning import build_reasoning

    build_reasoning(run, **kwargs)
