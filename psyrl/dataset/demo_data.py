"""A SYNTHETIC StimuliQA-format demo set (SPEC §6): deterministic, template-generated, for the CPU
demo and tests.

The real StimuliQA is private (paper, ethics statement). This module writes a small set in its
format: 18 kept variables (3 per Table 2 subdimension) x 60 items, split 40/20 by the paper's §4.1
rule (`psyrl.core.records.split_by_variable`), 2 low-frequency variables that the rule excludes, and
20 fresh multiple-choice items per kept variable in the benchmark schema. Every gold answer follows
from the cue event in the story through a fixed mapping (psyrl/assets/demo_templates.json), so a
tiny model can learn it. Not psychologically validated; not the paper's data.
"""

from __future__ import annotations

import importlib.resources
import json
import random
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from psyrl.core.records import (
    SUBDIMENSIONS,
    BenchmarkRecord,
    StimuliRecord,
    split_by_variable,
    write_jsonl,
)

# per variable; rare variables fall under the split's minimum
N_TRAIN, N_TEST, N_MC, N_RARE = 40, 20, 20, 10
MIN_WORDS, MAX_WORDS = 30, 70  # stimuli length, like the paper's Table 9/10 examples
P_FILLER, P_REACTION = 0.6, 0.7
FILES = ("train.jsonl", "test.jsonl", "mc.jsonl", "README.md")


@dataclass(frozen=True)
class DemoSet:
    seed: int
    train: list[StimuliRecord]
    test: list[StimuliRecord]
    mc: list[BenchmarkRecord]
    excluded: dict[str, int]
    """variable -> item count, for the variables the split rule dropped."""
    variables: list[dict]
    """The template variables the set was generated from, in generation order (for the README
    table)."""


def load_templates() -> dict:
    """The template tables, read fresh from psyrl/assets/demo_templates.json (plain JSON; nothing is
    cached).

    Keys: `names`, `cities`, `origins`, `times`, `places` (slot fillers), `openers` and `fillers`
    (by opener kind), `reasoning` (by length: {gist}/{Gist} is the cue event, {lead} the conclusion
    clause) and `variables`, in generation order (the split sorts by code, so the order only fixes
    the random draws). Each variable: `code`, `subdimension` (a key of
    psyrl.core.records.SUBDIMENSIONS), `description`, optional `rare` (a low-frequency variable that
    the split rule excludes), `opener`, `reasoning`, `questions`, optional shared `reactions`, and
    `answers`: each with the gold `answer`, a `lead` clause the reasoning ends on (never the answer
    itself), optional own `reactions`, and `events` as [sentence, gist] pairs. Slots: {name},
    {city}, {origin}; openers also {time}, {Time}, {place}.
    """
    path = importlib.resources.files("psyrl") / "assets" / "demo_templates.json"
    return json.loads(path.read_text(encoding="utf-8"))


def _cap(text: str) -> str:
    return text[:1].upper() + text[1:]


def _story(t: dict, var: dict, ans: dict, rng: random.Random, seen: set[str]) -> tuple[str, str]:
    """A fresh first-person story (never in `seen`) carrying one cue event of `ans`, and that
    event's gist."""
    for _ in range(1000):
        event, gist = rng.choice(ans["events"])
        time = rng.choice(t["times"])
        slots = {
            "name": rng.choice(t["names"]),
            "city": rng.choice(t["cities"]),
            "origin": rng.choice(t["origins"]),
            "place": rng.choice(t["places"]),
            "Time": time,
            "time": time[:1].lower() + time[1:],
        }
        sentences = [rng.choice(t["openers"][var["opener"]]), _cap(event) + "."]
        if rng.random() < P_FILLER:
            sentences.insert(rng.choice((1, 2)), rng.choice(t["fillers"][var["opener"]]))
        if rng.random() < P_REACTION:
            sentences.append(rng.choice(ans.get("reactions") or var["reactions"]))
        text = " ".join(s.format(**slots) for s in sentences)
        if MIN_WORDS <= len(text.split()) <= MAX_WORDS and text not in seen:
            seen.add(text)
            return text, gist.format(**slots)
    raise RuntimeError(
        f"{var['code']}: no fresh story of {MIN_WORDS}-{MAX_WORDS} words in 1000 draws"
    )


