"""`psyrl build`: the StimuliQA builder's command line (the pipeline: psyrl.build.builder, psyrl.build.topics,
psyrl.build.reasoning, psyrl.build.build_run).

    psyrl build qa --catalogue C --table T --model DIR --out DIR          (one process; HF/torch sampler on CPU)
    torchrun --nproc_per_node 4 -m psyrl build qa ... --engine vllm --tensor-parallel 4    (a GPU node)
"""

from __future__ import annotations

import functools
from pathlib import Path

import click
import transformers

from psyrl.build.build_run import BuildError, BuildRun
from psyrl.build.builder import build_comparison, build_qa
from psyrl.build.generation_log import Sampling
from psyrl.build.quality_control import NEAR_DUPLICATE
from psyrl.build.reasoning import PAPER_REASONING, SHORT_WORDS, build_reasoning
from psyrl.build.topics import PAPER_TOPICS, build_topics
from psyrl.core.config import ModelConfig
from psyrl.core.records import DataError
from psyrl.runtime.distributed import cleanup, init_distributed, resolve_dtype
from psyrl.runtime.generation import checkpoint_sampler, fail_once
from psyrl.runtime.model import load_tokenizer, model_fingerprint
from psyrl.runtime.vllm_sampler import VLLMUnavailable, check_tensor_parallel, import_vllm


@click.group("build", context_settings={"help_option_names": ["-h", "--help"]})
def build_group():
    """Build StimuliQA-format data with the paper's prompts (appendix A.1) and quality control (appendix B), from
    any local model directory: QA pairs from labelled stimuli (qa), topic expansion (topics), LlamaQA-style
    comparison sets (comparison), reasoning samples for SFT (reasoning). Each command writes into its --out:
    generations.jsonl (resumable: run the same command again after an interruption), its results, dropped.jsonl,
    report.md and report.json."""


def generation_options(samples: int = 1, max_new_tokens: int = 512):
    """The options every build command shares: the model, the sampler, the sampling, the output directory."""
    options = [
        click.option("--model", "model_dir", required=True, type=click.Path(file_okay=False),
                     help="A local Hugging Face model directory (the generator: e.g. an Instruct model)."),
        click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False),
                     help="Output directory; a second run with the same settings resumes it."),
        click.option("--overwrite", is_flag=True, help="Delete --out's earlier build files (generations included) "
                     "instead of resuming; other files there are left alone."),
        click.option("--temperature", type=float, default=0.7, show_default=True, help="Sampling temperature."),
        click.option("--top-p", type=float, default=0.95, show_default=True, help="Nucleus mass."),
        click.option("--max-new-tokens", type=int, default=max_new_tokens, show_default=True,
                     help="Longest generation."),
        click.option("--samples", type=int, default=samples, show_default=True, help="Generations per prompt."),
        click.option("--seed", type=int, default=0, show_default=True,
                     help="Sampling seed (each prompt draws with its own, from this and its key)."),
        click.option("--batch", type=int, default=16, show_default=True, help="Prompts generated together per rank."),
        click.option("--tokenizer", default="", help="Tokenizer directory or a shipped one (tiny, qwen2.5); default: "
                     "the model directory's."),
        click.option("--dtype", type=click.Choice(["auto", "float32", "bfloat16"]), default="auto", show_default=True,
                     help="Compute dtype (bfloat16: autocast with torch, the engine dtype with vllm); auto = bfloat16 "
                     "on CUDA, float32 on a CPU."),
        click.option("--device", type=click.Choice(["auto", "cpu", "cuda"]), default="auto", show_default=True,
                     help="auto: CUDA (rank r on GPU r) when available, else the CPU."),
        click.option("--engine", type=click.Choice(["torch", "vllm"]), default="torch", show_default=True,
                     help="psyrl's torch sampler, or vLLM (a GPU node with `pip install -e '.[vllm]'`)."),
        click.option("--tensor-parallel", type=int, default=1, show_default=True,
                     help="vllm: consecutive ranks that hold one engine together; must divide the ranks."),
        click.option("--gpu-memory-utilization", type=float, default=0.8, show_default=True,
                     help="vllm: the fraction of each GPU the engine takes."),
        click.option("--progress/--no-progress", default=True, show_default=True, help="Progress bars on rank 0."),
    ]

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command
    return decorate


