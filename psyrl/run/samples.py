"""A T-GRPO step's samples as files a person reads: `samples/step-N.jsonl` (every response of the
step with its reward components and advantage) and `samples/step-N.md` (the first prompts of the
step with their stories, gold answers and responses). `psyrl report` reads the JSONL back; this
module imports no torch, so neither does the report."""

from __future__ import annotations

import json
import re
from pathlib import Path

from psyrl.core.atomic import write_text

# the reward components as SPEC §2 names them, in table order; a reward variant has a subset
COLUMNS = {
    "f1": "F1",
    "fmt": "format",
    "rep": "rep. penalty",
    "br": "BR",
    "len": "length",
    "short": "short",
    "overlong": "overlong",
    "final": "final",
}


def columns(keys) -> dict[str, str]:
    """COLUMNS present in `keys`, then each accuracy signal computed beside them (reward.accuracy,
    .mix, .log_accuracy: `accuracy/<name>`), in that order."""
    shown = {k: name for k, name in COLUMNS.items() if k in keys}
    signals = sorted(k for k in keys if k.startswith("accuracy/"))
    return shown | {k: f"acc. {k.removeprefix('accuracy/')}" for k in signals}


# the step means the Markdown's header repeats, from the step's metrics.jsonl row
MEANS = (
    ("final", "reward/final"),
    ("F1", "reward/f1"),
    ("format", "reward/format"),
    ("length", "response/length"),
)


def sample_rows(samples: list, components: dict, advantages) -> list[dict]:
    """The rows of samples/step-N.jsonl: per response of the step (`psyrl.rl.scoring.Sample`, in
    step order) its id, index in its group, text, tokens and finish reason, the reward components of
    COLUMNS its variant has (`components`: name -> one value per response), its advantage, and each
    value of `Sample.extra` (every accuracy signal computed beside r_F1, plug-in components)."""
    keys = [k for k in COLUMNS if k in components]
    return [
        {
            "id": s.id,
            "sample": s.index,
            "response": s.text,
            "tokens": s.length,
            "finish_reason": s.finish_reason,
            **{k: float(components[k][n]) for k in keys},
            "advantage": float(advantages[n]),
            **s.extra,
        }
        for n, s in enumerate(samples)
    ]


def write_samples(
    directory: Path,
    step: int,
    rows: list[dict],
    means: dict[str, float],
    records: list,
    shown: int,
    variant: str,
) -> str:
    """samples/step-N.jsonl (`rows`: one per response in step order, with `id`, `sample`,
    `response`, `tokens`, `finish_reason`, each reward component of COLUMNS the variant has and
    `advantage`) and samples/step-N.md (the first `shown` of the step's prompts, `records`, with
    their G responses each); returns the Markdown (the trackers log it too)."""
    directory.mkdir(parents=True, exist_ok=True)
    write_text(directory / f"step-{step}.jsonl", "".join(json.dumps(r) + "\n" for r in rows))
    markdown = samples_markdown(step, rows, means, records, shown, variant)
    write_text(directory / f"step-{step}.md", markdown)
    return markdown


def samples_markdown(
    step: int, rows: list[dict], means: dict[str, float], records: list, shown: int, variant: str
) -> str:
    """One step's first `shown` prompts as Markdown: story, question, gold answer, then per response
    its reward components, advantage, length and finish reason, and the response text itself."""
    keys = columns(rows[0])
    G = len(rows) // len(records)
    header = ", ".join(f"{name} {means[key]:.3f}" for name, key in MEANS if key in means)
    out = [
        f"# Step {step}",
        "",
        f"{len(records)} prompts x {G} samples, reward `{variant}`. Step means over all "
        f"{len(rows)} samples (the `metrics.jsonl` row of this step): {header}.",
        f"The first {min(shown, len(records))} prompts follow; every sample is in "
        f"`step-{step}.jsonl`.",
        "",
    ]
    for p, record in enumerate(records[:shown]):
        group = rows[p * G : (p + 1) * G]
        out += [
            f"## Prompt {p + 1}: `{record.id}`",
            "",
            quote(record.stimuli),
            ">",
            quote(f"**Q:** {record.question}"),
            "",
            f"Gold answer: **{record.answer}**",
            "",
            "| sample | " + " | ".join(keys.values()) + " | advantage | tokens | finish |",
            "| ---: | " + " | ".join("---:" for _ in keys) + " | ---: | ---: | --- |",
        ]
        out += [
            f"| {r['sample']} | "
            + " | ".join(f"{r[k]:.3f}" for k in keys)
            + f" | {r['advantage']:+.3f} | {r['tokens']} | {r['finish_reason']} |"
            for r in group
        ]
        out.append("")
        for r in group:
            # a response cannot close its own block
            fence = "`" * max(3, longest_backtick_run(r["response"]) + 1)
            out += [f"Sample {r['sample']}:", "", f"{fence}text", r["response"], fence, ""]
    return "\n".join(out)


def quote(text: str) -> str:
    return "\n".join(f"> {line}" for line in text.splitlines() or [""])


def longest_backtick_run(text: str) -> int:
    return max((len(m) for m in re.findall(r"`+", text)), default=0)
