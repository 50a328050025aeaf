"""QA pairs (paper §3.1, appendix A.1 and B): `psyrl build qa` (from expert-labelled stimuli) and
`psyrl build comparison` (LlamaQA/MistralQA-style: the generator writes the stimulus too), then
quality control and the §4.1 split.

    qa          labelled stimuli + catalogue -> dataset-generation prompt -> QA pairs -> quality
    control -> split
    comparison  topics -> comparison prompt (a stimulus, then its QA pair) -> quality control ->
    split

The other commands: psyrl.dataset.topics (`topics`), psyrl.dataset.reasoning (`reasoning`); what
they share: psyrl.dataset.run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from psyrl.core.records import (
    DataError,
    StimuliRecord,
    raise_line_errors,
    read_jsonl,
    split_by_variable,
)
from psyrl.dataset import prompts
from psyrl.dataset.catalogue import Variable, load_catalogue
from psyrl.dataset.generation_log import Job, prompt_sha
from psyrl.dataset.labelled import load_labelled
from psyrl.dataset.qa_pairs import Rejected, parse_qa, topic_key
from psyrl.dataset.quality_control import NEAR_DUPLICATE, duplicate_reasons, leak_reason
from psyrl.dataset.run import (
    BuildError,
    BuildRun,
    Tally,
    report_markdown,
    write_nonempty,
    write_report,
)


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
    """Duplicates are looked for within a group (see psyrl.dataset.quality_control)."""
    output: dict


def _judge(candidates: list[Candidate], comparison: bool, near_duplicate: float):
    """(kept records, dropped rows, tally): parse, leak rules, then duplicates, in generation
    order."""
    tally, dropped, passed = Tally(), [], []
    for c in candidates:
        cut = c.output["finish_reason"] == "length"
        try:
            pair = parse_qa(c.output["text"], want_stimulus=comparison)
            if cut and not pair.reason:  # cut before its Reason: the answer may be cut too
                raise Rejected("truncated")
        # a generation cut at max_new_tokens fails for that reason, whatever it lacks
        except Rejected as e:
            dropped.append((c, "truncated" if cut else e.reason, None))
            continue
        stimulus = pair.stimulus if comparison else c.stimulus
        reason = leak_reason(pair, stimulus, c.variable, c.value)
        if reason:
            dropped.append((c, reason, pair))
            continue
        passed.append((c, pair, stimulus))
    texts = [
        (c.group, f"{stimulus}\n{pair.question}" if comparison else pair.question)
        for c, pair, stimulus in passed
    ]
    kept = []
    for (c, pair, stimulus), reason in zip(passed, duplicate_reasons(texts, near_duplicate)):
        if reason:
            dropped.append((c, reason, pair))
            continue
        tally.add(c.variable.code, "kept")
        kept.append(
            StimuliRecord(
                id=c.id,
                stimuli=stimulus,
                question=pair.question,
                answer=pair.answer,
                variable=c.variable.code,
                dimension=c.variable.dimension,
                subdimension=c.variable.subdimension,
                reason=pair.reason or None,
            )
        )
    rows = []
    for c, reason, pair in dropped:
        tally.add(c.variable.code, reason)
        rows.append(
            {
                "id": c.id,
                "variable": c.variable.code,
                "reason": reason,
                "text": c.output["text"],
                **({"question": pair.question, "answer": pair.answer} if pair else {}),
            }
        )
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


def _finish_qa(
    run: BuildRun,
    command: str,
    catalogue,
    candidates,
    comparison: bool,
    near_duplicate: float,
    n_train: int,
    n_test: int,
    min_count: int | None,
    split_seed: int,
    summary: str,
) -> dict:
    kept, dropped, tally = _judge(candidates, comparison, near_duplicate)
    out = run.out
    split = split_by_variable(kept, n_train, n_test, split_seed, min_count)
    for name, records in (
        ("qa.jsonl", kept),
        ("dropped.jsonl", dropped),
        ("train.jsonl", split.train),
        ("test.jsonl", split.test),
    ):
        write_nonempty(out / name, records)
    minimum = n_train + n_test if min_count is None else min_count
    generated = list(dict.fromkeys(c.variable.code for c in candidates))
    # a variable with nothing kept too
    excluded = {
        code: split.excluded.get(code, 0)
        for code in generated
        if code in split.excluded or not any(r.variable == code for r in kept)
    }
    report = {
        "command": command,
        **tally.report(catalogue),
        "split": {
            "train": len(split.train),
            "test": len(split.test),
            "n_train": n_train,
            "n_test": n_test,
            "min_count": minimum,
            "seed": split_seed,
            "excluded": excluded,
        },
    }
    files = " and ".join(
        n for n, r in (("train.jsonl", split.train), ("test.jsonl", split.test)) if r
    )
    split_line = (
        f"Split (paper §4.1, {n_train} train / {n_test} test per variable, seed {split_seed}): "
        f"{len(split.train)} train, {len(split.test)} test"
        + (f" ({files})" if files else " (no file written)")
        + f"; excluded with fewer than {minimum} kept pairs: "
        + (", ".join(f"{code} ({n})" for code, n in excluded.items()) or "none")
        + "."
    )
    markdown = report_markdown(
        f"psyrl build {command}: {out}",
        f"{summary} = {report['generations']} generations: "
        f"{report['kept']} kept (qa.jsonl), {sum(report['dropped'].values())} dropped "
        f"(dropped.jsonl).\n\n{split_line}",
        report,
    )
    write_report(out, report, markdown)
    return report


def build_qa(
    run: BuildRun,
    catalogue_path,
    table_path,
    *,
    id_column: str | None = None,
    text_column: str | None = None,
    ignore_columns: Sequence[str] = (),
    near_duplicate: float = NEAR_DUPLICATE,
    n_train: int = 200,
    n_test: int = 100,
    min_count: int | None = None,
    split_seed: int = 0,
    overwrite: bool = False,
):
    """StimuliQA from a table of labelled stimuli: one dataset-generation prompt per (stimulus,
    coded variable). Returns the report on rank 0 (None on the others)."""
    catalogue = load_catalogue(catalogue_path)
    stimuli = load_labelled(table_path, catalogue, id_column, text_column, ignore_columns)
    jobs, info = [], {}
    for s in stimuli:
        for code, value in s.values.items():
            key = f"{s.id}:{code}"
            jobs.append(Job(key, prompts.dataset_prompt(catalogue[code], s.text, value)))
            info[key] = (catalogue[code], s.text, value, s.id)
    if not jobs:
        raise BuildError(
            f"{table_path}: no stimulus has a value for any variable of {catalogue_path}"
        )
    run.open("qa", {"catalogue": str(catalogue_path), "table": str(table_path)}, overwrite)
    rows = run.generate(jobs, "qa pairs")
    if not run.dist.is_main:
        return None
    return _finish_qa(
        run,
        "qa",
        catalogue,
        _candidates(jobs, rows, info),
        False,
        near_duplicate,
        n_train,
        n_test,
        min_count,
        split_seed,
        f"{len(stimuli)} stimuli, {len(jobs)} coded (stimulus, variable) prompts "
        f"x {run.sampling.samples}",
    )


def read_topics(path, catalogue: dict[str, Variable]) -> dict[str, list[str]]:
    """topics.jsonl of `psyrl build topics` (`{"variable", "topic", ...}` per line): topics by
    variable."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such topics file")
    bad = []
    numbered = read_jsonl(path, lambda row: _topic(row, catalogue), bad=bad)
    raise_line_errors(path, [f"{path}:{lineno}: {problem}" for lineno, problem in bad])
    topics: dict[str, list[str]] = {}
    for _, (code, topic) in numbered:
        topics.setdefault(code, []).append(topic)
    return topics


