"""Evaluation on the OOD benchmarks (paper §4.1 "Metrics", appendix B, SPEC §7): F1 and F1-accuracy
per benchmark and per task, for any local Hugging Face checkpoint.

    python evaluate.py --model runs/tiny-tgrpo/hf --limit 10 --out runs/eval/tiny
    torchrun --nproc_per_node N evaluate.py --model DIR ...   (items split across ranks)
    python evaluate.py compare RUN_A RUN_B ...                (Table 2/3, deltas against RUN_A)
    python evaluate.py lengths RUN_A [RUN_B] --out fig6.png   (RQ5 / Figure 6)
    psyrl evaluate ... / torchrun --nproc_per_node N -m psyrl evaluate ...   (installed)
    python evaluate.py --engine openai --base-url URL --api-model NAME ...   (`evaluate_api`)

Its command line (the generation options are the trainers' config keys,
psyrl.core.generation_options) is psyrl/cli/evaluate.py; `main` below is the program.

Responses come from the sampler interface of the trainers (`psyrl.runtime.sampler`), one per item,
seeded per item id: an item's random draws do not depend on the ranks, the batch, --limit or a
resume (its logits can, in their last bits, with the batch's shapes). Predictions are appended to
`<out>/predictions.jsonl` as they finish; a second run with the same --out and generation settings
skips the items already there (an interrupted evaluation resumes; SIGTERM or SIGUSR1 stops it after
the round in flight, exit status 75). At the end: predictions.jsonl in item order, results.json,
results.md. `--accuracy semantic|judge` adds an accuracy signal beside the paper's metrics to every
row and summary, and `--choose-by similarity` picks a multiple-choice answer's option by semantic
similarity instead of F1 (issue 41 item 6; `score_signals`, after the paper's scoring, on rank 0).
`--engine openai` sends each item's chat messages to an OpenAI-compatible endpoint
instead (psyrl.eval.openai_engine) and keeps the same files and resume. ToMbench's licence says
"evaluation only": `psyrl self-label` leaves its items out unless told otherwise.
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from psyrl.core import prompts
from psyrl.core.atomic import write_text
from psyrl.core.config import PromptConfig, RunConfig
from psyrl.core.errors import Preempted, PsyrlError
from psyrl.core.generation_options import GenerationOptions
from psyrl.eval.benchmarks import (
    PAPER_BENCHMARKS,
    EvalError,
    aggregate,
    item_seed,
    paper_row,
    read_predictions,
    resolve_sources,
    score_response,
    select_items,
    task_of,
)
from psyrl.eval.lengths import counts_markdown, lengths_by_index
from psyrl.eval.openai_engine import ApiOptions, Client, complete_all, request_body
from psyrl.eval.report import results_markdown
from psyrl.eval.rounds import append_rows, generation_rounds, jsonl_text, preempted
from psyrl.runtime.distributed import Dist, all_gather_lists, broadcast_object, cleanup, print0
from psyrl.runtime.generation import load_generation, start_generation
from psyrl.runtime.model import model_config, weight_files
from psyrl.runtime.preemption import Preemption
from psyrl.signals.evaluation import (
    PAPER_SCORING,
    Scorers,
    Scoring,
    build_scorers,
    score_signals,
    signal_settings,
)

OUTPUT_FILES = ("predictions.jsonl", "eval.json", "results.json", "results.md", "lengths.png")
GENERATION_KEYS = (
    "model",
    "model_fingerprint",
    "tokenizer",
    "prompt",
    "temperature",
    "top_p",
    "seed",
    # what a resume must share with the run it continues
    "max_new_tokens",
    "dtype",
    "engine",
    "base_url",
)
# settings absent from the eval.json of an older psyrl: what it used
DEFAULTS_BEFORE = {"engine": "torch"}


def model_label(model_dir: Path) -> str:
    """A row label: `tiny-tgrpo` for runs/tiny-tgrpo/hf, `tiny-sft/step-200` for a checkpoint's
    hf/."""
    path = Path(os.path.abspath(model_dir))  # not resolve(): a symlinked hf/ keeps its run's name
    if path.name != "hf":
        return path.name
    if path.parent.parent.name == "checkpoints":
        return f"{path.parent.parent.parent.name}/{path.parent.name}"
    return path.parent.name


def split_specs(values) -> list[str]:
    return [v.strip() for value in values for v in value.split(",") if v.strip()]


@dataclass(frozen=True)
class Selection:
    """What evaluate.py evaluates, and where it writes: its options beside the generation ones."""

    benchmarks: tuple[str, ...]
    """Benchmark names or JSONL files, each possibly comma-separated; none: the paper's five."""
    benchmark_dir: str
    """Where benchmark names are looked up (<dir>/<name>/*.jsonl)."""
    prompt: str
    """Appendix A.1's instruction: `cot` (think, then answer) or `direct`."""
    limit: int = 0
    """At most this many items per benchmark task, a seeded choice; 0: all."""
    split: str = "all"
    """SPEC §8's half of every benchmark: `selftrain`, `eval`, or `all`."""
    split_seed: int = 0
    """Seed of the split's hash."""
    out: str | None = None
    """Output directory; None: runs/eval/<model name>."""
    overwrite: bool = False
    """Delete the directory's earlier evaluate.py files instead of resuming them."""

    def specs(self) -> list[str]:
        return split_specs(self.benchmarks) or list(PAPER_BENCHMARKS)