def run_build(body):
    """Wrap a build command: check the generation options, join torchrun, load the tokenizer, hand `body` a BuildRun
    whose sampler loads the model on first use, print the report; errors as one message from rank 0."""
    @functools.wraps(body)
    def command(model_dir, out_dir, overwrite, temperature, top_p, max_new_tokens, samples, seed, batch, tokenizer,
                dtype, device, engine, tensor_parallel, gpu_memory_utilization, progress, **kwargs):
        problems = [m for ok, m in [
            (temperature >= 0, "--temperature must be >= 0"), (0 < top_p <= 1, "--top-p must be in (0, 1]"),
            (max_new_tokens >= 1, "--max-new-tokens must be >= 1"), (samples >= 1, "--samples must be >= 1"),
            (batch >= 1, "--batch must be >= 1"), (tensor_parallel >= 1, "--tensor-parallel must be >= 1"),
            (0 < gpu_memory_utilization <= 1, "--gpu-memory-utilization must be in (0, 1]")] if not ok]
        if problems:
            raise click.UsageError("; ".join(problems))
        try:
            transformers.utils.logging.disable_progress_bar()
            if engine == "vllm":
                import_vllm()  # before anything starts
            dist = init_distributed(device)
            dtype = resolve_dtype(dtype, dist.device)
            if engine == "vllm":
                check_tensor_parallel(tensor_parallel, dist.world, "--tensor-parallel")
            model_cfg = ModelConfig(path=str(model_dir), tokenizer=tokenizer, dtype=dtype)
            tok = load_tokenizer(model_cfg)
            model_path = Path(model_dir)
            settings = {"model": str(model_path.resolve()), "model_fingerprint": model_fingerprint(model_path),
                        "tokenizer": tokenizer, "engine": engine, "dtype": dtype, "temperature": temperature,
                        "top_p": top_p, "max_new_tokens": max_new_tokens, "seed": seed, "samples": samples}
            engine_settings = {"engine": engine, "tensor_parallel": tensor_parallel,
                               "gpu_memory_utilization": gpu_memory_utilization}
            run = BuildRun(dist, tok, Path(out_dir), settings,
                           Sampling(temperature, top_p, max_new_tokens, seed, samples, batch),
                           lambda: checkpoint_sampler(Path(model_dir), model_cfg, tok, dist, batch, temperature,
                                                      engine_settings, progress),
                           progress)
            body(run, overwrite=overwrite, **kwargs)
            run.close()  # after the last collective
            if dist.is_main:
                click.echo((Path(out_dir) / "report.md").read_text(encoding="utf-8"))
            cleanup(dist)
        except (BuildError, DataError, OSError, ValueError, VLLMUnavailable) as e:
            fail_once(e, "psyrl build", (BuildError, DataError, VLLMUnavailable))
    return command


def qc_and_split_options(command):
    for option in reversed([
        click.option("--near-duplicate", type=click.FloatRange(0, 1, min_open=True), default=NEAR_DUPLICATE,
                     show_default=True, help="Content-word Jaccard similarity from which a pair duplicates an "
                     "earlier one of its group (psyrl.build.quality_control)."),
        click.option("--train", "n_train", type=click.IntRange(min=0), default=200, show_default=True,
                     help="Training pairs per variable (paper §4.1)."),
        click.option("--test", "n_test", type=click.IntRange(min=0), default=100, show_default=True,
                     help="Test pairs per variable (paper §4.1)."),
        click.option("--min-count", type=click.IntRange(min=0), default=None,
                     help="Variables with fewer kept pairs are excluded and listed (default: --train + --test)."),
        click.option("--split-seed", type=int, default=0, show_default=True, help="Seed of the split."),
    ]):
        command = option(command)
    return command


