"""The StimuliQA builder (paper §3.1, appendix A.1 and B): `psyrl build qa | topics | comparison | reasoning`.

    qa          labelled stimuli + catalogue -> dataset-generation prompt -> QA pairs -> quality control -> §4.1 split
    topics      the catalogue's seed topics -> topic-generation prompt -> up to N topics per variable
    comparison  topics -> comparison prompt (a stimulus, then its QA pair) -> quality control -> split (LlamaQA-style)
    reasoning   a StimuliQA file -> reasoning-CoT prompt -> N short + N long rationales -> SFT records

Each command owns an output directory: `build.json` (its settings), `generations.jsonl` (every generation, appended
as it finishes: a second run resumes), `dropped.jsonl` (what quality control dropped, with the reason and the raw
text), its results, and `report.json` / `report.md` (kept and dropped per reason, per variable, per dimension).
Results are recomputed from the generations on every run, so a changed filter setting costs no generation.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from tqdm import tqdm

from psyrl import prompts
from psyrl.atomic import write_text
from psyrl.catalogue import Variable, load_catalogue, load_labelled
from psyrl.data import DIMENSIONS, DataError, StimuliRecord, load_stimuliqa, split_by_variable, write_jsonl
from psyrl.distributed import Dist, broadcast_object
from psyrl.generation_log import Job, Sampling, generate, load_log, prompt_sha
from psyrl.qa_pairs import Rejected, parse_qa, parse_reasoning, parse_topics, topic_key
from psyrl.quality_control import NEAR_DUPLICATE, duplicate_reasons, leak_reason

BUILD_FILES = ("build.json", "generations.jsonl", "dropped.jsonl", "qa.jsonl", "train.jsonl", "test.jsonl",
               "topics.jsonl", "reasoning.jsonl", "report.json", "report.md")
GENERATION_KEYS = ("model", "model_fingerprint", "tokenizer", "engine", "dtype", "temperature", "top_p",
                   "max_new_tokens", "seed", "samples")  # what a resume must share with the run it continues
PAPER_TOPICS = 200  # appendix B: "expand them into up to 200 diverse topics each"
PAPER_REASONING = 500  # appendix B: "500 short and 500 long reasoning samples"
SHORT_WORDS = 40  # psyrl's line between a short and a long rationale (the paper does not say)


class BuildError(ValueError):
    """A build that cannot go on (its output directory holds another build, settings changed, no input)."""


@dataclass
class BuildRun:
    """What every command shares: the ranks, the tokenizer, the output directory, how to sample, and the sampler,
    built on first use (inputs are checked before a model is loaded)."""

    ctx: Dist
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
        """Check that `out` is empty, `--overwrite`n, or this command's with the same generation settings; then
        record them. Collective."""
        problem = None
        if self.ctx.is_main:
            try:
                if overwrite:
                    for name in BUILD_FILES:  # only the builder's files: --out may hold others
                        (self.out / name).unlink(missing_ok=True)
                _check_previous(self.out, command, self.settings)
                self.out.mkdir(parents=True, exist_ok=True)
                write_text(self.out / "build.json", json.dumps(
                    {"command": command, "generation": self.settings, "inputs": inputs}, indent=2) + "\n")
            except (BuildError, OSError) as e:
                problem = str(e)
        problem = broadcast_object(problem, self.ctx)
        if problem:
            raise BuildError(problem)

    def generate(self, jobs: Sequence[Job], desc: str, progress: bool | None = None) -> dict[str, dict]:
        log = self.out / "generations.jsonl"
        if self.logged is None:
            self.logged = load_log(self.ctx, log)
        if self.sampler is None and any(self.logged.get(j.key, {}).get("prompt_sha") != prompt_sha(j.prompt)
                                        for j in jobs):  # a finished build re-reports without loading the model
            self.sampler = self.make_sampler()
        return generate(self.ctx, self.sampler, self.tokenizer, jobs, log, self.logged, self.sampling,
                        self.progress if progress is None else progress, desc)

    def close(self) -> None:
        if self.sampler is not None:
            self.sampler.close()


def _check_previous(out: Path, command: str, settings: dict) -> None:
    saved = out / "build.json"
    if not saved.is_file():
        if (out / "generations.jsonl").exists():
            raise BuildError(f"{out} holds generations.jsonl but no build.json: damaged, or not a psyrl build; use "
                             "another --out or --overwrite")
        return
    try:
        before = json.loads(saved.read_text(encoding="utf-8"))
    except ValueError as e:
        raise BuildError(f"{saved}: {e}; use --overwrite to start again") from None
    if before.get("command") != command:
        raise BuildError(f"{out} holds a `psyrl build {before.get('command')}` run; use another --out for "
                         f"`psyrl build {command}`")
    previous = before.get("generation", {})
    changed = [f"{k}: {previous.get(k)!r} -> {settings.get(k)!r}" for k in GENERATION_KEYS
               if previous.get(k) != settings.get(k)]
    log = out / "generations.jsonl"
    if changed and log.exists() and log.stat().st_size > 0:  # nothing generated yet (a failed start): no conflict
        raise BuildError(f"{out} holds generations made differently ({'; '.join(changed)}); use another --out, or "
                         "--overwrite to delete them")


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
            return {"generations": sum(counter.values()), "kept": counter["kept"], "dropped": dropped}

        total, by_dimension = Counter(), {d: Counter() for d in DIMENSIONS}
        by_variable = {}
        order = list(catalogue)
        for code, counter in sorted(self.counts.items(),
                                    key=lambda kv: order.index(kv[0]) if kv[0] in order else len(order)):
            total.update(counter)
            variable = catalogue.get(code)
            if variable is not None:
                by_dimension[variable.dimension].update(counter)
            by_variable[code] = {"dimension": variable.dimension if variable else "",
                                 "subdimension": variable.subdimension if variable else "", **block(counter)}
        return {**block(total), "by_variable": by_variable,
                "by_dimension": {d: block(c) for d, c in by_dimension.items() if c}}


def _table(header: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(str(c) for c in row) + " |" for row in rows])


def report_markdown(title: str, summary: str, report: dict) -> str:
    """report.json for people: the reasons, then one row per variable and per dimension with a column per reason."""
    reasons = sorted(report["dropped"])
    parts = [f"# {title}", "", summary, ""]
    if reasons:
        parts += [_table(["dropped because", "generations"], [[r, report["dropped"][r]] for r in reasons]), ""]
    cols = ["generations", "kept", *reasons]
    row = lambda name, extra, b: [name, *extra, *[b["generations"], b["kept"]], *[b["dropped"].get(r, 0)  # noqa: E731
                                                                                 for r in reasons]]
    parts += ["## By variable", "", _table(["variable", "dimension", *cols], [
        row(code, [b["dimension"]], b) for code, b in report["by_variable"].items()]), ""]
    parts += ["## By dimension", "", _table(["dimension", *cols], [
        row(d, [], b) for d, b in report["by_dimension"].items()]), ""]
    return "\n".join(parts)


def write_nonempty(path: Path, records: Sequence) -> None:
    """The records as JSONL; with none, no file (and none left from an earlier run): the loaders refuse empty
    files, and a stale one would be mistaken for this run's."""
    if records:
        write_jsonl(path, records)
    else:
        path.unlink(missing_ok=True)


