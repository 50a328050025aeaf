"""`psyrl report`: one self-contained HTML page on one or several training runs, for a person to
open after a run. This module writes the page; `psyrl.report.read` reads the run directories.

It holds each run's resolved config, the start -> end table of `psyrl summary`, the curves of `psyrl
plot` (its panels and trailing mean) as inline SVG, the held-out scores of every checkpoint
(`checkpoints/step-N/validation.json`), the tables of every evaluation found in the run directory
(`<run>/<dir>/results.json`, what evaluate.py --out writes; `make demo` writes `eval-mc/`), and a
browser over T-GRPO's rollout samples (`samples/step-N.jsonl`), each response beside its prompt's
story and gold answer, read back from data.train_file. Nothing is fetched: the CSS and the JS
(psyrl/assets/report/) are inline, and each sample step is a JSON block that the JS parses only
when that step is shown, so a long run's page opens fast. The browser's filters also come from the
URL (`report.html#step=2&finish=length&q=angry`, or a `?` query): a link can point at a filtered
view.
"""

from __future__ import annotations

import datetime
import html
import json
import math
import re
from importlib import resources
from pathlib import Path

import psyrl
from psyrl.core.atomic import write_text
from psyrl.core.checkpoints import select_checkpoint
from psyrl.core.config import config_changes
from psyrl.eval.report import results_markdown
from psyrl.report.plot import PANELS, load_runs, moving_average, series
from psyrl.report.read import RunData, prompt_records, read_run, read_samples, spaced
from psyrl.report.summary import summary_table
from psyrl.run.samples import columns

# ---------------------------------------------------------------- HTML helpers


def esc(value) -> str:
    return html.escape(str(value), quote=True)


def finite(value):
    """JSON has no NaN or infinity (JSON.parse refuses them, Python writes them): None instead."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [finite(v) for v in value]
    return value


def json_block(element_id: str, value) -> str:
    """A JSON data block the JS reads with JSON.parse: `<`, `>` and `&` as \\u escapes, so no text
    (a response holding `</script>` or `<!--`) can end the element early."""
    text = json.dumps(finite(value), ensure_ascii=False, allow_nan=False)
    text = text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
    return f'<script type="application/json" id="{esc(element_id)}">{text}</script>'


def number_cell(value) -> str:
    """A table cell showing a number rounded, with the exact value in data-value."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"<td>{esc('-' if value is None else value)}</td>"
    shown = str(value) if isinstance(value, int) else f"{value:.4f}"
    return f'<td class="num" data-value="{esc(repr(value))}">{shown}</td>'


def inline_markdown(text: str) -> str:
    """`code` and **bold** of the Markdown psyrl's tables use, on escaped text."""
    text = esc(text)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)


def markdown_html(text: str, heading: int = 4) -> str:
    """The Markdown that `psyrl summary` and evaluate.py's results.md are made of (headings,
    paragraphs, pipe tables; `---:` right-aligns) as HTML, so those functions stay the one
    definition of their tables."""
    out, block = [], []

    def flush():
        if block and block[0].startswith("|"):
            cells = [[c.strip() for c in line.strip().strip("|").split(" | ")] for line in block]
            right = [c.endswith(":") for c in cells[1]] if len(cells) > 1 else []
            rows = ["<tr>" + "".join(f"<th>{inline_markdown(c)}</th>" for c in cells[0]) + "</tr>"]
            for row in cells[2:]:
                rows.append(
                    "<tr>"
                    + "".join(
                        f"<td{' class=num' if i < len(right) and right[i] else ''}>"
                        f"{inline_markdown(c)}</td>"
                        for i, c in enumerate(row)
                    )
                    + "</tr>"
                )
            out.append('<table class="md">' + "".join(rows) + "</table>")
        elif block:
            out.append("<p>" + inline_markdown(" ".join(block)) + "</p>")
        block.clear()

    for line in text.splitlines():
        if (
            not line.strip()
            or line.startswith("#")
            or (block and block[0].startswith("|") != line.startswith("|"))
        ):
            flush()
        if line.startswith("#"):
            level = min(6, heading + len(line) - len(line.lstrip("#")) - 1)
            out.append(f"<h{level}>{inline_markdown(line.lstrip('#').strip())}</h{level}>")
        elif line.strip():
            block.append(line)
    flush()
    return "\n".join(out)


