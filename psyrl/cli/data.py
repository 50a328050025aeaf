"""`psyrl data check|convert|benchmarks` (validate JSONL files; convert tables, datasets and chats
into psyrl's formats; copy out the shipped benchmarks), `psyrl demo-data` (the synthetic demo set)
and `psyrl tiny-tokenizer` (the small tokenizer of the CPU runs)."""

from __future__ import annotations

from pathlib import Path

import click

from psyrl.cli.errors import reported
from psyrl.core.presets import copy_benchmarks
from psyrl.core.records import DataError, load_records
from psyrl.dataset.convert import KINDS, TARGETS, ConvertError, convert, parse_map
from psyrl.dataset.testbed import TASKS as TESTBED_TASKS


@click.group("data")
def data_group():
    """Validate data files (StimuliQA records, benchmark items) and convert other formats."""


@data_group.command("check")
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


@data_group.command("convert")
@click.argument("source", type=click.Path(path_type=Path))
@click.option(
    "--to",
    "target",
    type=click.Choice(TARGETS),
    required=True,
    help="stimuliqa: training/validation records; benchmark: multiple-choice evaluation items.",
)
@click.option(
    "--map",
    "map_texts",
    multiple=True,
    required=True,
    metavar="KEY=COLUMN,...",
    help="Which source column fills each field (see above); repeatable.",
)
@click.option(
    "--out", type=click.Path(path_type=Path), required=True, help="The JSONL file to write."
)
@click.option("--overwrite", is_flag=True, help="Replace --out if it exists.")
@click.option(
    "--from",
    "kind",
    type=click.Choice(KINDS),
    default=None,
    help="The source's format (default: from the path).",
)
@click.option(
    "--benchmark",
    default=None,
    help="--to benchmark: the `benchmark` field (default: --out's name without .jsonl).",
)
def convert_command(source, target, map_texts, out, overwrite, kind, benchmark):
    """Convert SOURCE into psyrl's StimuliQA or benchmark JSONL, every row validated.

    SOURCE is a datasets save_to_disk directory (state.json), a .parquet, .csv/.tsv, .jsonl or
    .json file, or a chat JSONL: each line {"messages": [user turn, assistant turn]} with an
    optional system turn first. Parquet and datasets need pyarrow: pip install 'psyrl[data]'.

    --map gives KEY=COLUMN pairs, comma-separated:

    \b
      psyrl data convert stories.parquet --to stimuliqa --out train.jsonl \\
          --map id=uid,stimuli=story,question=prompt,answer=gold
      psyrl data convert cosmos.csv --to benchmark --out cosmosqa.jsonl \\
          --map stimuli=context,question=question,answer_index=label \\
          --map options=answer0+answer1+answer2+answer3

    \b
    stimuliqa   question, stimuli, and answer (or options + answer_index: the
                chosen option is the answer); optional id, variable, dimension,
                subdimension, reasoning, reason (a generator's
                Reason: line, the SFT think text with data.think_from = "reason")
    benchmark   question, options, and answer or answer_index (both: they
                must agree); optional id, stimuli (the context), task, meta

    \b
    options       a list column, a JSON list in a CSV cell, or COL+COL+...
                  (trailing empty cells dropped)
    answer_index  0-based number or letter (A = 0)
    id            default SOURCE-NAME/ROW (stimuliqa), BENCHMARK/ROW (benchmark)
    meta          default {"source_file", "source_row"}
    COLUMN        a.b reaches into a struct column, e.g. options=choices.text

    A chat source has the columns system, user, assistant, and the user turn split at its last
    blank line: user_context (before it; "" without one) and user_question (the last paragraph),
    besides the line's other keys (e.g. id):

    \b
      psyrl data convert chats.jsonl --to stimuliqa --out train.jsonl \\
          --map stimuli=user_context,question=user_question,answer=assistant

    An open-answer evaluation set is a StimuliQA file (evaluate.py scores it by F1 and format).
    Text is stripped of surrounding whitespace. Errors name the source file, its line (CSV,
    JSONL) or row, and the column; nothing is written unless every row converts.
    """
    try:
        mapping = parse_map(map_texts, target)
    except ConvertError as e:
        raise click.BadParameter(str(e), param_hint="--map") from None
    with reported("psyrl data convert", also=(ValueError, OSError)):
        src, records = convert(source, target, mapping, out, kind, benchmark, overwrite)
    click.echo(
        f"wrote {out}: {len(records)} {target} records from {len(src.rows)} rows of "
        f"{src.path} ({src.kind})"
    )