def _write_report(out: Path, report: dict, markdown: str) -> None:
    write_text(out / "report.json", json.dumps(report, indent=2, ensure_ascii=False) + "\n")
    write_text(out / "report.md", markdown)


# ---------------------------------------------------------------- QA pairs: qa and comparison
@dataclass(frozen=True)
class Candidate:
    """One generation of a QA prompt with what quality control needs to judge it."""

    id: str
    variable: Variable
    stimulus: str
    """The labelled stimulus (qa); "" for comparison sets, where the generation writes it."""
    value: float | None
    group: str
    """Duplicates are looked for within a group (see psyrl.quality_control)."""
    output: dict


def _judge(candidates: list[Candidate], comparison: bool, near_duplicate: float):
    """(kept records, dropped rows, tally): parse, leak rules, then duplicates, in generation order."""
    tally, dropped, passed = Tally(), [], []
    for c in candidates:
        cut = c.output["finish_reason"] == "length"
        try:
            pair = parse_qa(c.output["text"], want_stimulus=comparison)
            if cut and not pair.reason:  # cut before its Reason: the answer may be cut too
                raise Rejected("truncated")
        except Rejected as e:  # a generation cut at max_new_tokens fails for that reason, whatever it lacks
            dropped.append((c, "truncated" if cut else e.reason, None))
            continue
        stimulus = pair.stimulus if comparison else c.stimulus
        reason = leak_reason(pair, stimulus, c.variable, c.value)
        if reason:
            dropped.append((c, reason, pair))
            continue
        passed.append((c, pair, stimulus))
    texts = [(c.group, f"{stimulus}\n{pair.question}" if comparison else pair.question) for c, pair, stimulus in passed]
    kept = []
    for (c, pair, stimulus), reason in zip(passed, duplicate_reasons(texts, near_duplicate)):
        if reason:
            dropped.append((c, reason, pair))
            continue
        tally.add(c.variable.code, "kept")
        kept.append(StimuliRecord(id=c.id, stimuli=stimulus, question=pair.question, answer=pair.answer,
                                  variable=c.variable.code, dimension=c.variable.dimension,
                                  subdimension=c.variable.subdimension))
    rows = []
    for c, reason, pair in dropped:
        tally.add(c.variable.code, reason)
        rows.append({"id": c.id, "variable": c.variable.code, "reason": reason, "text": c.output["text"],
                     **({"question": pair.question, "answer": pair.answer} if pair else {})})
    order = {c.id: i for i, c in enumerate(candidates)}
    rows.sort(key=lambda r: order[r["id"]])
    return kept, rows, tally