# ---------------------------------------------------------------- curves as SVG


# panel geometry in SVG user units: plot area inside the margins
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 400, 230, 56, 12, 10, 30


def nice_ticks(lo: float, hi: float, count: int = 5) -> list[float]:
    """Round tick values (1, 2 or 5 times a power of ten apart) between lo and hi."""
    raw = (hi - lo) / max(count - 1, 1)
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= 0.7 * raw)  # 4 to 7 ticks
    first, last = math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9)
    return [k * step for k in range(first, last + 1)]  # k * step: 0 is exactly 0


def tick_label(value: float) -> str:
    return f"{value:.6g}" if abs(value) >= 1e-3 or value == 0 else f"{value:.1e}"


def padded(lo: float, hi: float) -> tuple[float, float]:
    """A value range with some room around the data (a flat series gets a unit or 10 %)."""
    if hi == lo:
        pad = abs(lo) * 0.1 or 0.5
        return lo - pad, hi + pad
    return lo - (hi - lo) * 0.05, hi + (hi - lo) * 0.05


def svg_panel(
    metric: str, lines: list[tuple[str, str, list[int], list[float]]], smooth: int
) -> tuple[str, dict]:
    """One panel: every run's series of `metric` (thin per step and thick trailing mean, or dots for
    the validation scores), axes and ticks; and the data the JS cursor reads out."""
    steps = [s for _, _, xs, _ in lines for s in xs]
    values = [v for _, _, _, ys in lines for v in ys]
    x0, x1 = (
        (min(steps), max(steps)) if min(steps) < max(steps) else (min(steps) - 1, max(steps) + 1)
    )
    y0, y1 = padded(min(values), max(values))
    width, height = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    px = lambda s: LEFT + (s - x0) / (x1 - x0) * width
    py = lambda v: TOP + (y1 - v) / (y1 - y0) * height
    path = lambda xs, ys: "M" + " L".join(f"{px(s):.1f},{py(v):.1f}" for s, v in zip(xs, ys))
    parts = [f'<rect class="frame" x="{LEFT}" y="{TOP}" width="{width}" height="{height}"/>']
    for v in nice_ticks(y0, y1):
        parts.append(
            f'<line class="grid" x1="{LEFT}" x2="{LEFT + width}" y1="{py(v):.1f}" '
            f'y2="{py(v):.1f}"/><text class="ytick" x="{LEFT - 4}" y="{py(v) + 3:.1f}">'
            f"{tick_label(v)}</text>"
        )
    for s in nice_ticks(x0, x1):
        if s == int(s):  # steps are whole
            parts.append(
                f'<line class="grid" x1="{px(s):.1f}" x2="{px(s):.1f}" y1="{TOP}" '
                f'y2="{TOP + height}"/><text class="xtick" x="{px(s):.1f}" '
                f'y="{TOP + height + 14}">{int(s)}</text>'
            )
    parts.append(f'<text class="xlabel" x="{LEFT + width}" y="{HEIGHT - 2}">step</text>')
    readout = []
    valid = metric.startswith("valid/")
    for label, color, xs, ys in lines:
        tag = f'data-run="{esc(label)}" data-metric="{esc(metric)}" stroke="{color}"'
        mean = ys if valid or smooth <= 1 else moving_average(ys, smooth)
        if not valid and smooth > 1:
            parts.append(f'<path class="raw" {tag} d="{path(xs, ys)}"/>')
        parts.append(
            f'<path class="line" {tag} d="{path(xs, mean)}"><title>{esc(label)}</title></path>'
        )
        if valid:
            parts += [
                f'<circle class="dot" {tag} fill="{color}" cx="{px(s):.1f}" '
                f'cy="{py(v):.1f}" r="3"><title>{esc(label)}: step {s}, '
                f"{v:.4g}</title></circle>"
                for s, v in zip(xs, ys)
            ]
        readout.append(
            {
                "label": label,
                "color": color,
                "steps": xs,
                "values": ys,
                "mean": None if mean is ys else mean,
            }
        )
    parts.append(f'<line class="cursor" x1="0" x2="0" y1="{TOP}" y2="{TOP + height}"/>')
    svg = (
        f'<svg class="panel" viewBox="0 0 {WIDTH} {HEIGHT}" data-metric="{esc(metric)}" '
        f'data-x0="{x0}" data-x1="{x1}" data-left="{LEFT}" data-width="{width}" role="img">'
        + "".join(parts)
        + "</svg>"
    )
    return svg, readout


