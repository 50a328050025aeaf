"""What every `psyrl build` command shares (psyrl.dataset.builder, psyrl.dataset.topics,
psyrl.dataset.reasoning): its output directory and settings (`build.json`), generation through the
resumable log, the sampler loaded on first use, and the report (kept and dropped per reason, per
variable, per dimension; `report.json` and `report.md`).

Each command owns an output directory: `build.json` (its settings), `generations.jsonl` (every
generation, appended as it finishes: a second run resumes), `dropped.jsonl` (what was dropped, with
the reason and the raw text), its results, and the report. Results are recomputed from the
generations on every run, so a changed filter setting costs no generation.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from psyrl.core.atomic import write_text
from psyrl.core.errors import Preempted, PsyrlError
from psyrl.core.generation_options import GenerationOptions
from psyrl.core.records import DIMENSIONS, write_jsonl
from psyrl.dataset.catalogue import Variable
from psyrl.dataset.generation_log import Job, Sampling, generate, load_log
from psyrl.runtime.distributed import Dist, broadcast_object, cleanup
from psyrl.runtime.generation import load_generation, start_generation

BUILD_FILES = (
    "build.json",
    "generations.jsonl",
    "dropped.jsonl",
    "qa.jsonl",
    "train.jsonl",
    "test.jsonl",
    "topics.jsonl",
    "reasoning.jsonl",
    "report.json",
    "report.md",
)
GENERATION_KEYS = (
    "model",
    "model_fingerprint",
    "tokenizer",
    "engine",
    "dtype",
    "temperature",
    "top_p",
    # what a resume must share with the run it continues
    "max_new_tokens",
    "seed",
    "samples",
)


class BuildError(PsyrlError, ValueError):
    """A build that cannot go on (its output directory holds another build, settings changed, no
    input)."""


@dataclass
class BuildRun:
    """What every command shares: the ranks, the tokenizer, the output directory, how to sample, and
    the sampler, built on first use (inputs are checked before a model is loaded)."""

    dist: Dist
    tokenizer: object
    out: Path
    settings: dict
    """The generation settings (GENERATION_KEYS) recorded in build.json."""
    sampling: Sampling
    make_sampler: Callable[[], object]
    progress: bool = True
    sampler: object = field(default=None, init=False)
    logged: dict | None = field(default=None, init=False)
    """generations.jsonl's rows by key, read once."""

    def open(self, command: str, inputs: dict, overwrite: bool) -> None:
        """Check that `out` is empty, `--overwrite`n, or this command's with the same generation
        settings; then record them. Collective."""
        problem = None
        if self.dist.is_main:
            try:
                if overwrite:
                    for name in BUILD_FILES:  # only the builder's files: --out may hold others
                        (self.out / name).unlink(missing_ok=True)
                _check_previous(self.out, command, self.settings)
                self.out.mkdir(parents=True, exist_ok=True)
                write_text(
                    self.out / "build.json",
                    json.dumps(
                        {"command": command, "generation": self.settings, "inputs": inputs},
                        indent=2,
                    )
                    + "\n",
                )
            except (BuildError, OSError) as e:
                problem = str(e)
        problem = broadcast_object(problem, self.dist)
        if problem:
            raise BuildError(problem)

    def generate(
        self,
        jobs: Sequence[Job],
        desc: str,
        progress: bool | None = None,
        samples: int | None = None,
    ) -> dict[str, dict]:
        """Every job's log row (see psyrl.dataset.generation_log.generate); `samples` overrides the
        generations per prompt (a two-turn dialogue's first reply is one)."""
        log = self.out / "generations.jsonl"
        if self.logged is None:
            self.logged = load_log(self.dist, log)
        if self.sampler is None and any(
            self.logged.get(j.key, {}).get("prompt_sha") != j.sha
            # a finished build re-reports without loading the model
            for j in jobs
        ):
            self.sampler = self.make_sampler()
        sampling = self.sampling if samples is None else replace(self.sampling, samples=samples)
        return generate(
            self.dist,
            self.sampler,
            self.tokenizer,
            jobs,
            log,
            self.logged,
            sampling,
            self.progress if progress is None else progress,
            desc,
        )

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()