def _candidates(jobs: list[Job], rows: dict[str, dict], info: dict[str, tuple]) -> list[Candidate]:
    """One Candidate per generation; `info[key]` = (variable, stimulus, value, group)."""
    out = []
    for job in jobs:
        outputs = rows[job.key]["outputs"]
        for j, output in enumerate(outputs):
            ident = job.key if len(outputs) == 1 else f"{job.key}#{j}"
            out.append(Candidate(ident, *info[job.key], output))
    return out


def _finish_qa(run: BuildRun, command: str, catalogue, candidates, comparison: bool, near_duplicate: float,
               n_train: int, n_test: int, min_count: int | None, split_seed: int, summary: str) -> dict:
    kept, dropped, tally = _judge(candidates, comparison, near_duplicate)
    out = run.out
    split = split_by_variable(kept, n_train, n_test, split_seed, min_count)
    for name, records in (("qa.jsonl", kept), ("dropped.jsonl", dropped), ("train.jsonl", split.train),
                          ("test.jsonl", split.test)):
        write_nonempty(out / name, records)
    minimum = n_train + n_test if min_count is None else min_count
    generated = list(dict.fromkeys(c.variable.code for c in candidates))
    excluded = {code: split.excluded.get(code, 0) for code in generated  # a variable with nothing kept too
                if code in split.excluded or not any(r.variable == code for r in kept)}
    report = {"command": command, **tally.report(catalogue),
              "split": {"train": len(split.train), "test": len(split.test), "n_train": n_train, "n_test": n_test,
                        "min_count": minimum, "seed": split_seed, "excluded": excluded}}
    files = " and ".join(n for n, r in (("train.jsonl", split.train), ("test.jsonl", split.test)) if r)
    split_line = (f"Split (paper §4.1, {n_train} train / {n_test} test per variable, seed {split_seed}): "
                  f"{len(split.train)} train, {len(split.test)} test"
                  + (f" ({files})" if files else " (no file written)")
                  + f"; excluded with fewer than {minimum} kept pairs: "
                  + (", ".join(f"{code} ({n})" for code, n in excluded.items()) or "none") + ".")
    markdown = report_markdown(f"psyrl build {command}: {out}", f"{summary} = {report['generations']} generations: "
                               f"{report['kept']} kept (qa.jsonl), {sum(report['dropped'].values())} dropped "
                               f"(dropped.jsonl).\n\n{split_line}", report)
    _write_report(out, report, markdown)
    return report


