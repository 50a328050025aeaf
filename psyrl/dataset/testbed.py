"""A SYNTHETIC testbed where reasoning length matters (issue 43): `mood drift`, in StimuliQA format.

Each item: the narrator starts at a stated mood on an ordered scale of 7 words (LEVELS), then k
events happen in order (k = 1, 2, 3), each a sentence from a fixed bank (EVENTS) with a signed
shift of -2, -1, +1 or +2 levels; after each event the mood is clamped to the scale. The question
asks how the narrator feels at the end; the gold answer is the final mood word.

Why the scratchpad matters for k > 1: a direct answer has to combine k signed shifts, each clamped
in turn, in one forward pass; with the think text each step is one local lookup (the running level
written just before, and this event's shift). The SFT reasoning says so: short for k = 1 ("Calm,
then the job offer: happy."), one clause per event naming the running level for k > 1 ("Calm to
start. The cancelled dinner: uneasy. The job offer: happy."), ending on the answer word as a worked
computation does.

Sampling: for each k, every (start, event sequence) combination is enumerated and grouped by its
final level; a seeded quarter of each group is held out, so train and test never share a
combination. Every answer is equally frequent (TRAIN_PER_ANSWER, TEST_PER_ANSWER per level), and
within an answer the combinations are drawn uniformly, so neither the start nor the last event
alone determines the answer for k > 1 (`shortcut_baselines` measures it; the README written with
the data prints it). Deterministic: one `random.Random` per (seed, k), fixed table order.
Not psychologically validated; not the paper's data.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from psyrl.core.records import StimuliRecord, write_jsonl

TASKS = ("drift", "swing", "choice")
"""The testbed tasks `psyrl demo-data --task` writes (beside the demo set, `demo`): `drift`, the
signed shifts alone; `swing`, the same with mood swings among the events (SWINGS); `choice`, swing's
items with reasoning at two lengths at every k (FORMS), so that a model can answer at either."""

# the ordered mood scale: single common words, each its own token set under eq. 5's normalisation,
# and distinct first tokens under psyrl's tiny tokenizer (with and without a leading space)
LEVELS = ("miserable", "sad", "uneasy", "calm", "content", "happy", "elated")


@dataclass(frozen=True)
class Event:
    sentence: str  # follows a connective: "Then my friend cancelled our dinner."
    gist: str  # the reasoning's name for it: "the cancelled dinner"
    shift: int  # signed levels (0 for a swing)
    swing: bool = False  # the mood turns to its mirror on the scale: miserable <-> elated, ...


EVENTS: tuple[Event, ...] = (
    # +2
    Event("I got the job I wanted", "the job offer", 2),
    Event("my sister told me she is expecting a baby", "the baby news", 2),
    Event("I won first prize in the photo contest", "the prize", 2),
    Event("an old friend surprised me with a visit", "the surprise visit", 2),
    Event("I passed my driving test", "the driving test", 2),
    Event("the doctor said my mother is healthy again", "my mother's health", 2),
    # +1
    Event("a stranger held the door for me", "the kind stranger", 1),
    Event("the sun came out", "the sunshine", 1),
    Event("I found a coin on the pavement", "the found coin", 1),
    Event("my neighbour gave me fresh bread", "the fresh bread", 1),
    Event("my favourite song came on the radio", "the favourite song", 1),
    Event("a colleague thanked me for my help", "the colleague's thanks", 1),
    # -1
    Event("I missed my bus", "the missed bus", -1),
    Event("my friend cancelled our dinner", "the cancelled dinner", -1),
    Event("it started to rain on my walk", "the rain", -1),
    Event("I spilled coffee on my shirt", "the spilled coffee", -1),
    Event("my phone battery died", "the dead phone", -1),
    Event("the shop had closed early", "the closed shop", -1),
    # -2
    Event("my dog ran away", "the lost dog", -2),
    Event("I failed my final exam", "the failed exam", -2),
    Event("my landlord told me to move out", "the eviction", -2),
    Event("my best friend stopped talking to me", "the broken friendship", -2),
    Event("I lost my wallet with all my money", "the lost wallet", -2),
    Event("my grandmother was taken to hospital", "the hospital news", -2),
)
# a swing mirrors the mood on the scale (sad <-> happy; calm stays calm): no sum of per-event
# effects gives the answer once a swing follows other events, so a direct answer cannot add shifts
SWINGS: tuple[Event, ...] = (
    Event("my mood swung to its opposite, as it often does", "the mood swing", 0, True),
    Event("out of nowhere my feelings flipped around", "the sudden flip", 0, True),
    Event("I saw the whole day the other way round", "the new view", 0, True),
    Event("my feelings turned upside down for no reason", "the upturn", 0, True),
    Event("a strange reversal came over me", "the reversal", 0, True),
    Event("everything I felt switched to its opposite", "the switch", 0, True),
)
ALL_EVENTS = EVENTS + SWINGS  # an item's events index this table in either task
BANKS = {"drift": range(len(EVENTS)), "swing": range(len(ALL_EVENTS))}
BANKS["choice"] = BANKS["swing"]
DEFAULT_DIRS = {  # the committed copies
    "drift": "data/testbed",
    "swing": "data/testbed-swing",
    "choice": "data/testbed-choice",
}
OPENERS = (
    "I woke up feeling {mood}.",
    "This morning I felt {mood}.",
    "I started the day {mood}.",
    "At breakfast I felt {mood}.",
)
FIRST = ("Then", "Soon", "Before noon")  # the first event's connective
LATER = ("Later", "After that", "In the afternoon", "That evening")  # the others', in this order
QUESTIONS = (
    "How do I feel at the end of the day?",
    "How am I feeling now?",
    "What is my mood at the end?",
    "How do I feel after all of this?",
)
KS = (1, 2, 3)
# per k and answer, so that every answer is equally frequent at every level (7 x 85 = 595 train,
# 7 x 25 = 175 test per level): enough for a from-scratch tiny model to learn the 24 shifts and the
# clamp in a few hundred SFT steps, and a held-out split whose per-level F1 has intervals of a few
# points over 3 seeds, evaluated in well under a minute per level on a CPU
TRAIN_PER_ANSWER, TEST_PER_ANSWER = 85, 25
TEST_FRACTION = 0.25  # of each answer's combinations, held out
# choice's two reasoning forms per level, the first each level's one in drift and swing: at k = 1
# the short step or a padded one as long as a k = 3 walk; at k > 1 the walk or a terse jump to the
# answer as short as the k = 1 step (a guess the model must make in one pass, as a direct answer)
FORMS = {1: ("short", "padded"), 2: ("full", "terse"), 3: ("full", "terse")}
FILES = ("train.jsonl", "test.jsonl", *(f"test-k{k}.jsonl" for k in KS), "README.md")


def step(level: int, event: Event) -> int:
    """The mood after one event: mirrored by a swing, else shifted and clamped to the scale."""
    top = len(LEVELS) - 1
    return top - level if event.swing else min(top, max(0, level + event.shift))


def running_levels(start: int, events: Sequence[int]) -> list[int]:
    """The running levels after each event (indices into ALL_EVENTS), each step clamped (the last
    one is the answer's)."""
    levels, level = [], start
    for e in events:
        level = step(level, ALL_EVENTS[e])
        levels.append(level)
    return levels


def op(e: int) -> int | str:
    """What an event does to the mood, as a key: its shift, or "swing"."""
    return "swing" if ALL_EVENTS[e].swing else ALL_EVENTS[e].shift


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


@dataclass(frozen=True)
class DriftItem:
    """One generated item and the facts it was made from (what the tests and baselines read)."""

    record: StimuliRecord
    k: int
    split: str  # train | test
    start: int  # index into LEVELS
    events: tuple[int, ...]  # indices into ALL_EVENTS, in story order
    levels: tuple[int, ...]  # the running level after each event; levels[-1] is the answer's
    form: str  # the reasoning's form, one of FORMS[k]


def reasoning_text(start: int, events: Sequence[int], form: str | None = None) -> str:
    """The SFT think text in `form` (default: the level's first, drift's and swing's): `short`,
    one clause (k = 1); `full`, one clause per event naming the running level (k > 1); `padded`,
    the k = 1 step walked and a closing clause; `terse`, the start and the final level only."""
    levels = running_levels(start, events)
    form = form or FORMS[len(events)][0]
    if form not in FORMS[len(events)]:
        raise ValueError(f"no {form!r} reasoning for {len(events)} events: {FORMS[len(events)]}")
    mood, end = _cap(LEVELS[start]), LEVELS[levels[-1]]
    if form == "short":
        return f"{mood}, then {ALL_EVENTS[events[0]].gist}: {end}."
    if form == "terse":
        return f"{mood} to start; at the end: {end}."
    steps = [f"{_cap(ALL_EVENTS[e].gist)}: {LEVELS[lv]}." for e, lv in zip(events, levels)]
    if form == "padded":
        steps.append(f"Nothing else happens, so at the end I still feel: {end}.")
    return " ".join([f"{mood} to start.", *steps])


def _story(start: int, events: Sequence[int], rng: random.Random) -> str:
    later = [LATER[i] for i in sorted(rng.sample(range(len(LATER)), len(events) - 1))]
    connectives = [rng.choice(FIRST), *later]
    sentences = [rng.choice(OPENERS).format(mood=LEVELS[start])]
    sentences += [f"{c} {ALL_EVENTS[e].sentence}." for c, e in zip(connectives, events)]
    return " ".join(sentences)


def combinations(k: int, task: str = "drift") -> dict[int, list[tuple[int, tuple[int, ...]]]]:
    """Every (start, event sequence) of k events of the task's bank, grouped by its final level, in
    a fixed order."""
    groups: dict[int, list] = {level: [] for level in range(len(LEVELS))}
    for start in range(len(LEVELS)):
        for events in itertools.product(BANKS[task], repeat=k):
            answer = running_levels(start, events)[-1]
            groups[answer].append((start, events))
    return groups


def split_key(start: int, events: Sequence[int]) -> tuple:
    """What train and test never share. For k = 1 the (start, event): every (start, shift) step is
    taught, in other events' words. For k > 1 the (start, shift sequence): a held-out item is a new
    combination of taught steps, not a new wording of a taught combination, so that a model cannot
    answer it from a memorised table of (start, shifts) -> answer, only by combining the steps."""
    if len(events) == 1:
        return (start, events[0])
    return (start, *(op(e) for e in events))


def _level_items(k: int, seed: int, task: str = "drift") -> list[DriftItem]:
    """Train then test items of level k: disjoint combinations, each answer equally frequent."""
    rng = random.Random(f"testbed:{task}:{seed}:k{k}")
    pools: dict[str, list] = {"train": [], "test": []}
    for combos in combinations(k, task).values():
        groups: dict[tuple, list] = {}
        for start, events in combos:
            groups.setdefault(split_key(start, events), []).append((start, events))
        keys = list(groups)
        rng.shuffle(keys)
        held = math.ceil(TEST_FRACTION * len(keys))
        # one pool per answer, in level order
        pools["test"].append([c for key in keys[:held] for c in groups[key]])
        pools["train"].append([c for key in keys[held:] for c in groups[key]])
    items, seen = [], set()
    for split, per_answer in (("train", TRAIN_PER_ANSWER), ("test", TEST_PER_ANSWER)):
        chosen = []
        for pool in pools[split]:
            # distinct combinations while the pool lasts, then each again with another wording
            order = rng.sample(pool, min(per_answer, len(pool)))
            chosen += [order[i % len(order)] for i in range(per_answer)]
        rng.shuffle(chosen)
        for start, events in chosen:
            for _ in range(1000):
                stimuli = _story(start, events, rng)
                if stimuli not in seen:
                    break
            else:
                raise RuntimeError(f"{task} k={k}: no fresh wording of {start}, {events}")
            seen.add(stimuli)
            levels = tuple(running_levels(start, events))
            record = StimuliRecord(
                id=f"testbed/{task}-k{k}/{len(items) + 1:04d}",
                stimuli=stimuli,
                question=rng.choice(QUESTIONS),
                answer=LEVELS[levels[-1]],
                variable=f"{task}_k{k}",
                reasoning=reasoning_text(start, events),
            )
            form = FORMS[k][0]
            items.append(DriftItem(record, k, split, start, tuple(events), levels, form))
    return items


def _with_forms(items: list[DriftItem], seed: int) -> list[DriftItem]:
    """swing's items as choice's: new ids and variable, and in each (k, split) a seeded half of the
    items (exactly, rounded down) with the level's second reasoning form."""
    out = list(items)
    for k in KS:
        for split in ("train", "test"):
            rng = random.Random(f"testbed:choice:{seed}:k{k}:{split}")
            where = [n for n, i in enumerate(items) if i.k == k and i.split == split]
            second = set(rng.sample(where, len(where) // 2))
            for n in where:
                i, form = items[n], FORMS[k][n in second]
                record = dataclasses.replace(
                    i.record,
                    id=i.record.id.replace("testbed/swing-", "testbed/choice-"),
                    variable=f"choice_k{k}",
                    reasoning=reasoning_text(i.start, i.events, form),
                )
                out[n] = dataclasses.replace(i, record=record, form=form)
    return out


@dataclass(frozen=True)
class Testbed:
    task: str
    seed: int
    items: list[DriftItem]

    def records(self, split: str, k: int | None = None) -> list[StimuliRecord]:
        return [i.record for i in self.items if i.split == split and (k is None or i.k == k)]


def generate(task: str = "drift", seed: int = 0) -> Testbed:
    """The whole testbed of `task` for `seed`: pure and deterministic."""
    if task not in TASKS:
        raise ValueError(f"unknown testbed task {task!r}; expected one of {', '.join(TASKS)}")
    if task == "choice":  # swing's items, stories and all; only the reasoning differs
        return Testbed(task, seed, _with_forms(generate("swing", seed).items, seed))
    return Testbed(task, seed, [item for k in KS for item in _level_items(k, seed, task)])


# ---------------------------------------------------------------- shortcut baselines
def _shifts(item: DriftItem) -> tuple[int | str, ...]:
    return tuple(op(e) for e in item.events)


SHORTCUTS = {
    "majority": lambda i: (),
    "start only": lambda i: (i.start,),
    "last event only": lambda i: _shifts(i)[-1:],
    "start + last event": lambda i: (i.start, *_shifts(i)[-1:]),
    "events without the start": _shifts,
}
"""A shortcut reads these facts of an item (an event as its shift, so that a table fitted on the
training combinations applies to the held-out ones); its baseline is the best lookup table from them
to an answer, fitted on the training split (the most frequent answer per key, ties to the lower
level; a key unseen in training gets the overall most frequent answer) and scored on the test split
of the same level. `start + last event` is the whole item for k = 1."""


def shortcut_baselines(items: Sequence[DriftItem]) -> dict[int, dict[str, float]]:
    """k -> shortcut -> accuracy (exact match, = F1 for one-word answers) on the test split of k."""
    out = {}
    for k in sorted({i.k for i in items}):
        train = [i for i in items if i.k == k and i.split == "train"]
        test = [i for i in items if i.k == k and i.split == "test"]
        out[k] = {}
        for name, key in SHORTCUTS.items():
            counts: dict[tuple, Counter] = {}
            for i in train:
                counts.setdefault(key(i), Counter())[i.levels[-1]] += 1
            overall = Counter(i.levels[-1] for i in train)

            def best(c: Counter) -> int:
                return min(c, key=lambda level: (-c[level], level))

            table = {key_: best(c) for key_, c in counts.items()}
            fallback = best(overall)
            hits = sum(table.get(key(i), fallback) == i.levels[-1] for i in test)
            out[k][name] = hits / len(test)
    return out


# ---------------------------------------------------------------- files
TITLES = {
    "drift": "mood drift",
    "swing": "mood swing",
    "choice": "mood swing, two reasoning lengths",
}


def _forms_section(bed: Testbed) -> list[str]:
    """choice's README paragraph: the two reasoning forms per level, with an example and counts."""
    rows = []
    for k in KS:
        for form in FORMS[k]:
            items = [i for i in bed.items if i.k == k and i.form == form]
            words = [len(i.record.reasoning.split()) for i in items]
            train = sum(i.split == "train" for i in items)
            rows.append(
                f"| {k} | {form} | {items[0].record.reasoning} | {train} | {len(items) - train} "
                f"| {min(words)}-{max(words)} |"
            )
    return [
        "## Two reasoning lengths at every level",
        "",
        "The stories, questions and answers are those of `psyrl demo-data --task swing` with the",
        "same seed; only the reasoning differs. In each level and split a seeded half of the items",
        "has the level's second form: at k = 1 a padded step (as long as a k = 3 walk) instead of",
        "the short one, at k > 1 a terse jump from the start to the answer (as short as the k = 1",
        "step) instead of the walk. Every form ends on the answer word, so a model trained on it",
        "can answer every level at either length: a terse answer to k > 1 is a guess made in one",
        "pass, as a direct answer is; a padded answer to k = 1 is as right as a short one.",
        "",
        "| k | form | example | train | test | reasoning words |",
        "| --- | --- | --- | ---: | ---: | ---: |",
        *rows,
        "",
    ]


def render_readme(bed: Testbed) -> str:
    """The output directory's README.md, generated with the data so that counts cannot drift."""
    baselines = shortcut_baselines(bed.items)
    several = [baselines[k] for k in KS if k > 1]
    single = 100 * max(b[n] for b in several for n in ("start only", "last event only"))
    pair = 100 * max(max(b.values()) for b in several)
    header = "| k | " + " | ".join(SHORTCUTS) + " |"
    rows = [header, "| --- |" + " ---: |" * len(SHORTCUTS)]
    rows += [
        f"| {k} | " + " | ".join(f"{100 * v:.1f}" for v in baselines[k].values()) + " |" for k in KS
    ]
    words = {k: [len(i.record.reasoning.split()) for i in bed.items if i.k == k] for k in KS}
    counts = [
        f"| k = {k} | `{bed.task}_k{k}` | {len(bed.records('train', k))} | "
        f"{len(bed.records('test', k))} | {min(words[k])}-{max(words[k])} |"
        for k in KS
    ]
    bank = [ALL_EVENTS[e] for e in BANKS[bed.task]]
    events = [
        f"| {e.shift:+d} | {e.sentence} | {e.gist} |"
        for shift in (2, 1, -1, -2)
        for e in bank
        if e.shift == shift and not e.swing
    ]
    events += [f"| swing | {e.sentence} | {e.gist} |" for e in bank if e.swing]
    swing = bed.task != "drift"
    lines = [
        f"# A SYNTHETIC testbed: {TITLES[bed.task]} (issue 43)",
        "",
        "**This data is synthetic.** Every line was generated by `psyrl/dataset/testbed.py` from a",
        f"fixed table of {len(bank)} events and 7 mood words. It is **not** the paper's StimuliQA, "
        "**not**",
        "psychologically validated, and a score on it says nothing about psychological reasoning.",
        "It is a task where reasoning length matters: the design is in `docs/testbed.md`.",
        "",
        "## How it was generated",
        "",
        "```",
        f"psyrl demo-data --task {bed.task} --out {DEFAULT_DIRS[bed.task]} --seed {bed.seed}",
        "```",
        "",
        "Deterministic: the same seed writes the same bytes (`tests/dataset/test_testbed.py`",
        "regenerates the committed copy and compares it).",
        "",
        "The narrator starts at a mood on the scale",
        "",
        "    " + " < ".join(LEVELS),
        "",
        "then k events happen in order (k = 1, 2, 3), each shifting the mood by -2, -1, +1 or +2",
        "levels (the table below), clamped to the scale after each event"
        + (
            "; a swing (a fifth of the events)\nturns the mood to its mirror on the scale (sad <->"
            " happy, calm stays calm)."
            if swing
            else "."
        ),
        "The question asks how the narrator feels at the end; the answer is the final mood word.",
        "For each k every (start, event sequence) is enumerated and grouped by its answer; a",
        f"seeded {TEST_FRACTION:.0%} of each group's step sequences (for k = 1 the (start, event); "
        "for k > 1",
        "the (start, shift-or-swing sequence)) is held out, so a test item is a new combination of",
        "steps, never a seen one in other words. Each answer is equally",
        f"frequent ({TRAIN_PER_ANSWER} train and {TEST_PER_ANSWER} test items per answer and k).",
        "Combinations are drawn uniformly within an answer, each once while they last (k = 1 has",
        f"only {len(LEVELS) * len(bank)}, so each comes back with another wording). Openers, "
        "connectives and questions",
        "are drawn at random; no two stories are the same.",
        "",
        "| shift | event (after a connective: Then, Later, ...) | in the reasoning |",
        "| ---: | --- | --- |",
        *events,
        "",
        *(_forms_section(bed) if bed.task == "choice" else []),
        "## Files",
        "",
        "| level | variable | train | test | reasoning words |",
        "| --- | --- | ---: | ---: | ---: |",
        *counts,
        "",
        "`train.jsonl` holds every level's training items, `test.jsonl` every level's test items",
        "(the trainers' `data.valid_file`); `test-k1.jsonl`, `test-k2.jsonl`, `test-k3.jsonl` hold",
        "the same test items by level, so that an evaluation reports each level as its own",
        'benchmark (an experiment table with `columns = "benchmarks"`). Records are StimuliQA',
        f"(`psyrl.core.records.StimuliRecord`): `id` (`testbed/{bed.task}-k<k>/<0001>`), "
        "`stimuli`,",
        f"`question`, `answer`, `variable` (`{bed.task}_k<k>`), `reasoning` (the SFT think text, "
        "which",
        "ends on the answer word); no `dimension` or `subdimension` (none of the paper's six",
        "fits; evaluations group these items by file instead).",
        "",
        "## Shortcut baselines (test accuracy %, exact match = F1)",
        "",
        "The best lookup table from the named facts to an answer, fitted on `train.jsonl` and",
        "scored on the test items of the same level; an event is read as its shift, so that a",
        "table fitted on the training combinations applies to the held-out ones. With k = 1 the",
        "start and the one event determine the answer. For k > 1 no single fact does (at most",
        f"{single:.1f} here), and the best partial combination (the start with the last event, or",
        f"all the events without the start) reaches {pair:.1f}: better than one fact because the",
        "scale's ends clamp.",
        "",
        *rows,
        "",
    ]
    return "\n".join(lines)


def _line(record: StimuliRecord) -> dict:
    """A record as its JSON line: the empty `dimension` and `subdimension` left out (none of the
    paper's fits, and the loader takes them as optional), so no file says a label it does not
    have."""
    return {
        k: v
        for k, v in dataclasses.asdict(record).items()
        if not (k in ("dimension", "subdimension") and not v) and v is not None
    }


def write(bed: Testbed, out_dir: Path) -> dict:
    """Write FILES into `out_dir`; returns {file: line count}."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {"train.jsonl": bed.records("train"), "test.jsonl": bed.records("test")}
    files.update({f"test-k{k}.jsonl": bed.records("test", k) for k in KS})
    for name, records in files.items():
        write_jsonl(out_dir / name, [_line(r) for r in records])
    readme = render_readme(bed)
    (out_dir / "README.md").write_text(readme, encoding="utf-8")
    return {
        **{name: len(records) for name, records in files.items()},
        "README.md": readme.count("\n"),
    }
