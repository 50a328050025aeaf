"""Topic expansion (appendix B): `psyrl build topics` expands each variable's seed topics with the
topic-generation prompt (appendix A.1), "up to 200 diverse topics each", the input of `psyrl build
comparison`."""

from __future__ import annotations

from psyrl.dataset import prompts
from psyrl.dataset.catalogue import load_catalogue
from psyrl.dataset.generation_log import Job
from psyrl.dataset.prompts import PAPER_TOPICS
from psyrl.dataset.qa_pairs import parse_topics, topic_key
from psyrl.dataset.run import (
    BuildError,
    BuildRun,
    Tally,
    report_markdown,
    table,
    write_nonempty,
    write_report,
)


def build_topics(
    run: BuildRun, catalogue_path, *, max_topics: int = PAPER_TOPICS, overwrite: bool = False
):
    """Expand each variable's seed topics with the topic-generation prompt (`samples` generations
    per variable): duplicates (same words as a seed or an earlier topic) dropped, at most
    `max_topics` per variable, seeds included (appendix B: 10-50 seeds, up to 200 topics)."""
    catalogue = load_catalogue(catalogue_path)
    seeded = {code: v for code, v in catalogue.items() if v.topics}
    if not seeded:
        raise BuildError(
            f"{catalogue_path}: no variable has seed topics (`topics = [...]`) to expand"
        )
    if max_topics < 1:
        raise BuildError("--max-topics must be >= 1")
    jobs = [Job(code, prompts.topic_prompt(list(v.topics))) for code, v in seeded.items()]
    run.open("topics", {"catalogue": str(catalogue_path)}, overwrite)
    rows = run.generate(jobs, "topics")
    if not run.dist.is_main:
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
                reason = (
                    "duplicate"
                    if topic_key(topic) in seen
                    else "over_cap"
                    if len(kept) >= max_topics
                    else None
                )
                tally.add(job.key, reason or "kept")
                if reason:
                    dropped.append(
                        {"variable": job.key, "sample": j, "reason": reason, "topic": topic}
                    )
                    continue
                seen.add(topic_key(topic))
                kept.append((topic, "generated"))
                new += 1
        seeds = sum(origin == "seed" for _, origin in kept)
        per_variable[job.key] = {
            "seeds": seeds,
            "generated": new,
            "topics": min(len(kept), max_topics),
        }
        lines += [
            {"variable": job.key, "topic": t, "origin": origin} for t, origin in kept[:max_topics]
        ]
    write_nonempty(run.out / "topics.jsonl", lines)
    write_nonempty(run.out / "dropped.jsonl", dropped)
    report = {
        "command": "topics",
        "max_topics": max_topics,
        **tally.report(catalogue),
        "topics": per_variable,
    }
    skipped = sorted(set(catalogue) - set(seeded))
    markdown = report_markdown(
        f"psyrl build topics: {run.out}",
        f"{len(jobs)} variables with seed topics x {run.sampling.samples} generations; candidate "
        f"topic lines counted below (kept = new topics in topics.jsonl, at most {max_topics} per "
        "variable with the seeds)."
        + (f" Without seed topics, not expanded: {', '.join(skipped)}." if skipped else ""),
        report,
    )
    markdown += (
        "\n## Topics per variable\n\n"
        + table(
            ["variable", "seeds", "generated", "topics"],
            [[code, b["seeds"], b["generated"], b["topics"]] for code, b in per_variable.items()],
        )
        + "\n"
    )
    write_report(run.out, report, markdown)
    return report