def build_qa(run: BuildRun, catalogue_path, table_path, *, id_column: str | None = None,
             text_column: str | None = None, ignore_columns: Sequence[str] = (), near_duplicate: float = NEAR_DUPLICATE,
             n_train: int = 200, n_test: int = 100, min_count: int | None = None, split_seed: int = 0,
             overwrite: bool = False):
    """StimuliQA from a table of labelled stimuli: one dataset-generation prompt per (stimulus, coded variable).
    Returns the report on rank 0 (None on the others)."""
    catalogue = load_catalogue(catalogue_path)
    stimuli = load_labelled(table_path, catalogue, id_column, text_column, ignore_columns)
    jobs, info = [], {}
    for s in stimuli:
        for code, value in s.values.items():
            key = f"{s.id}:{code}"
            jobs.append(Job(key, prompts.dataset_prompt(catalogue[code], s.text, value)))
            info[key] = (catalogue[code], s.text, value, s.id)
    if not jobs:
        raise BuildError(f"{table_path}: no stimulus has a value for any variable of {catalogue_path}")
    run.open("qa", {"catalogue": str(catalogue_path), "table": str(table_path)}, overwrite)
    rows = run.generate(jobs, "qa pairs")
    if not run.ctx.is_main:
        return None
    return _finish_qa(run, "qa", catalogue, _candidates(jobs, rows, info), False, near_duplicate, n_train, n_test,
                      min_count, split_seed, f"{len(stimuli)} stimuli, {len(jobs)} coded (stimulus, variable) prompts "
                      f"x {run.sampling.samples}")


def read_topics(path, catalogue: dict[str, Variable]) -> dict[str, list[str]]:
    """topics.jsonl of `psyrl build topics` (`{"variable", "topic", ...}` per line): topics by variable."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such topics file")
    topics: dict[str, list[str]] = {}
    errors = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row, dict):
                raise ValueError('expected a JSON object {"variable": ..., "topic": ...}')
            code, topic = row["variable"], row["topic"]
            if code not in catalogue:
                raise ValueError(f"variable {code!r} is not in the catalogue")
            if not isinstance(topic, str) or not topic.strip():
                raise ValueError("topic must be a non-empty string")
        except (ValueError, KeyError, TypeError) as e:
            errors.append(f"{path}:{lineno}: {e if not isinstance(e, KeyError) else f'missing key {e}'}")
            continue
        topics.setdefault(code, []).append(topic.strip())
    if errors:
        raise DataError(f"{path}: {len(errors)} bad line(s):\n" + "\n".join(errors[:20]))
    return topics


def build_comparison(run: BuildRun, catalogue_path, topics_path=None, *, near_duplicate: float = NEAR_DUPLICATE,
                     n_train: int = 200, n_test: int = 100, min_count: int | None = None, split_seed: int = 0,
                     overwrite: bool = False):
    """A LlamaQA/MistralQA-style comparison set: per (variable, topic) the generator writes a stimulus and its QA
    pair. Topics from `topics_path` (psyrl build topics) or else the catalogue's seed topics."""
    catalogue = load_catalogue(catalogue_path)
    topics = read_topics(topics_path, catalogue) if topics_path else {
        code: list(v.topics) for code, v in catalogue.items() if v.topics}
    jobs, info = [], {}
    for code, variable in catalogue.items():
        for topic in dict.fromkeys(topics.get(code, []), None):  # a repeated topic once
            key = f"{code}:{prompt_sha(topic_key(topic))[:10]}"  # by topic: adding one regenerates no other
            if key not in info:
                jobs.append(Job(key, prompts.comparison_prompt(variable, topic)))
                info[key] = (variable, "", None, code)
    if not jobs:
        raise BuildError(f"no topic to build from: {topics_path or catalogue_path} has no topic for a variable of "
                         f"{catalogue_path}")
    run.open("comparison", {"catalogue": str(catalogue_path), "topics": str(topics_path or "")}, overwrite)
    rows = run.generate(jobs, "comparison pairs")
    if not run.ctx.is_main:
        return None
    return _finish_qa(run, "comparison", catalogue, _candidates(jobs, rows, info), True, near_duplicate, n_train,
                      n_test, min_count, split_seed, f"{len(jobs)} (variable, topic) prompts over "
                      f"{len({k.split(':')[0] for k in info})} variables x {run.sampling.samples}")