# SFT logs neither rewards nor KL: its losses are the curves a person looks at
SFT_PANELS = [
    ("train/loss", "SFT loss (per response token)"),
    ("valid/loss", "held-out loss (SFT targets)"),
]
# matplotlib's default cycle: a run keeps the colour it has in `psyrl plot`'s curves.png
COLORS = [
    "#1f77b4",
    "#ff7f0e",
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
]


def curves_section(runs: list[RunData], smooth: int) -> str:
    panels, data = [], {}
    for metric, title in PANELS + SFT_PANELS:
        lines = [
            (run.label, COLORS[n % len(COLORS)], *series(run.rows, metric))
            for n, run in enumerate(runs)
        ]
        lines = [line for line in lines if line[2]]
        if not lines:
            continue
        svg, data[metric] = svg_panel(metric, lines, smooth)
        panels.append(
            f'<figure class="curve"><figcaption>{esc(title)} <code>{esc(metric)}'
            f'</code></figcaption>{svg}<div class="readout"></div></figure>'
        )
    if not panels:
        return (
            '<p class="empty">No curves: none of the runs logged a metric psyrl draws ('
            + ", ".join(esc(m) for m, _ in PANELS + SFT_PANELS)
            + ").</p>"
        )
    legend = "".join(
        f'<span class="key"><i style="background:{COLORS[n % len(COLORS)]}"></i>'
        f"{esc(run.label)}</span>"
        for n, run in enumerate(runs)
    )
    how = f"thin: per step; thick: trailing mean of {smooth} steps; " if smooth > 1 else ""
    return (
        f'<p class="legend">{legend}</p><p class="note">{how}dots: held-out validation. '
        'Hover a panel to read every run\'s value at a step.</p><div class="curves">'
        + "".join(panels)
        + "</div>"
        + json_block("curve-data", data)
    )


# ---------------------------------------------------------------- tables


def trainer(run: RunData) -> str:
    """Which entry script wrote the run, from what it logged."""
    if any("reward/final" in r for r in run.rows):
        return "T-GRPO (train_tgrpo.py)"
    return "SFT (train_sft.py)" if any("train/loss" in r for r in run.rows) else "unknown"


def runs_section(runs: list[RunData]) -> str:
    out = []
    first = runs[0]
    for run in runs:
        kind = trainer(run)
        steps = max((r["step"] for r in run.rows), default=0)
        planned = max(
            (r.get("steps", 0) for r in run.rows if isinstance(r.get("steps"), int)), default=0
        )
        facts = [f"trainer {kind}", f"steps logged {steps}" + (f" of {planned}" if planned else "")]
        if run.config is not None:
            model = run.config.model.path or "tiny random-init model from [model]"
            facts += [f"model {model}", f"train data {run.config.data.train_file}"]
            if kind.startswith("T-GRPO"):
                facts.append(f"reward {run.config.reward.variant}")
        facts = [esc(f) for f in facts]
        if run is not first and run.config is not None and first.config is not None:
            changed = [k for k in config_changes(first.config, run.config) if k != "run.name"]
            facts.append(
                f"<details><summary>config differs from {esc(first.label)} in "
                f"{len(changed)} key(s) besides run.name</summary>"
                f"{esc(', '.join(changed))}</details>"
            )
        config = (
            f"<details><summary>config.resolved.toml</summary><pre>{esc(run.config_text)}"
            "</pre></details>"
            if run.config_text is not None
            else '<p class="empty">no config.resolved.toml in this run directory</p>'
        )
        out.append(
            f'<div class="run"><h3>{esc(run.label)}</h3><p class="path">'
            f"{esc(run.dir.resolve())}</p><ul>"
            + "".join(f"<li>{f}</li>" for f in facts)
            + f"</ul>{config}</div>"
        )
    return "".join(out)