def build(
    body: Callable, gen: GenerationOptions, out_dir: Path, overwrite: bool, options: dict
) -> str | None:
    """One `psyrl build` command: join torchrun, load the tokenizer, run `body(run, overwrite=...,
    **options)` on a BuildRun whose sampler loads the model on first use, close it, leave the
    process group. Returns report.md's text on rank 0, None on the others; on Preempted rank 0 says
    where the build stopped."""
    dist = start_generation(gen)
    try:
        generation = load_generation(dist, gen)
        settings = {k: generation.settings[k] for k in GENERATION_KEYS}
        sampling = Sampling(
            gen.temperature, gen.top_p, gen.max_new_tokens, gen.seed, gen.samples, gen.batch
        )
        run = BuildRun(
            dist,
            generation.tokenizer,
            out_dir,
            settings,
            sampling,
            generation.make_sampler,
            gen.progress,
        )
        try:
            body(run, overwrite=overwrite, **options)
        finally:  # on success or preemption every rank is here; after an error the process ends
            run.close()
    except Preempted as e:
        if dist.is_main:
            print(f"psyrl build {e}", file=sys.stderr, flush=True)
        cleanup(dist)
        raise
    report = (out_dir / "report.md").read_text(encoding="utf-8") if dist.is_main else None
    cleanup(dist)  # after the model was released
    return report


def _check_previous(out: Path, command: str, settings: dict) -> None:
    saved = out / "build.json"
    if not saved.is_file():
        if (out / "generations.jsonl").exists():
            raise BuildError(
                f"{out} holds generations.jsonl but no build.json: damaged, or not a psyrl build; "
                "use another --out or --overwrite"
            )
        return
    try:
        before = json.loads(saved.read_text(encoding="utf-8"))
    except ValueError as e:
        raise BuildError(f"{saved}: {e}; use --overwrite to start again") from None
    if before.get("command") != command:
        raise BuildError(
            f"{out} holds a `psyrl build {before.get('command')}` run; use another --out for "
            f"`psyrl build {command}`"
        )
    previous = before.get("generation", {})
    changed = [
        f"{k}: {previous.get(k)!r} -> {settings.get(k)!r}"
        for k in GENERATION_KEYS
        if previous.get(k) != settings.get(k)
    ]
    log = out / "generations.jsonl"
    # nothing generated yet (a failed start): no conflict
    if changed and log.exists() and log.stat().st_size > 0:
        raise BuildError(
            f"{out} holds generations made differently ({'; '.join(changed)}); use another --out, "
            "or --overwrite to delete them"
        )


# ---------------------------------------------------------------- tallies and reports
@dataclass
class Tally:
    """Generations, kept and dropped-by-reason counts per variable."""

    counts: dict[str, Counter] = field(default_factory=dict)

    def add(self, code: str, outcome: str) -> None:
        self.counts.setdefault(code, Counter())[outcome] += 1

    def report(self, catalogue: dict[str, Variable]) -> dict:
        def block(counter: Counter) -> dict:
            dropped = {k: v for k, v in sorted(counter.items()) if k != "kept"}
            return {
                "generations": sum(counter.values()),
                "kept": counter["kept"],
                "dropped": dropped,
            }

        total, by_dimension = Counter(), {d: Counter() for d in DIMENSIONS}
        by_variable = {}
        order = list(catalogue)
        for code, counter in sorted(
            self.counts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)
        ):
            total.update(counter)
            variable = catalogue.get(code)
            if variable is not None:
                by_dimension[variable.dimension].update(counter)
            by_variable[code] = {
                "dimension": variable.dimension if variable else "",
                "subdimension": variable.subdimension if variable else "",
                **block(counter),
            }
        return {
            **block(total),
            "by_variable": by_variable,
            "by_dimension": {d: block(c) for d, c in by_dimension.items() if c},
        }


def table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def report_markdown(title: str, summary: str, report: dict) -> str:
    """report.json for people: the reasons, then one row per variable and per dimension with a
    column per reason."""
    reasons = sorted(report["dropped"])
    parts = [f"# {title}", "", summary, ""]
    if reasons:
        parts += [
            table(["dropped because", "generations"], [[r, report["dropped"][r]] for r in reasons]),
            "",
        ]
    cols = ["generations", "kept", *reasons]
    row = lambda name, extra, b: [
        name,
        *extra,
        *[b["generations"], b["kept"]],
        *[b["dropped"].get(r, 0) for r in reasons],
    ]
    parts += [
        "## By variable",
        "",
        table(
            ["variable", "dimension", *cols],
            [row(code, [b["dimension"]], b) for code, b in report["by_variable"].items()],
        ),
        "",
    ]
    parts += [
        "## By dimension",
        "",
        table(["dimension", *cols], [row(d, [], b) for d, b in report["by_dimension"].items()]),
        "",
    ]
    return "\n".join(parts)


def write_nonempty(path: Path, records: Sequence) -> None:
    """The records as JSONL; with none, no file (and none left from an earlier run): the loaders
    refuse empty files, and a stale one would be mistaken for this run's."""
    if records:
        write_jsonl(path, records)
    else:
        path.unlink(missing_ok=True)


def write_report(out: Path, report: dict, markdown: str) -> None:
    write_text(out / "report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    write_text(out / "report.md", markdown)