# ---------------------------------------------------------------- topics
def build_topics(run: BuildRun, catalogue_path, *, max_topics: int = PAPER_TOPICS, overwrite: bool = False):
    """Expand each variable's seed topics with the topic-generation prompt (`samples` generations per variable):
    duplicates (same words as a seed or an earlier topic) dropped, at most `max_topics` per variable, seeds
    included (appendix B: 10-50 seeds, up to 200 topics)."""
    catalogue = load_catalogue(catalogue_path)
    seeded = {code: v for code, v in catalogue.items() if v.topics}
    if not seeded:
        raise BuildError(f"{catalogue_path}: no variable has seed topics (`topics = [...]`) to expand")
    if max_topics < 1:
        raise BuildError("--max-topics must be >= 1")
    jobs = [Job(code, prompts.topic_prompt(list(v.topics))) for code, v in seeded.items()]
    run.open("topics", {"catalogue": str(catalogue_path)}, overwrite)
    rows = run.generate(jobs, "topics")
    if not run.ctx.is_main:
        return None
    tally, lines, dropped = Tally(), [], []
    per_variable = {}
    for job in jobs:
        variable = seeded[job.key]
        seen, kept = set(), []
        for topic in variable.topics:
            if topic_key(topic) not in seen:
                seen.add(topic_key(topic))
                kept.append((topic, "seed"))
        new = 0
        for j, output in enumerate(rows[job.key]["outputs"]):
            found, rejected = parse_topics(output["text"])
            for reason, n in rejected.items():
                for _ in range(n):
                    tally.add(job.key, reason)
            for topic in found:
                reason = ("duplicate" if topic_key(topic) in seen else "over_cap" if len(kept) >= max_topics else None)
                tally.add(job.key, reason or "kept")
                if reason:
                    dropped.append({"variable": job.key, "sample": j, "reason": reason, "topic": topic})
                    continue
                seen.add(topic_key(topic))
                kept.append((topic, "generated"))
                new += 1
        seeds = sum(origin == "seed" for _, origin in kept)
        per_variable[job.key] = {"seeds": seeds, "generated": new, "topics": min(len(kept), max_topics)}
        lines += [{"variable": job.key, "topic": t, "origin": origin} for t, origin in kept[:max_topics]]
    write_nonempty(run.out / "topics.jsonl", lines)
    write_nonempty(run.out / "dropped.jsonl", dropped)
    report = {"command": "topics", "max_topics": max_topics, **tally.report(catalogue), "topics": per_variable}
    skipped = sorted(set(catalogue) - set(seeded))
    markdown = report_markdown(
        f"psyrl build topics: {run.out}",
        f"{len(jobs)} variables with seed topics x {run.sampling.samples} generations; candidate topic lines counted "
        f"below (kept = new topics in topics.jsonl, at most {max_topics} per variable with the seeds)."
        + (f" Without seed topics, not expanded: {', '.join(skipped)}." if skipped else ""), report)
    markdown += "\n## Topics per variable\n\n" + _table(["variable", "seeds", "generated", "topics"], [
        [code, b["seeds"], b["generated"], b["topics"]] for code, b in per_variable.items()]) + "\n"
    _write_report(run.out, report, markdown)
    return report


