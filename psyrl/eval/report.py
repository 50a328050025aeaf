"""The evaluation's Markdown tables: Table 3's layout (F1 and accuracy per benchmark), a per-task
table, Table 2's layout for StimuliQA-format files (F1 by subdimension, and the format rate), and
the comparison of several runs with deltas against the first (`evaluate.py compare`).

Accuracy signals beside the paper's metrics (`--accuracy`) are extra columns after the paper's, one
per signal, mean ×100; an evaluation whose options were chosen by similarity (`--choose-by`) heads
its accuracy `Acc (sim)`, and is never compared with one that chose by F1."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from psyrl.eval.benchmarks import DISPLAY_NAMES, SIGNAL_PREFIX, EvalError


def _name(benchmark: str) -> str:
    return DISPLAY_NAMES.get(benchmark, benchmark)


def _cell(value: float | None, base: float | None = None, digits: int = 2) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return text if base is None else f"{text} ({value - base:+.{digits}f})"


def _table(header: list[str], rows: list[list[str]], right_from: int = 1) -> str:
    align = ["---"] * right_from + ["---:"] * (len(header) - right_from)
    lines = ["| " + " | ".join(header) + " |", "| " + " | ".join(align) + " |"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in rows])


def _is_multiple_choice(summary: dict) -> bool:
    return summary["accuracy"] is not None


def _signals(summaries) -> list[str]:
    """The accuracy signals' keys (`accuracy/<name>`) of these summaries, in first-seen order."""
    return list(dict.fromkeys(k for s in summaries for k in s if k.startswith(SIGNAL_PREFIX)))


def _signal_name(key: str) -> str:
    return key.removeprefix(SIGNAL_PREFIX)


def _accuracy_name(summaries) -> str:
    """`Acc` (SPEC §7: the option of highest F1), or `Acc (sim)` (the most similar option)."""
    return "Acc (sim)" if any(s.get("choose_by") == "similarity" for s in summaries) else "Acc"


def main_table(labels: Sequence[str], results: Sequence[dict]) -> str:
    """Table 3's layout: one row per run, F1 (×100) and Acc (%) per multiple-choice benchmark;
    deltas against the first run when there are several. Empty when no run holds a multiple-choice
    benchmark."""
    names = list(dict.fromkeys(b for r in results for b, s in r.items() if _is_multiple_choice(s)))
    if not names:
        return ""
    summaries = [s for r in results for b, s in r.items() if b in names]
    acc, signals = _accuracy_name(summaries), _signals(summaries)
    header = ["run"] + [f"{_name(b)} {m}" for b in names for m in ("F1", acc)]
    header += [f"{_name(b)} {_signal_name(key)}" for b in names for key in signals]
    rows = []
    for k, (label, result) in enumerate(zip(labels, results)):
        row = [label]
        cells = [(b, metric) for b in names for metric in ("f1", "accuracy")]
        for b, metric in cells + [(b, key) for b in names for key in signals]:
            value = result.get(b, {}).get(metric)
            base = results[0].get(b, {}).get(metric) if k else None
            row.append(_cell(value, base))
        rows.append(row)
    return _table(header, rows)


def stimuliqa_table(labels: Sequence[str], results: Sequence[dict]) -> str:
    """Table 2's layout for each StimuliQA-format source: one row per run, F1 (×100) per
    subdimension, overall F1 and the format-compliance rate (%); deltas against the first run. Empty
    when there is none."""
    names = list(
        dict.fromkeys(b for r in results for b, s in r.items() if not _is_multiple_choice(s))
    )
    parts = []
    for b in names:
        tasks = list(dict.fromkeys(t for r in results for t in r.get(b, {}).get("tasks", {})))
        signals = _signals(r.get(b, {}) for r in results)
        header = (
            ["run"]
            + [t or "(no subdimension)" for t in tasks]
            + ["overall F1", "format %", "n"]
            + [_signal_name(key) for key in signals]
        )
        rows = []
        for k, (label, result) in enumerate(zip(labels, results)):
            mine, first = result.get(b, {}), results[0].get(b, {}) if k else {}
            row = [label] + [
                _cell(
                    mine.get("tasks", {}).get(t, {}).get("f1"),
                    first.get("tasks", {}).get(t, {}).get("f1") if k else None,
                )
                for t in tasks
            ]
            row += [
                _cell(mine.get("f1"), first.get("f1") if k else None),
                _cell(mine.get("format"), first.get("format") if k else None),
                str(mine.get("count", "-")),
            ]
            row += [_cell(mine.get(key), first.get(key) if k else None) for key in signals]
            rows.append(row)
        parts.append(f"**{b}** (StimuliQA format: F1 by subdimension)\n\n" + _table(header, rows))
    return "\n\n".join(parts)