def main(
    gen: GenerationOptions,
    chosen: Selection,
    api: ApiOptions | None = None,
    scoring: Scoring = PAPER_SCORING,
) -> None:
    """Evaluate --model (options checked by the command line): join the ranks, evaluate, report,
    leave. With `api` (--engine openai): one process, no model. Raises psyrl's errors (and on
    Preempted, rank 0 has said how to resume)."""
    if api is not None:
        out = Path(chosen.out or Path("runs") / "eval" / api.model.replace("/", "-"))
        try:
            evaluate_api(gen, api, chosen, out, scoring)
        except Preempted as e:
            print(str(e), flush=True)
            raise
        return
    default_out = Path("runs") / "eval" / model_label(Path(gen.model)).replace("/", "-")
    out = Path(chosen.out) if chosen.out else default_out
    dist = start_generation(gen)
    try:
        evaluate(dist, gen, chosen, out, scoring)
    except Preempted as e:
        print0(str(e), dist)
        cleanup(dist)
        raise
    cleanup(dist)


def evaluate(
    dist: Dist,
    gen: GenerationOptions,
    chosen: Selection,
    out: Path,
    scoring: Scoring = PAPER_SCORING,
) -> None:
    """The evaluation of a local model over this process's ranks (`main` runs it)."""
    # ------------------------------------------------------------- inputs, checked before any write
    sources, items = selection(chosen)
    signal_cfg = signal_settings(scoring)
    generation = load_generation(dist, gen)  # the tokenizer; the model loads after the resume check
    tokenizer, model_dir = generation.tokenizer, Path(gen.model)
    # the model directory too, before eval.json is written: its config (no remote code), weights
    model_config(generation.model_cfg, tokenizer)
    if not weight_files(model_dir):
        raise EvalError(f"{model_dir} holds no weights (*.safetensors or *.bin)")
    given = {**generation.settings, "prompt": chosen.prompt}
    recorded = (*GENERATION_KEYS, "tensor_parallel", "gpu_memory_utilization")
    settings = {
        **{k: given[k] for k in recorded if k in given},
        **selection_settings(sources, chosen),
    }
    predictions = out / "predictions.jsonl"
    done: dict[str, dict] = {}
    problem, scorers = None, None
    # rank 0 decides and writes; the others learn the outcome (no rank left waiting alone)
    if dist.is_main:
        try:
            scorers = build_scorers(scoring, signal_cfg, out)  # rank 0 scores beyond the paper
            settings.update(scorers.settings if scorers else {})
            done = start_output(out, settings, items, chosen.overwrite)
        except (PsyrlError, OSError) as e:
            problem = str(e)
    problem, done_ids = broadcast_object((problem, set(done)), dist)
    if problem:
        raise EvalError(problem)
    # closed after the last collective
    with generation.make_sampler() as sampler:
        mode = chosen.prompt
        prompt_cfg = PromptConfig(mode=mode)
        pending = [(s, r) for s, r in items if r.id not in done_ids]
        # similar lengths per batch: less padding
        pending.sort(key=lambda item: len(prompts.content(item[1])))
        print0(
            f"evaluate: {model_dir} on {dist.world} x {dist.device}: {len(items)} items "
            f"({', '.join(f'{s.name} {sum(1 for x, _ in items if x is s)}' for s in sources)}); "
            f"{len(done_ids)} already in {predictions}, {len(pending)} to generate",
            dist,
        )

        # --------------------------------------------------- generate and score, appending as we go
        stats = {"rank": dist.rank, "items": 0, "response_tokens": 0, "generate_s": 0.0}

        def scored(mine: list) -> list[dict]:
            texts = [prompts.render(tokenizer, r, prompt_cfg) for _, r in mine]
            ids = [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]
            t = time.perf_counter()
            seeds = [item_seed(gen.seed, r.id) for _, r in mine]
            samples = sampler.generate(  # collective: even with no item
                ids, 1, gen.temperature, gen.top_p, gen.max_new_tokens, seeds
            )
            stats["generate_s"] += time.perf_counter() - t
            rows = []
            for (source, record), text, group in zip(mine, texts, samples):
                s = group[0]
                row = score_response(
                    record,
                    source.name,
                    s.text,
                    len(s.token_ids),
                    s.finish_reason,
                    sum(s.logprobs) / len(s.logprobs),
                    mode,
                )
                rows.append({**row, "prompt": text})
                stats["items"] += 1
                stats["response_tokens"] += len(s.token_ids)
            return rows

        t0 = time.perf_counter()
        new = generation_rounds(
            dist,
            pending,
            gen.batch,
            scored,
            predictions,
            total=len(items),
            desc="evaluate",
            unit="item",
            progress=gen.progress,
        )
        done.update((row["id"], row) for row in new)  # rank 0 writes the results from them
        wall = time.perf_counter() - t0
        per_rank = all_gather_lists([stats], dist)
    if not dist.is_main:
        return

    # -------------------------------------------------------------------------------------- results
    perf = {
        "ranks": dist.world,
        "device": str(dist.device),
        "generated_items": len(pending),
        "wall_s": wall,
        "items_per_s": len(pending) / wall if pending and wall > 0 else None,
        "per_rank": per_rank,
    }
    write_results(out, model_label(model_dir), items, done, settings, perf, scorers)
    speed = (
        f"{perf['items_per_s']:.2f} items/s over {dist.world} rank(s)"
        if perf["items_per_s"]
        else "nothing new"
    )
    print0(
        f"evaluate: {len(pending)} items generated in {wall:.1f} s ({speed}); {out}/results.md, "
        "results.json, predictions.jsonl",
        dist,
    )


