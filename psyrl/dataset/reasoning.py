"""Reasoning samples for knowledge injection (appendix B, "Logical Reasoning Sample Injection"):
`psyrl build reasoning` turns (QA, expected answer) into step-by-step rationales with the
reasoning-CoT prompt (appendix A.1) and keeps N short and N long ones (the paper: 500 + 500) as SFT
records."""

from __future__ import annotations

import dataclasses
import random

from tqdm import tqdm

from psyrl.core.records import load_stimuliqa
from psyrl.dataset import prompts
from psyrl.dataset.catalogue import Variable
from psyrl.dataset.generation_log import Job
from psyrl.dataset.prompts import PAPER_REASONING, SHORT_WORDS
from psyrl.dataset.qa_pairs import Rejected, parse_reasoning
from psyrl.dataset.run import (
    BuildError,
    BuildRun,
    Tally,
    report_markdown,
    write_nonempty,
    write_report,
)


def build_reasoning(
    run: BuildRun,
    data_path,
    *,
    n_short: int = PAPER_REASONING,
    n_long: int = PAPER_REASONING,
    short_words: int = SHORT_WORDS,
    overwrite: bool = False,
):
    """Appendix B's reasoning samples for knowledge injection: the reasoning-CoT prompt on the
    records of a StimuliQA file, visited in a seeded order until `n_short` rationales of at most
    `short_words` words and `n_long` longer ones are kept. Written as StimuliQA records with
    `reasoning` (train_sft.py's `cot` target is <think>reasoning</think><answer>answer</answer>)."""
    records = load_stimuliqa(data_path)
    if n_short < 0 or n_long < 0 or n_short + n_long == 0:
        raise BuildError("--short and --long must be >= 0, and not both 0")
    order = list(range(len(records)))
    random.Random(f"reasoning:{run.sampling.seed}").shuffle(order)
    run.open("reasoning", {"data": str(data_path)}, overwrite)
    kept: dict[str, list] = {"short": [], "long": []}
    quota = {"short": n_short, "long": n_long}
    tally, dropped, position = Tally(), [], 0
    chunk = run.sampling.batch * run.dist.world
    bar = tqdm(
        total=n_short + n_long,
        desc="reasoning",
        unit="kept",
        dynamic_ncols=True,
        disable=not (run.progress and run.dist.is_main),
    )
    while position < len(order) and any(len(kept[k]) < quota[k] for k in kept):
        batch = [records[i] for i in order[position : position + chunk]]
        position += len(batch)
        jobs = [Job(r.id, prompts.reasoning_prompt(r)) for r in batch]
        # every rank: the loop's decision needs the rows
        rows = run.generate(jobs, "reasoning", progress=False)
        for record, job in zip(batch, jobs):
            taken = False
            for j, output in enumerate(rows[job.key]["outputs"]):
                if taken:  # one rationale per record
                    tally.add(record.variable, "extra_sample")
                    continue
                try:
                    if output["finish_reason"] == "length":
                        raise Rejected("truncated")
                    rationale = parse_reasoning(output["text"], record.answer)
                except Rejected as e:
                    tally.add(record.variable, e.reason)
                    dropped.append(
                        {"id": record.id, "sample": j, "reason": e.reason, "text": output["text"]}
                    )
                    continue
                kind = "short" if len(rationale.split()) <= short_words else "long"
                if len(kept[kind]) >= quota[kind]:
                    tally.add(record.variable, f"surplus_{kind}")
                    continue
                tally.add(record.variable, "kept")
                kept[kind].append(dataclasses.replace(record, reasoning=rationale))
                bar.update(1)
                taken = True
    bar.close()
    if not run.dist.is_main:
        return None
    order_of = {r.id: i for i, r in enumerate(records)}
    chosen = sorted(kept["short"] + kept["long"], key=lambda r: order_of[r.id])
    write_nonempty(run.out / "reasoning.jsonl", chosen)
    write_nonempty(run.out / "dropped.jsonl", dropped)
    catalogue = {
        r.variable: Variable(r.variable, "", 0, 1, r.dimension, r.subdimension, "")
        for r in records
        if r.variable and r.dimension
    }
    words = {k: [len(r.reasoning.split()) for r in v] for k, v in kept.items()}
    report = {
        "command": "reasoning",
        **tally.report(catalogue),
        "records_visited": position,
        "records": len(records),
        "short": len(kept["short"]),
        "long": len(kept["long"]),
        "short_words": short_words,
        "quota": quota,
        "mean_words": {k: sum(w) / len(w) if w else None for k, w in words.items()},
    }
    short_of = [k for k in kept if len(kept[k]) < quota[k]]
    unfilled = (
        f"; the file ran out before the {' and '.join(short_of)} "
        f"quota{'s' * (len(short_of) > 1)} filled"
    )
    summary = (
        f"{position} of {len(records)} records visited (seeded order) for {n_short} short (<= "
        f"{short_words} words) and {n_long} long rationales: kept {len(kept['short'])} short and "
        f"{len(kept['long'])} long in reasoning.jsonl{unfilled if short_of else ''}. Generations "
        "beyond a filled quota count as surplus."
    )
    write_report(
        run.out, report, report_markdown(f"psyrl build reasoning: {run.out}", summary, report)
    )
    return report