def _item(
    t: dict, var: dict, index: int, rng: random.Random, seen: set[str]
) -> tuple[str, str, str, str]:
    """(stimuli, question, answer, reasoning) for item `index`; answers cycle so each variable stays
    balanced."""
    ans = var["answers"][index % len(var["answers"])]
    stimuli, gist = _story(t, var, ans, rng, seen)
    question = rng.choice(var["questions"])
    reasoning = rng.choice(t["reasoning"][var["reasoning"]]).format(
        gist=gist, Gist=_cap(gist), lead=ans["lead"]
    )
    return stimuli, question, ans["answer"], reasoning


def generate(seed: int = 0) -> DemoSet:
    """The whole demo set for `seed`: pure and deterministic (one `random.Random(seed)`, fixed table
    order)."""
    t = load_templates()
    rng = random.Random(seed)
    seen: set[str] = set()  # membership only: every story in the set is distinct
    pool = []
    for var in t["variables"]:
        sub = var["subdimension"]
        for i in range(N_RARE if var.get("rare") else N_TRAIN + N_TEST):
            stimuli, question, answer, reasoning = _item(t, var, i, rng, seen)
            pool.append(
                StimuliRecord(
                    f"demo/{var['code']}/{i + 1:04d}",
                    stimuli,
                    question,
                    answer,
                    var["code"],
                    SUBDIMENSIONS[sub],
                    sub,
                    reasoning,
                )
            )
    split = split_by_variable(pool, n_train=N_TRAIN, n_test=N_TEST, seed=seed)
    mc = []
    for var in t["variables"]:
        if var["code"] in split.excluded:
            continue
        answers = [a["answer"] for a in var["answers"]]
        meta = {"variable": var["code"], "dimension": SUBDIMENSIONS[var["subdimension"]]}
        for i in range(N_MC):
            stimuli, question, answer, _ = _item(t, var, i, rng, seen)
            options = [answer, *rng.sample([a for a in answers if a != answer], 3)]
            rng.shuffle(options)
            mc.append(
                BenchmarkRecord(
                    f"demo/mc/{var['code']}/{i + 1:04d}",
                    "demo",
                    var["subdimension"],
                    stimuli,
                    question,
                    tuple(options),
                    options.index(answer),
                    answer,
                    dict(meta),
                )
            )
    return DemoSet(seed, split.train, split.test, mc, dict(split.excluded), t["variables"])


# ---------------------------------------------------------------- files
def _range(values: list[int]) -> str:
    return f"{min(values)}-{max(values)}" if values else "-"