@data_group.command("benchmarks")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory to write README.md and <name>/*.jsonl into.",
)
@click.option("--overwrite", is_flag=True, help="Replace files of the same name in --out.")
def benchmarks_command(out: Path, overwrite: bool):
    """Copy the OOD benchmarks shipped with psyrl (ToMbench, SimpleToM, SocialIQa, CosmosQA,
    BIG-Bench Hard, EmoBench) and their README (schema, sources, licences) into --out, to read or
    edit; `psyrl evaluate --benchmark-dir DIR` then evaluates on the copies."""
    with reported("psyrl data benchmarks", also=(OSError,)):
        written = copy_benchmarks(out, overwrite)
    size = sum(p.stat().st_size for p in written) / 1e6
    click.echo(f"wrote {len(written)} files ({size:.1f} MB) to {out}; see {out / 'README.md'}")


@click.command("demo-data")
@click.option(
    "--task",
    type=click.Choice(("demo", *TESTBED_TASKS)),
    default="demo",
    show_default=True,
    help="demo: the demo set of the CPU demo; drift, swing, choice: the testbeds of issue 43, "
    "items of 1, 2 and 3 events where the answer needs the events combined (docs/testbed.md).",
)
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory to write the files into.  [default: data/demo; data/testbed for drift, "
    "data/testbed-swing for swing, data/testbed-choice for choice]",
)
@click.option(
    "--seed",
    type=int,
    default=0,
    show_default=True,
    help="Seed of the generator (same seed, same bytes).",
)
def demo_data_command(task: str, out: Path | None, seed: int):
    """Write a SYNTHETIC StimuliQA-format data set (for the CPU runs and tests; NOT the paper's
    data).

    --task demo (the default): template-generated and not psychologically validated: 18 variables
    (3 per subdimension) x 60 items split 40/20 into train.jsonl/test.jsonl by the paper's
    per-variable rule, 2 low-frequency variables excluded by that rule, 20 fresh 4-option items per
    variable in mc.jsonl (benchmark schema), and a README.md describing it all.

    --task drift: a testbed where reasoning length matters: a mood on a 7-word scale, then k = 1,
    2 or 3 events that shift it; the answer is the final mood. train.jsonl, test.jsonl, the test
    items by level in test-k1/2/3.jsonl, and a README.md with the shortcut baselines.

    --task swing: drift with mood swings among the events (a swing mirrors the mood on the scale),
    so that no sum of per-event effects gives the answer; written to data/testbed-swing.

    --task choice: swing's items with two reasoning lengths at every level (half the items each):
    at k = 1 the short step or a padded one, at k > 1 the walk or a terse jump to the answer, so
    that a model can answer any item short or long; written to data/testbed-choice.

    Deterministic: the same task and seed write the same bytes.
    """
    if task == "demo":
        from psyrl.dataset import demo_data

        what, out = "demo set", out or Path("data/demo")
        generate, write = (lambda: demo_data.generate(seed)), demo_data.write
    else:
        from psyrl.dataset import testbed

        what, out = f"{task} testbed", out or Path(testbed.DEFAULT_DIRS[task])
        generate, write = (lambda: testbed.generate(task, seed)), testbed.write
    try:
        counts = write(generate(), out)
    except OSError as e:  # --out not writable, a file in its way, a full disk
        raise click.ClickException(f"cannot write the {what} to {out}: {e}") from None
    click.echo(
        f"wrote synthetic {'demo data' if task == 'demo' else what} to {out}: "
        + ", ".join(f"{k} {v} lines" for k, v in counts.items())
    )


@click.command("tiny-tokenizer")
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