@build_group.command("qa")
@click.option("--catalogue", "catalogue_path", required=True, type=click.Path(dir_okay=False),
              help="Variable catalogue, TOML or JSON (see data/build/catalogue.toml).")
@click.option("--table", "table_path", required=True, type=click.Path(dir_okay=False),
              help="Labelled stimuli, CSV or JSONL: an id, the text, one column per variable.")
@click.option("--id-column", default=None, help="The table's id column (default: `id`, in any case).")
@click.option("--text-column", default=None, help="The table's stimulus column (default: the first of stimuli, "
              "stimulus, text, story, in any case).")
@click.option("--ignore-column", "ignore_columns", multiple=True, help="A table column that is not a variable; "
              "repeatable.")
@qc_and_split_options
@generation_options()
@run_build
def qa_command(run, **kwargs):
    """QA pairs from expert-labelled stimuli: the dataset-generation prompt for every (stimulus, coded variable),
    quality control, then the §4.1 split into train.jsonl and test.jsonl (StimuliQA records that train_sft.py,
    train_tgrpo.py and evaluate.py take)."""
    build_qa(run, **kwargs)


@build_group.command("comparison")
@click.option("--catalogue", "catalogue_path", required=True, type=click.Path(dir_okay=False),
              help="Variable catalogue, TOML or JSON.")
@click.option("--topics", "topics_path", default=None, type=click.Path(dir_okay=False),
              help="topics.jsonl of `psyrl build topics` (default: the catalogue's seed topics).")
@qc_and_split_options
@generation_options()
@run_build
def comparison_command(run, **kwargs):
    """A comparison set in the manner of the paper's LlamaQA and MistralQA: for every (variable, topic) the
    generator writes a stimulus and its QA pair (comparison prompt), then quality control and the §4.1 split."""
    build_comparison(run, **kwargs)


@build_group.command("topics")
@click.option("--catalogue", "catalogue_path", required=True, type=click.Path(dir_okay=False),
              help="Variable catalogue, TOML or JSON, with `topics = [...]` seeds.")
@click.option("--max-topics", type=click.IntRange(min=1), default=PAPER_TOPICS, show_default=True,
              help="Topics per variable, seeds included (appendix B: up to 200).")
@generation_options(samples=4, max_new_tokens=1024)
@run_build
def topics_command(run, **kwargs):
    """Expand each variable's seed topics with the topic-generation prompt: --samples generations per variable,
    duplicates dropped, at most --max-topics kept (topics.jsonl, the input of `psyrl build comparison`)."""
    build_topics(run, **kwargs)


@build_group.command("reasoning")
@click.option("--data", "data_path", required=True, type=click.Path(dir_okay=False),
              help="A StimuliQA JSONL file (e.g. the train.jsonl of `psyrl build qa`).")
@click.option("--short", "n_short", type=click.IntRange(min=0), default=PAPER_REASONING, show_default=True,
              help="Short rationales to keep (appendix B: 500).")
@click.option("--long", "n_long", type=click.IntRange(min=0), default=PAPER_REASONING, show_default=True,
              help="Long rationales to keep (appendix B: 500).")
@click.option("--short-words", type=click.IntRange(min=1), default=SHORT_WORDS, show_default=True,
              help="A rationale of at most this many words is short.")
@generation_options()
@run_build
def reasoning_command(run, **kwargs):
    """Reasoning samples for knowledge injection (appendix B): the reasoning-CoT prompt turns each (QA, expected
    answer) into a rationale without the answer, records visited in a seeded order until --short and --long are
    kept. reasoning.jsonl: StimuliQA records with `reasoning`, train_sft.py's `cot` input
    (<think>reasoning</think><answer>answer</answer>)."""
    build_reasoning(run, **kwargs)