def summary_note(runs: list[RunData]) -> str:
    sft = [run.label for run in runs if not trainer(run).startswith("T-GRPO")]
    if not sft:
        return ""
    return (
        f'<p class="note">{esc(", ".join(sft))}: no T-GRPO rewards (SFT); the reward column '
        "is its config's [reward] table, which SFT does not use.</p>"
    )


VALID_ORDER = [
    "valid/f1",
    "valid/reward",
    "valid/format",
    "valid/length",
    "valid/loss",
    "valid/accuracy",
    "valid/not_applicable",
    "valid/reward_accuracy",
    "valid/items",
]


def validation_section(runs: list[RunData]) -> str:
    out = []
    for run in runs:
        out.append(f"<h3>{esc(run.label)}</h3>")
        rows = list(run.validation)
        start = next(
            (r for r in run.rows if r["step"] == 0 and any(k.startswith("valid/") for k in r)), None
        )
        if start and all(step != 0 for step, _ in rows):
            rows.insert(0, (0, start))
        if not rows:
            out.append(
                '<p class="empty">No held-out scores: the run has no checkpoints/step-N/'
                "validation.json (checkpoint.every = 0, or no data.valid_file nor "
                "data.valid_files).</p>"
            )
            continue
        keys = [k for k in VALID_ORDER if any(k in r for _, r in rows)]
        keys += sorted({k for _, r in rows for k in r if k.startswith("valid/")} - set(keys))
        chosen = None
        if trainer(run).startswith("SFT"):  # appendix B picks the GRPO start among SFT ones
            try:
                chosen = select_checkpoint(run.dir, "median")[0]
            except (FileNotFoundError, ValueError):
                chosen = None
        head = (
            "<tr><th>step</th>"
            + "".join(f"<th>{esc(k.removeprefix('valid/'))}</th>" for k in keys)
            + "<th></th></tr>"
        )
        body = []
        for step, scores in rows:
            note = (
                "before training (metrics.jsonl)"
                if step == 0 and scores is start
                else f"checkpoints/step-{step}/validation.json"
            )
            if step == chosen:
                note += "; median F1: psyrl select-checkpoint's choice (appendix B)"
            body.append(
                f'<tr data-step="{step}"><td class="num">{step}</td>'
                + "".join(number_cell(scores.get(k)) for k in keys)
                + f'<td class="note">{esc(note)}</td></tr>'
            )
        out.append(
            f'<table class="validation" data-run="{esc(run.label)}">{head}'
            + "".join(body)
            + "</table>"
        )
    return "".join(out)


def evaluation_section(runs: list[RunData]) -> str:
    out = []
    for run in runs:
        if not run.evaluations:
            out.append(
                f'<h3>{esc(run.label)}</h3><p class="empty">No evaluation results: none of '
                f"{esc(run.dir)}/*/results.json exists (evaluate.py --model "
                f"{esc(run.dir)}/hf --out {esc(run.dir)}/eval-NAME writes one; make demo "
                "writes eval-mc).</p>"
            )
            continue
        for name, settings, results in run.evaluations:
            try:
                text = results_markdown(run.label, results, settings)
            except (KeyError, TypeError, AttributeError) as e:
                raise ValueError(
                    f"{run.dir / name / 'results.json'}: not an evaluate.py "
                    f"results.json ({type(e).__name__}: {e})"
                ) from None
            out.append(
                f'<div class="evaluation" data-run="{esc(run.label)}" '
                f'data-dir="{esc(name)}"><h3>{esc(run.label)} / {esc(name)}</h3>'
                f"{markdown_html(text)}</div>"
            )
    return "".join(out)


# ---------------------------------------------------------------- the rollout browser