# ---------------------------------------------------------------- reasoning samples
def build_reasoning(run: BuildRun, data_path, *, n_short: int = PAPER_REASONING, n_long: int = PAPER_REASONING,
                    short_words: int = SHORT_WORDS, overwrite: bool = False):
    """Appendix B's reasoning samples for knowledge injection: the reasoning-CoT prompt on the records of a StimuliQA
    file, visited in a seeded order until `n_short` rationales of at most `short_words` words and `n_long` longer
    ones are kept. Written as StimuliQA records with `reasoning` (train_sft.py's `cot` target is
    <think>reasoning</think><answer>answer</answer>)."""
    records = load_stimuliqa(data_path)
    if n_short < 0 or n_long < 0 or n_short + n_long == 0:
        raise BuildError("--short and --long must be >= 0, and not both 0")
    order = list(range(len(records)))
    random.Random(f"reasoning:{run.sampling.seed}").shuffle(order)
    run.open("reasoning", {"data": str(data_path)}, overwrite)
    kept: dict[str, list] = {"short": [], "long": []}
    quota = {"short": n_short, "long": n_long}
    tally, dropped, position = Tally(), [], 0
    chunk = run.sampling.batch * run.ctx.world
    bar = tqdm(total=n_short + n_long, desc="reasoning", unit="kept", dynamic_ncols=True,
               disable=not (run.progress and run.ctx.is_main))
    while position < len(order) and any(len(kept[k]) < quota[k] for k in kept):
        batch = [records[i] for i in order[position:position + chunk]]
        position += len(batch)
        jobs = [Job(r.id, prompts.reasoning_prompt(r)) for r in batch]
        rows = run.generate(jobs, "reasoning", progress=False)  # every rank: the loop's decision needs the rows
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
                    dropped.append({"id": record.id, "sample": j, "reason": e.reason, "text": output["text"]})
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
    if not run.ctx.is_main:
        return None
    order_of = {r.id: i for i, r in enumerate(records)}
    chosen = sorted(kept["short"] + kept["long"], key=lambda r: order_of[r.id])
    write_nonempty(run.out / "reasoning.jsonl", chosen)
    write_nonempty(run.out / "dropped.jsonl", dropped)
    catalogue = {r.variable: Variable(r.variable, "", 0, 1, r.dimension, r.subdimension, "")
                 for r in records if r.variable and r.dimension}
    words = {k: [len(r.reasoning.split()) for r in v] for k, v in kept.items()}
    report = {"command": "reasoning", **tally.report(catalogue), "records_visited": position,
              "records": len(records), "short": len(kept["short"]), "long": len(kept["long"]),
              "short_words": short_words, "quota": quota,
              "mean_words": {k: sum(w) / len(w) if w else None for k, w in words.items()}}
    short_of = [k for k in kept if len(kept[k]) < quota[k]]
    unfilled = f"; the file ran out before the {' and '.join(short_of)} quota{'s' * (len(short_of) > 1)} filled"
    summary = (f"{position} of {len(records)} records visited (seeded order) for {n_short} short (<= {short_words} "
               f"words) and {n_long} long rationales: kept {len(kept['short'])} short and {len(kept['long'])} long "
               f"in reasoning.jsonl{unfilled if short_of else ''}. Generations beyond a filled quota count as "
               "surplus.")
    _write_report(run.out, report, report_markdown(f"psyrl build reasoning: {run.out}", summary, report))
    return report