def evaluate_api(
    gen: GenerationOptions,
    api: ApiOptions,
    chosen: Selection,
    out: Path,
    scoring: Scoring = PAPER_SCORING,
) -> None:
    """`--engine openai`: the same items, prompts, seeds, scoring, files and resume as `evaluate`,
    each response one chat-completions request (`api.concurrency` in flight, one process)."""
    # ------------------------------------------------------------- inputs, checked before any write
    sources, items = selection(chosen)
    scorers = build_scorers(scoring, signal_settings(scoring), out)
    # the key's variable by name only: its value never reaches a file or the screen
    settings = {
        "model": api.model,
        "engine": "openai",
        "base_url": api.base_url,
        "api_key_env": api.key_env,
        "prompt": chosen.prompt,
        "temperature": gen.temperature,
        "top_p": gen.top_p,
        "seed": gen.seed,
        "max_new_tokens": gen.max_new_tokens,
        "concurrency": api.concurrency,
        "request_timeout": api.timeout,
        "retries": api.retries,
        **selection_settings(sources, chosen),
        **(scorers.settings if scorers else {}),
    }
    client = Client(api)  # a key or URL that cannot be sent is refused before anything is written
    done = start_output(out, settings, items, chosen.overwrite)
    predictions = out / "predictions.jsonl"
    mode = chosen.prompt
    prompt_cfg = PromptConfig(mode=mode)
    pending = [(s, r, prompts.messages(r, prompt_cfg)) for s, r in items if r.id not in done]
    key = "an API key" if client.has_key else "no API key"
    print(
        f"evaluate: {api.model} at {api.url} ({key} from ${api.key_env}), {api.concurrency} "
        f"requests in flight: {len(items)} items "
        f"({', '.join(f'{s.name} {sum(1 for x, _ in items if x is s)}' for s in sources)}); "
        f"{len(done)} already in {predictions}, {len(pending)} to request"
    )

    # --------------------------------------------- request and score, appending each as it finishes
    def body(job) -> dict:
        _, record, messages = job
        return request_body(
            api.model,
            messages,
            gen.temperature,
            gen.top_p,
            gen.max_new_tokens,
            item_seed(gen.seed, record.id),
        )

    stats = {"items": 0, "response_tokens": 0}
    t0 = time.perf_counter()
    with (
        Preemption(RunConfig().preempt_signals) as preemption,
        tqdm(
            total=len(items),
            initial=len(done),
            desc="evaluate",
            unit="item",
            dynamic_ncols=True,
            disable=not gen.progress,
        ) as bar,
    ):
        # a signal: no new request; those in flight finish and are kept
        finished = complete_all(client, pending, body, lambda: preemption.received != 0)
        for (source, record, messages), answer in finished:
            row = score_response(
                record, source.name, answer.text, answer.tokens, answer.finish, None, mode
            )  # no log-probs: not every API returns them
            row["prompt"] = json.dumps(messages, ensure_ascii=False)  # what was sent
            append_rows(predictions, [row])  # on disk at once: a crash loses only those in flight
            done[record.id] = row
            stats["items"] += 1
            stats["response_tokens"] += answer.tokens
            bar.update(1)
        stop = preemption.received
    wall = time.perf_counter() - t0
    if stop and len(done) < len(items):
        name = signal.Signals(stop).name
        raise preempted("evaluate", name, len(done), len(items), "item", predictions)

    # -------------------------------------------------------------------------------------- results
    perf = {
        "ranks": 1,
        "device": api.url,
        "generated_items": stats["items"],
        "wall_s": wall,
        "items_per_s": stats["items"] / wall if stats["items"] and wall > 0 else None,
        "concurrency": api.concurrency,
        "per_rank": [{"rank": 0, **stats}],
    }
    write_results(out, api.model, items, done, settings, perf, scorers)
    speed = f"{perf['items_per_s']:.2f} items/s" if perf["items_per_s"] else "nothing new"
    print(
        f"evaluate: {stats['items']} items requested in {wall:.1f} s ({speed}); "
        f"{out}/results.md, results.json, predictions.jsonl"
    )