def render_readme(demo: DemoSet) -> str:
    """data/demo/README.md, generated with the data so that counts and tables cannot drift from
    it."""
    n_train, n_test, n_mc = (
        Counter(r.variable for r in demo.train),
        Counter(r.variable for r in demo.test),
        Counter(r.meta["variable"] for r in demo.mc),
    )
    records = demo.train + demo.test
    words = [len(r.stimuli.split()) for r in records] + [len(r.context.split()) for r in demo.mc]
    excluded = ", ".join(f"`{v}` ({n} items)" for v, n in demo.excluded.items())
    lines = [
        "# data/demo: a SYNTHETIC StimuliQA-format set (not the paper's data)",
        "",
        "**This data is synthetic.** Every line was generated from templates by "
        "`psyrl/dataset/demo_data.py` (tables in",
        "`psyrl/assets/demo_templates.json`). It is **not** the paper's StimuliQA (which is "
        "private), it is **not**",
        "psychologically validated, and it is for the CPU demo and the tests only. Each gold "
        "answer follows from",
        "a cue event in the story through a fixed template mapping, so that a tiny model can learn "
        "it in minutes;",
        "a score on this set says nothing about psychological reasoning.",
        "",
        "## How it was generated",
        "",
        "```",
        f"psyrl demo-data --out data/demo --seed {demo.seed}",
        "```",
        "",
        "Deterministic (one `random.Random(seed)`). `tests/dataset/test_demo_data.py` regenerates "
        "the set and compares",
        "every file here byte for byte: change the templates and re-run the command, never edit "
        "these files.",
        "",
        f"A story is 2-4 first-person sentences ({_range(words)} words here): an opener (time, "
        "place, city), the",
        "cue event of the gold answer, then, at random, a neutral filler sentence and a reaction "
        "sentence;",
        "names, cities, countries, times and places are drawn at random. The question is one of "
        "2-3 phrasings",
        "per variable. The reasoning (1-2 sentences) names the cue event and ends on a conclusion "
        "that is not",
        "the answer text; its length depends on the variable (column `reasoning words` below).",
        "",
        "## Files",
        "",
        "| file | lines | content |",
        "| --- | ---: | --- |",
        f"| `train.jsonl` | {len(demo.train)} | StimuliQA records, {N_TRAIN} per kept variable |",
        f"| `test.jsonl` | {len(demo.test)} | StimuliQA records, {N_TEST} per kept variable |",
        f"| `mc.jsonl` | {len(demo.mc)} | multiple choice (benchmark schema), {N_MC} fresh items "
        "per kept variable |",
        "",
        "## Split rule (paper section 4.1, `psyrl.core.records.split_by_variable`)",
        "",
        f"{N_TRAIN + N_TEST} items are generated per kept variable and {N_RARE} per low-frequency "
        "variable; the rule",
        f"takes a seeded sample of {N_TRAIN} train and {N_TEST} test items per variable (seed "
        f"{demo.seed}) and",
        f"excludes every variable with fewer than {N_TRAIN + N_TEST} items: {excluded or 'none'}, "
        "as the paper",
        "excludes C_acol, C_agov, C_anet and C_apol. `mc.jsonl` holds further stories, never in "
        "train or test;",
        "its 3 distractors are other answers of the same variable, and the options are shuffled.",
        "",
        "## Variables",
        "",
        "| code | dimension | subdimension | description | answers | reasoning words | train | "
        "test | mc |",
        "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for var in demo.variables:
        code = var["code"]
        answers = "; ".join(a["answer"] for a in var["answers"])
        reasoning_words = _range([len(r.reasoning.split()) for r in records if r.variable == code])
        sub = var["subdimension"]
        status = f" **(excluded: {demo.excluded[code]} items)**" if code in demo.excluded else ""
        lines.append(
            f"| `{code}` | {SUBDIMENSIONS[sub]} | {sub} | {var['description']}{status} | {answers} "
            f"| {reasoning_words} | {n_train[code]} | {n_test[code]} | {n_mc[code]} |"
        )
    lines += [
        "",
        "## Schema",
        "",
        "`train.jsonl`, `test.jsonl`: one StimuliQA record per line (SPEC section 6, "
        "`psyrl.core.records.StimuliRecord`):",
        "`id` (`demo/<variable>/<0001>`), `stimuli`, `question`, `answer`, `variable`, "
        "`dimension`,",
        "`subdimension`, `reasoning`.",
        "",
        "`mc.jsonl`: one record per line in the benchmark schema of `data/benchmarks/README.md`",
        "(`psyrl.core.records.BenchmarkRecord`): `id` (`demo/mc/<variable>/<0001>`), `benchmark` "
        "(`demo`), `task` (the",
        "subdimension), `context` (the story), `question`, `options` (4), `answer_index` "
        "(0-based), `answer`",
        "(= `options[answer_index]`), `meta` (`variable`, `dimension`).",
        "",
    ]
    return "\n".join(lines)


def write(demo: DemoSet, out_dir: Path) -> dict:
    """Write train.jsonl, test.jsonl, mc.jsonl and README.md into `out_dir`; returns {file: line
    count}."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_jsonl(out_dir / "train.jsonl", demo.train)
    write_jsonl(out_dir / "test.jsonl", demo.test)
    write_jsonl(out_dir / "mc.jsonl", demo.mc)
    readme = render_readme(demo)
    (out_dir / "README.md").write_text(readme, encoding="utf-8")
    return {
        "train.jsonl": len(demo.train),
        "test.jsonl": len(demo.test),
        "mc.jsonl": len(demo.mc),
        "README.md": readme.count("\n"),
    }
