"""Resumable generation for the data builder (`psyrl build`): many prompts through the sampler
interface, each finished round appended to a JSONL log, so an interrupted build resumes where it
stopped and a finished prompt is never generated again.

A log row: `{"key", "prompt_sha", "outputs": [{"text", "finish_reason", "tokens"}, ...]}`. A row
counts as done for a job with the same key and the same prompt, every turn of its dialogue included
(an edited stimulus is generated again). Under torchrun the prompts of a round are shared across
ranks and rank 0 writes; each prompt draws with its own seed (from the build's seed and its key), so
the samples do not depend on the ranks, the batch or a resume.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from psyrl.core.atomic import write_text
from psyrl.core.records import DataError, read_jsonl
from psyrl.eval.benchmarks import item_seed
from psyrl.eval.rounds import generation_rounds, jsonl_text
from psyrl.runtime.distributed import Dist, broadcast_object


@dataclass(frozen=True)
class Job:
    key: str
    """Unique within a build: what a resume recognises (e.g. `<stimulus id>:<variable>`)."""
    prompt: str
    """The user turn the generator answers."""
    history: tuple[str, ...] = ()
    """Earlier turns of the dialogue before `prompt`, user and assistant alternating (`psyrl build
    comparison --dialogue two-turn`: the dataset prompt, then the generator's reply to it); () =
    `prompt` is the whole conversation."""

    def messages(self) -> list[dict[str, str]]:
        """The chat turns sent to the generator, ending with the user's `prompt`."""
        turns = [*self.history, self.prompt]
        return [
            {"role": ("user", "assistant")[i % 2], "content": text} for i, text in enumerate(turns)
        ]

    @property
    def sha(self) -> str:
        """What a resume compares: the prompt's hash, every turn's when there is a history (a
        one-turn job hashes as before, so older logs resume)."""
        if not self.history:
            return prompt_sha(self.prompt)
        return prompt_sha(json.dumps(self.messages(), ensure_ascii=False))


@dataclass(frozen=True)
class Sampling:
    temperature: float = 0.7
    top_p: float = 0.95
    max_new_tokens: int = 512
    seed: int = 0
    samples: int = 1
    """Generations per prompt."""
    batch: int = 16
    """Prompts per rank per round."""


def prompt_sha(prompt: str) -> str:
    return hashlib.sha256(prompt.encode("utf-8")).hexdigest()[:16]


def chat_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The chat turns as the model's chat template renders them, ready for the assistant's reply."""
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def read_log(path: Path) -> dict[str, dict]:
    """The log's rows by key (a later row for a key replaces an earlier one). A torn last line (a
    crash while writing) is dropped; a bad line anywhere else is a DataError naming it."""
    if not path.exists():
        return {}
    try:
        numbered = read_jsonl(path, _log_row, torn=[])
    except DataError as e:
        raise DataError(f"{e}; not a psyrl build log (another --out, or --overwrite)") from None
    return {row["key"]: row for _, row in numbered}


def _log_row(row) -> dict:
    if not (
        isinstance(row, dict)
        and isinstance(row.get("key"), str)
        and isinstance(row.get("outputs"), list)
    ):
        raise ValueError("not a generation row")
    return row


def load_log(dist: Dist, log: Path) -> dict[str, dict]:
    """Every row of `log`, by key, on every rank (rank 0 reads it and rewrites it without a torn
    last line). Collective."""
    rows, problem = {}, None
    if dist.is_main:  # the others learn the outcome (no rank left waiting alone)
        try:
            rows = read_log(log)
            log.parent.mkdir(parents=True, exist_ok=True)
            write_text(log, jsonl_text(rows.values(), ensure_ascii=False))
        except (DataError, OSError) as e:
            problem = str(e)
    problem, rows = broadcast_object((problem, rows), dist)
    if problem:
        raise DataError(problem)
    return rows


def generate(
    dist: Dist,
    sampler,
    tokenizer,
    jobs: Sequence[Job],
    log: Path,
    logged: dict[str, dict],
    sampling: Sampling,
    progress: bool = True,
    desc: str = "generate",
) -> dict[str, dict]:
    """Every job's log row, by key, on every rank: from `logged` (see load_log; the new rows are
    added to it) when done with the same prompt, generated and appended to `log` otherwise.
    Collective under torchrun (psyrl.eval.rounds): a failed write on rank 0 stops every rank
    (OSError); SIGTERM or SIGUSR1 on any rank stops it after the round in flight (Preempted)."""
    keys = [job.key for job in jobs]
    if len(set(keys)) != len(keys):
        raise ValueError("two jobs share a key")
    done = {
        j.key: logged[j.key]
        for j in jobs
        if j.key in logged and logged[j.key].get("prompt_sha") == j.sha
    }
    # less padding per batch
    pending = sorted((j for j in jobs if j.key not in done), key=lambda j: len(j.prompt))

    def rows(mine: list[Job]) -> list[dict]:
        groups = sampler.generate(  # collective
            [chat_ids(tokenizer, j.messages()) for j in mine],
            sampling.samples,
            sampling.temperature,
            sampling.top_p,
            sampling.max_new_tokens,
            [item_seed(sampling.seed, j.key) for j in mine],
        )
        return [
            {
                "key": j.key,
                "prompt_sha": j.sha,
                "outputs": [
                    {"text": s.text, "finish_reason": s.finish_reason, "tokens": len(s.token_ids)}
                    for s in group
                ],
            }
            for j, group in zip(mine, groups)
        ]

    new = generation_rounds(
        dist,
        pending,
        sampling.batch,
        rows,
        log,
        total=len(jobs),
        desc=desc,
        unit="prompt",
        progress=progress,
        ensure_ascii=False,  # the log keeps its text readable
    )
    done.update((row["key"], row) for row in new)
    logged.update((row["key"], row) for row in new)
    return {j.key: done[j.key] for j in jobs}