def selection(chosen: Selection) -> tuple[list, list]:
    """(sources, items): the items evaluated, as (source, record) in source and file order."""
    sources = resolve_sources(chosen.specs(), chosen.benchmark_dir)
    items = [
        (s, r)
        for s in sources
        for r in select_items(s.records, chosen.limit, chosen.split, chosen.split_seed)
    ]
    if not items:
        raise EvalError(
            f"no item to evaluate in {', '.join(s.name for s in sources)} (split {chosen.split})"
        )
    return sources, items


def selection_settings(sources, chosen: Selection) -> dict:
    """What eval.json records of the selection, whatever generates."""
    return {
        "split": chosen.split,
        "split_seed": chosen.split_seed,
        "limit": chosen.limit,
        "options": PromptConfig().options,
        "sources": [
            {"name": s.name, "path": str(s.path.resolve()), "schema": s.schema} for s in sources
        ],
    }


def start_output(out: Path, settings: dict, items: list, overwrite: bool) -> dict[str, dict]:
    """The finished rows of an earlier run (none with `overwrite`, which deletes evaluate.py's own
    files: --out may hold others), then eval.json and predictions.jsonl rewritten without a torn
    last line."""
    done = {} if overwrite else previous_predictions(out, settings, items)
    out.mkdir(parents=True, exist_ok=True)
    for name in OUTPUT_FILES if overwrite else ():
        (out / name).unlink(missing_ok=True)
    write_text(out / "eval.json", json.dumps(settings, indent=2) + "\n")
    write_text(out / "predictions.jsonl", jsonl_text(done.values()))
    return done