def task_table(result: dict) -> str:
    """Every benchmark and task of one run: count, F1, accuracy, E choices, format rate, mean
    response tokens; then each accuracy signal's mean ×100."""
    signals = _signals(result.values())
    acc = _accuracy_name(result.values())
    header = ["benchmark", "task", "n", "F1", f"{acc} %", "E", "format %", "length"]
    header += [_signal_name(key) for key in signals]
    rows = []
    for b, summary in result.items():
        for task, s in [("(all)", summary)] + list(summary["tasks"].items()):
            rows.append(
                [
                    _name(b),
                    task or "-",
                    str(s["count"]),
                    _cell(s["f1"]),
                    _cell(s["accuracy"]),
                    "-" if s["not_applicable"] is None else str(s["not_applicable"]),
                    _cell(s["format"], digits=1),
                    _cell(s["length"], digits=1),
                ]
                + [_cell(s.get(key)) for key in signals]
            )
    return _table(header, rows, right_from=2)


def results_markdown(label: str, result: dict, settings: dict) -> str:
    """results.md: what was evaluated, then the Table 3 (and Table 2) layout, then the per-task
    table."""
    split_seed = "" if settings["split"] == "all" else f" (split seed {settings['split_seed']})"
    head = (
        f"# Evaluation of `{settings['model']}`\n\n"
        f"engine `{settings.get('engine', 'torch')}`, prompt `{settings['prompt']}`, temperature "
        f"{settings['temperature']}, top-p {settings['top_p']}, seed "
        f"{settings['seed']}, at most {settings['max_new_tokens']} new tokens; split "
        f"`{settings['split']}`{split_seed}, "
        f"limit {settings['limit'] or 'none'} per task. F1 ×100; {_accuracy_note(settings)}; "
        "length in response tokens.\n"
    )
    parts = [head]
    for table in (main_table([label], [result]), stimuliqa_table([label], [result])):
        if table:
            parts.append(table + "\n")
    parts.append("## Per task\n\n" + task_table(result) + "\n")
    return "\n".join(parts)


def _accuracy_note(settings: dict) -> str:
    """What Acc means in results.md, and the accuracy signals beside it (none by default)."""
    if settings.get("choose_by", "f1") == "similarity":
        note = (
            "Acc (sim) = accuracy in % of the option most similar to the answer (semantic "
            "encoder; a tie at the top is E and counts wrong), not the paper's F1 choice"
        )
    else:
        note = "Acc = F1-accuracy in % (a tie at the top is E and counts wrong)"
    if settings.get("accuracy"):
        names = ", ".join(settings["accuracy"])
        note += (
            f"; {names}: the accuracy signal's mean ×100 on the extracted answer, not the paper's"
        )
    return note


def load_results(run_dir: str | Path) -> dict:
    """The `results` object of an evaluation directory's results.json."""
    path = Path(run_dir) / "results.json" if Path(run_dir).is_dir() else Path(run_dir)
    if not path.is_file():
        raise EvalError(
            f"{path}: no results.json (is {run_dir} an evaluate.py --out directory, and did it "
            "finish?)"
        )
    try:
        return json.loads(path.read_text(encoding="utf-8"))["results"]
    except (ValueError, KeyError) as e:
        raise EvalError(f"{path}: not an evaluate.py results.json ({e})") from None


def compare_markdown(labels: Sequence[str], results: Sequence[dict]) -> str:
    """`evaluate.py compare`: the runs side by side, deltas against the first."""
    rules = {
        s.get("choose_by", "f1") for r in results for s in r.values() if _is_multiple_choice(s)
    }
    if len(rules) > 1:
        raise EvalError(
            "the runs chose options by different rules (F1 and similarity, --choose-by): their "
            "accuracies are not comparable; compare runs of one rule"
        )
    parts = [t for t in (main_table(labels, results), stimuliqa_table(labels, results)) if t]
    if not parts:
        raise EvalError("the runs have no results to compare")
    return "\n\n".join(parts)