def _topic(row, catalogue: dict[str, Variable]) -> tuple[str, str]:
    """(variable, topic) of one topics.jsonl row; a ValueError says what is wrong with it."""
    if not isinstance(row, dict):
        raise ValueError('expected a JSON object {"variable": ..., "topic": ...}')
    try:
        code, topic = row["variable"], row["topic"]
        known = code in catalogue
    except KeyError as e:
        raise ValueError(f"missing key {e}") from None
    except TypeError as e:  # a variable that is no string: a list, an object
        raise ValueError(str(e)) from None
    if not known:
        raise ValueError(f"variable {code!r} is not in the catalogue")
    if not isinstance(topic, str) or not topic.strip():
        raise ValueError("topic must be a non-empty string")
    return code, topic.strip()


def build_comparison(
    run: BuildRun,
    catalogue_path,
    topics_path=None,
    *,
    near_duplicate: float = NEAR_DUPLICATE,
    n_train: int = 200,
    n_test: int = 100,
    min_count: int | None = None,
    split_seed: int = 0,
    dialogue: str = "one-turn",
    overwrite: bool = False,
):
    """A LlamaQA/MistralQA-style comparison set: per (variable, topic) the generator writes a
    stimulus and its QA pair. Topics from `topics_path` (psyrl build topics) or else the catalogue's
    seed topics. `dialogue`: `one-turn` sends the dataset and comparison prompts in one user turn;
    `two-turn` (appendix B's "multi-turn dialogue generation") first generates the generator's reply
    to the dataset prompt (one sample, logged under `<key>/turn-1`), then sends the comparison
    prompt as the second user turn after it."""
    if dialogue not in prompts.DIALOGUES:
        raise BuildError(f"unknown dialogue {dialogue!r}; expected one of {prompts.DIALOGUES}")
    catalogue = load_catalogue(catalogue_path)
    topics = (
        read_topics(topics_path, catalogue)
        if topics_path
        else {code: list(v.topics) for code, v in catalogue.items() if v.topics}
    )
    topic_of, info = {}, {}
    for code, variable in catalogue.items():
        for topic in dict.fromkeys(topics.get(code, []), None):  # a repeated topic once
            # by topic: adding one regenerates no other
            key = f"{code}:{prompt_sha(topic_key(topic))[:10]}"
            if key not in info:
                topic_of[key] = topic
                info[key] = (variable, "", None, code)
    if not info:
        raise BuildError(
            f"no topic to build from: {topics_path or catalogue_path} has no topic for a variable "
            f"of {catalogue_path}"
        )
    run.open(
        "comparison",
        {"catalogue": str(catalogue_path), "topics": str(topics_path or ""), "dialogue": dialogue},
        overwrite,
    )
    if dialogue == "one-turn":
        jobs = [
            Job(key, prompts.comparison_prompt(info[key][0], topic))
            for key, topic in topic_of.items()
        ]
    else:  # turn 1's assistant text is the generator's own reply: one sample per dialogue
        turns = {
            key: prompts.comparison_turns(info[key][0], topic) for key, topic in topic_of.items()
        }
        firsts = [Job(f"{key}/turn-1", first) for key, (first, _) in turns.items()]
        replies = run.generate(firsts, "comparison turn 1", samples=1)
        jobs = [
            Job(key, second, (first, replies[f"{key}/turn-1"]["outputs"][0]["text"]))
            for key, (first, second) in turns.items()
        ]
    rows = run.generate(jobs, "comparison pairs")
    if not run.dist.is_main:
        return None
    return _finish_qa(
        run,
        "comparison",
        catalogue,
        _candidates(jobs, rows, info),
        True,
        near_duplicate,
        n_train,
        n_test,
        min_count,
        split_seed,
        f"{len(jobs)} (variable, topic) prompts over "
        f"{len({k.split(':')[0] for k in info})} variables x {run.sampling.samples}"
        + (
            ""
            if dialogue == "one-turn"
            else " (two-turn dialogues, each after 1 generated reply to the dataset prompt)"
        ),
    )