def write_results(
    out: Path,
    label: str,
    items: list,
    done: dict[str, dict],
    settings: dict,
    perf: dict,
    scorers: Scorers | None = None,
) -> None:
    """predictions.jsonl in item order (the same file for any ranks, batch, engine order or resume),
    results.json, results.md (printed); with `scorers`, every row scored beyond the paper first."""
    rows = [done[r.id] for _, r in items]
    if scorers is not None:
        perf.update(score_signals(rows, {r.id: r for _, r in items}, scorers))
    write_text(out / "predictions.jsonl", jsonl_text(rows))
    results = aggregate(rows)
    write_text(
        out / "results.json",
        json.dumps({"settings": settings, "results": results, "perf": perf}, indent=2) + "\n",
    )
    markdown = results_markdown(label, results, settings)
    try:
        markdown += (
            "\n## RQ5: Unexpected Outcome Test (ToMbench)\n\n"
            + counts_markdown([label], [lengths_by_index(rows)])
            + "\n"
        )
    except EvalError:
        pass  # no ToMbench Unexpected Outcome Test item in this evaluation
    write_text(out / "results.md", markdown)
    print(markdown)


def previous_predictions(out: Path, settings: dict, items: list) -> dict[str, dict]:
    """The finished rows of an earlier run in `out`, by id, after checking it generated the same
    way; their benchmark and task labels re-derived from this run's sources (a file may have
    moved)."""
    predictions, saved = out / "predictions.jsonl", out / "eval.json"
    if not predictions.exists():
        return {}
    if not saved.is_file():
        raise EvalError(
            f"{out} holds predictions.jsonl but no eval.json: not an evaluate.py directory, or "
            "damaged; use another --out or --overwrite"
        )
    try:
        before = json.loads(saved.read_text(encoding="utf-8"))
    except ValueError as e:
        raise EvalError(f"{saved}: {e}; use --overwrite to start again") from None
    before = {**DEFAULTS_BEFORE, **before}
    changed = [  # a key an engine does not record is None (--engine openai: no dtype)
        f"{k}: {before.get(k)!r} -> {settings.get(k)!r}"
        for k in GENERATION_KEYS
        if before.get(k) != settings.get(k)
    ]
    if changed:
        raise EvalError(
            f"{out} holds predictions made differently ({'; '.join(changed)}); use another --out, "
            "or --overwrite to delete them"
        )
    rows, _ = read_predictions(predictions, tolerate_torn_end=True)
    selected = {r.id: (s, r) for s, r in items}
    outside = sorted({r["id"] for r in rows} - set(selected))
    if outside:
        raise EvalError(
            f"{predictions} holds {len(outside)} predictions for items outside this selection "
            f"(e.g. {outside[0]!r}); choose a selection that includes them, another --out, or "
            "--overwrite"
        )
    done = {}
    for row in rows:
        source, record = selected[row["id"]]
        row["benchmark"], row["task"] = source.name, task_of(record)
        # as the paper scores it: this run's signals and choice rule score every row at the end
        done[row["id"]] = paper_row(row, record)
    return done