def rollouts_section(runs: list[RunData], sample_steps: int) -> str:
    meta, blocks, without = [], [], []
    for run in runs:
        if not run.sample_steps:
            without.append(run.label)
            continue
        k = len(meta)
        steps, ids, finishes, keys = [], set(), set(), set()
        for step, path in spaced(run.sample_steps, sample_steps):
            rows = read_samples(path)
            steps.append(step)
            ids.update(r["id"] for r in rows)
            finishes.update(str(r["finish_reason"]) for r in rows)
            keys.update(r for row in rows for r in row)
            blocks.append(json_block(f"samples-{k}-{step}", rows))
        prompts, note = prompt_records(run, ids)
        blocks.append(json_block(f"prompts-{k}", prompts))
        meta.append(
            {
                "label": run.label,
                "steps": steps,
                "finish": sorted(finishes),
                "columns": [list(column) for column in columns(keys).items()],
                "note": note,
                "available": len(run.sample_steps),
            }
        )
    if not meta:
        return (
            '<p class="empty">No rollout samples: T-GRPO writes samples/step-N.jsonl every '
            "log.samples_every steps (0 turns them off); SFT runs have none.</p>"
        )
    skipped = f'<p class="note">No samples in: {esc(", ".join(without))}.</p>' if without else ""
    controls = """
<div class="controls" id="r-controls">
 <label id="r-run-label">run <select id="r-run"></select></label>
 <label>step <button id="r-prev" title="previous step">&#9664;</button><select id="r-step">
 </select><button id="r-next" title="next step">&#9654;</button></label>
 <label>final reward <input id="r-min_reward" type="number" step="any" placeholder="min"> to
 <input id="r-max_reward" type="number" step="any" placeholder="max"></label>
 <label>F1 <input id="r-min_f1" type="number" step="any" placeholder="min"> to
 <input id="r-max_f1" type="number" step="any" placeholder="max"></label>
 <label>format <select id="r-format"><option value="">any</option>
 <option value="ok">well-formed (1)</option><option value="bad">malformed (0)</option></select>
 </label>
 <label>finish <select id="r-finish"><option value="">any</option></select></label>
 <label>search <input id="r-q" type="search" placeholder="response, story, id, answer"></label>
 <button id="r-reset">reset</button>
</div>
<p class="note"><span id="r-count"></span> <span id="r-note"></span></p>
<div id="r-rows"></div>"""
    return skipped + controls + json_block("rollout-meta", meta) + "\n" + "\n".join(blocks)


# ---------------------------------------------------------------- the page


def asset(name: str) -> str:
    """A file of psyrl/assets/report/ (the page's CSS and JS), read from the installed package."""
    return (resources.files("psyrl") / "assets" / "report" / name).read_text(encoding="utf-8")


def build_report(
    run_dirs: list[str | Path], smooth: int = 5, window: int = 5, sample_steps: int = 0
) -> str:
    """The page's HTML. A run directory without metrics.jsonl, or a line of one of its files that
    does not parse, is a ValueError or OSError naming the file (and the line)."""
    runs = [
        read_run(label, Path(d), rows) for d, (label, rows) in zip(run_dirs, load_runs(run_dirs))
    ]
    labels = ", ".join(run.label for run in runs)
    sections = [
        ("runs", "Runs and configs", runs_section(runs)),
        (
            "summary",
            f"Start → end (psyrl summary, {window}-step means)",
            markdown_html(summary_table(run_dirs, window)) + summary_note(runs),
        ),
        ("curves", "Training and held-out curves", curves_section(runs, smooth)),
        ("validation", "Held-out validation per checkpoint", validation_section(runs)),
        ("evaluation", "Evaluation", evaluation_section(runs)),
        ("rollouts", "Rollouts", rollouts_section(runs, sample_steps)),
    ]
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    nav = " · ".join(
        f'<a href="#sec-{key}">{esc(title.split(" (")[0])}</a>' for key, title, _ in sections
    )
    body = "\n".join(
        f'<section id="sec-{key}"><h2>{esc(title)}</h2>\n{content}\n</section>'
        for key, title, content in sections
    )
    css, js = asset("report.css"), asset("report.js")
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>psyrl report: {esc(labels)}</title>
<style>
{css}</style></head>
<body>
<header><h1>psyrl report: {esc(labels)}</h1>
<p class="note">psyrl {esc(psyrl.__version__)}, written {now} by <code>psyrl report</code>.</p>
<nav>{nav}</nav></header>
<main>
{body}
</main>
<script>
{js}</script>
</body></html>
"""


def write_report(
    run_dirs: list[str | Path],
    out: str | Path,
    smooth: int = 5,
    window: int = 5,
    sample_steps: int = 0,
) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out, build_report(run_dirs, smooth, window, sample_steps))
    return out
