"""`psyrl report`: one self-contained HTML page on one or several training runs, for a person to
open after a run.

It holds each run's resolved config, the start -> end table of `psyrl summary`, the curves of `psyrl
plot` (its panels and trailing mean) as inline SVG, the held-out scores of every checkpoint
(`checkpoints/step-N/validation.json`), the tables of every evaluation found in the run directory
(`<run>/<dir>/results.json`, what evaluate.py --out writes; `make demo` writes `eval-mc/`), and a
browser over T-GRPO's rollout samples (`samples/step-N.jsonl`), each response beside its prompt's
story and gold answer, read back from data.train_file. Nothing is fetched: the CSS and the JS are
inline, and each sample step is a JSON block that the JS parses only when that step is shown, so a
long run's page opens fast. The browser's filters also come from the URL (`report.html#step=2&
finish=length&q=angry`, or a `?` query): a link can point at a filtered view.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import html
import json
import math
import re
from pathlib import Path

import psyrl
from psyrl.core.atomic import write_text
from psyrl.core.config import Config, ConfigError, config_changes, load_config
from psyrl.core.records import BenchmarkRecord, load_records, read_jsonl
from psyrl.eval.report import results_markdown
from psyrl.report.plot import PANELS, load_runs, moving_average, series
from psyrl.report.summary import summary_table
from psyrl.run.samples import COLUMNS
from psyrl.runtime.checkpoint import checkpoint_dirs, select_checkpoint

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
VALID_ORDER = [
    "valid/f1",
    "valid/reward",
    "valid/format",
    "valid/length",
    "valid/loss",
    "valid/accuracy",
    "valid/not_applicable",
    "valid/custom",
    "valid/items",
]
SAMPLE_KEYS = ("id", "sample", "response", "tokens", "finish_reason", "advantage")
# panel geometry in SVG user units: plot area inside the margins
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 400, 230, 56, 12, 10, 30


@dataclasses.dataclass
class RunData:
    """What the page shows of one run directory."""

    label: str
    dir: Path
    rows: list[dict]
    """metrics.jsonl."""
    config_text: str | None
    """config.resolved.toml as written; None when the file is missing."""
    config: Config | None
    """The same, loaded (None when missing or written by a psyrl with other keys)."""
    validation: list[tuple[int, dict]]
    """(step, validation.json) of every checkpoint that has one."""
    evaluations: list[tuple[str, dict, dict]]
    """(folder name, settings, results) of every evaluate.py output in the run directory."""
    sample_steps: list[tuple[int, Path]]
    """(step, samples/step-N.jsonl), by step."""


# ---------------------------------------------------------------- reading the run directories


def read_run(label: str, run_dir: Path, rows: list[dict]) -> RunData:
    config_path = run_dir / "config.resolved.toml"
    text, config = None, None
    if config_path.is_file():
        text = config_path.read_text(encoding="utf-8")
        try:
            config = load_config(config_path)
        except ConfigError:
            config = None  # shown as text, without the cross-run diff
    return RunData(
        label,
        run_dir,
        rows,
        text,
        config,
        read_validation(run_dir),
        read_evaluations(run_dir),
        sample_files(run_dir),
    )


def read_json(path: Path) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}:{e.lineno}: invalid JSON ({e.msg})") from None
    if not isinstance(value, dict):
        raise ValueError(f"{path}: expected a JSON object")
    return value


def read_validation(run_dir: Path) -> list[tuple[int, dict]]:
    return [
        (step, read_json(d / "validation.json"))
        for step, d in checkpoint_dirs(run_dir)
        if (d / "validation.json").is_file()
    ]


def read_evaluations(run_dir: Path) -> list[tuple[str, dict, dict]]:
    found = []
    for path in sorted(run_dir.glob("*/results.json")):
        saved = read_json(path)
        if not isinstance(saved.get("results"), dict) or not isinstance(
            saved.get("settings"), dict
        ):
            raise ValueError(f"{path}: not an evaluate.py results.json (no results or settings)")
        found.append((path.parent.name, saved["settings"], saved["results"]))
    return found


def sample_files(run_dir: Path) -> list[tuple[int, Path]]:
    found = []
    for path in (run_dir / "samples").glob("step-*.jsonl"):
        suffix = path.stem.split("-", 1)[1]
        if suffix.isdigit():
            found.append((int(suffix), path))
    return sorted(found)


def sample_row(row) -> dict:
    """A line of samples/step-N.jsonl (`psyrl.run.samples.write_samples`); the JS relies on these
    keys."""
    if not isinstance(row, dict):
        raise ValueError("expected a JSON object")
    missing = [k for k in SAMPLE_KEYS if k not in row]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (not a psyrl samples file?)")
    return row


def read_samples(path: Path) -> list[dict]:
    return [row for _, row in read_jsonl(path, sample_row)]


def spaced(items: list, count: int) -> list:
    """At most `count` of `items`, evenly spaced, the first and the last included (0: all)."""
    if count <= 0 or len(items) <= count:
        return items
    if count == 1:
        return items[-1:]
    picks = sorted({round(i * (len(items) - 1) / (count - 1)) for i in range(count)})
    return [items[i] for i in picks]


def find_data_file(run_dir: Path, path: str) -> Path | None:
    """data.train_file as the trainer saw it: a relative path was relative to wherever it ran, so
    try here, this psyrl checkout, then each folder above the run directory (`runs/<name>`)."""
    given = Path(path)
    if given.is_absolute():
        return given if given.is_file() else None
    checkout = Path(psyrl.__file__).resolve().parents[1]
    for base in [Path.cwd(), checkout, *run_dir.resolve().parents]:
        if (base / given).is_file():
            return base / given
    return None


def trained_data_digest(run_dir: Path) -> str | None:
    """The sha256 of the training data that the newest checkpoint's trainer.json recorded."""
    for _, d in reversed(checkpoint_dirs(run_dir)):
        if (d / "trainer.json").is_file():
            return read_json(d / "trainer.json").get("data", {}).get("sha256")
    return None


def prompt_records(run: RunData, ids: set[str]) -> tuple[dict[str, dict], str]:
    """{id: story, question, gold answer (and options)} of the sampled prompts, from the run's
    data.train_file, and a note for the page when it is missing or is not the file trained on."""
    if run.config is None:
        return {}, "the run's config.resolved.toml is missing or unreadable: stories unknown"
    name = run.config.data.train_file
    path = find_data_file(run.dir, name)
    if path is None:
        return {}, f"training data {name} not found from here: stories and gold answers left out"
    note = ""
    digest = trained_data_digest(run.dir)
    if digest and digest != hashlib.sha256(path.read_bytes()).hexdigest():
        note = (
            f"{path} changed since the run (its sha256 differs from the checkpoints' "
            "trainer.json): the stories shown may not be the ones trained on"
        )
    prompts = {}
    for r in load_records(path):
        if r.id not in ids:
            continue
        if isinstance(r, BenchmarkRecord):
            prompts[r.id] = {
                "story": r.context,
                "question": r.question,
                "answer": r.answer,
                "options": list(r.options),
            }
        else:
            prompts[r.id] = {"story": r.stimuli, "question": r.question, "answer": r.answer}
    return prompts, note or f"stories and gold answers from {path}"


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
                "validation.json (checkpoint.every = 0, or no data.valid_file).</p>"
            )
            continue
        keys = [k for k in VALID_ORDER if any(k in r for _, r in rows)]
        keys += sorted({k for _, r in rows for k in r if k.startswith("valid/")} - set(keys))
        chosen = None
        if trainer(run).startswith("SFT"):  # appendix B picks the GRPO start among SFT ones
            try:
                chosen = select_checkpoint(run.dir, "median")[0]
            except (FileNotFoundError, KeyError):
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
                "columns": [[key, name] for key, name in COLUMNS.items() if key in keys],
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
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>psyrl report: {esc(labels)}</title>
<style>{CSS}</style></head>
<body>
<header><h1>psyrl report: {esc(labels)}</h1>
<p class="note">psyrl {esc(psyrl.__version__)}, written {now} by <code>psyrl report</code>.</p>
<nav>{nav}</nav></header>
<main>
{body}
</main>
<script>{JS}</script>
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


CSS = """
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; margin: 0;
  color: #1d2330; background: #f6f7f9; }
header { background: #1d2330; color: #fff; padding: 14px 24px; }
header h1 { margin: 0 0 4px; font-size: 20px; }
header .note, header a { color: #c9d3e6; }
nav { margin-top: 6px; }
main { max-width: 1400px; margin: 0 auto; padding: 8px 24px 48px; }
section { background: #fff; border: 1px solid #dde1e8; border-radius: 6px; margin: 16px 0;
  padding: 4px 18px 14px; }
h2 { font-size: 17px; border-bottom: 1px solid #e6e9ee; padding-bottom: 6px; }
h3 { font-size: 15px; margin: 14px 0 6px; }
h4 { font-size: 14px; margin: 12px 0 4px; }
code, pre { font: 12px/1.4 ui-monospace, "SFMono-Regular", Menlo, Consolas, monospace; }
pre { background: #f3f4f7; padding: 8px; overflow: auto; white-space: pre-wrap; }
.note, .path { color: #5b6475; font-size: 12.5px; }
.empty { color: #8a5a00; background: #fff8e6; padding: 6px 10px; border-radius: 4px; }
table { border-collapse: collapse; margin: 6px 0 10px; font-size: 13px; }
th, td { border-bottom: 1px solid #e6e9ee; padding: 3px 9px; text-align: left; }
th { background: #f3f4f7; font-weight: 600; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
td.note { color: #5b6475; font-size: 12px; }
tr:hover td { background: #f7f9fc; }
.run ul { margin: 4px 0; padding-left: 20px; }
.legend .key { margin-right: 16px; white-space: nowrap; }
.legend i { display: inline-block; width: 18px; height: 4px; margin-right: 6px;
  vertical-align: middle; }
.curves { display: grid; grid-template-columns: repeat(auto-fill, minmax(380px, 1fr));
  gap: 10px; }
figure.curve { margin: 0; border: 1px solid #eceef2; border-radius: 4px; padding: 6px; }
figcaption { font-weight: 600; font-size: 13px; }
figcaption code { font-weight: normal; color: #5b6475; }
svg.panel { width: 100%; height: auto; display: block; }
svg .frame { fill: none; stroke: #c7ccd6; }
svg .grid { stroke: #eceef2; }
svg text { font-size: 10px; fill: #5b6475; }
svg .ytick { text-anchor: end; }
svg .xtick { text-anchor: middle; }
svg .xlabel { text-anchor: end; }
svg path { fill: none; stroke-linejoin: round; }
svg path.raw { stroke-width: 1; opacity: 0.3; }
svg path.line { stroke-width: 2; }
svg .cursor { stroke: #1d2330; stroke-dasharray: 3 3; visibility: hidden; }
.readout { min-height: 1.4em; font-size: 12px; color: #1d2330; }
.readout b { margin-right: 8px; }
.readout span { margin-right: 10px; white-space: nowrap; }
.controls { display: flex; flex-wrap: wrap; gap: 8px 18px; align-items: center;
  position: sticky; top: 0; background: #fff; padding: 8px 0; z-index: 1;
  border-bottom: 1px solid #e6e9ee; }
.controls input[type=number] { width: 70px; }
.controls input[type=search] { width: 220px; }
.group { display: grid; grid-template-columns: minmax(260px, 1fr) 2fr; gap: 12px;
  border-top: 1px solid #e6e9ee; padding: 10px 0; }
.prompt .id { font-family: ui-monospace, monospace; font-size: 12px; color: #5b6475; }
.prompt .story { margin: 4px 0; }
.prompt .question { font-style: italic; margin: 4px 0; }
.prompt .gold { margin: 4px 0; }
.prompt .gold b { color: #1a7f37; }
.prompt .options { margin: 2px 0; padding-left: 20px; font-size: 13px; }
.prompt .stats { font-size: 12px; color: #5b6475; }
.sample { border: 1px solid #e6e9ee; border-radius: 4px; margin-bottom: 8px; }
.sample .chips { display: flex; flex-wrap: wrap; gap: 4px; padding: 4px 6px;
  background: #f8f9fb; border-bottom: 1px solid #eceef2; }
.chip { font-size: 11.5px; padding: 1px 6px; border-radius: 9px; background: #e9ecf2;
  font-variant-numeric: tabular-nums; }
.chip.final { background: #dbe7fb; font-weight: 600; }
.chip.pos { background: #d6f1dc; }
.chip.neg { background: #f9dcdc; }
.chip.length { background: #fde7c8; }
.sample pre { margin: 0; max-height: 16em; background: #fff; }
mark { background: #ffe27a; }
@media (max-width: 800px) { .group { grid-template-columns: 1fr; } }
"""

JS = r"""
"use strict";
(function () {
  const byId = (id) => document.getElementById(id);
  const parse = (id) => { const el = byId(id); return el ? JSON.parse(el.textContent) : null; };
  const fmt = (v, d) => (typeof v === "number" ? v.toFixed(d) : "-");
  const el = (tag, cls, text) => {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined) e.textContent = text;
    return e;
  };

  // ------------------------------------------------------------ curves: a cursor and a readout
  const curves = parse("curve-data") || {};
  document.querySelectorAll("svg.panel").forEach((svg) => {
    const lines = curves[svg.dataset.metric] || [];
    const [x0, x1] = [+svg.dataset.x0, +svg.dataset.x1];
    const [left, width] = [+svg.dataset.left, +svg.dataset.width];
    const cursor = svg.querySelector(".cursor");
    const readout = svg.parentNode.querySelector(".readout");
    svg.addEventListener("mousemove", (event) => {
      const pt = svg.createSVGPoint();
      pt.x = event.clientX; pt.y = event.clientY;
      const p = pt.matrixTransform(svg.getScreenCTM().inverse());
      const step = x0 + ((p.x - left) / width) * (x1 - x0);
      readout.textContent = "";
      let shown = null;
      lines.forEach((line) => {
        let best = 0;  // the logged step nearest the mouse
        line.steps.forEach((s, i) => {
          if (Math.abs(s - step) < Math.abs(line.steps[best] - step)) best = i;
        });
        const at = line.steps[best];  // the cursor goes to the nearest step any run logged
        if (shown === null || Math.abs(at - step) < Math.abs(shown - step)) shown = at;
        const span = el("span", "", line.label + " " + fmt(line.values[best], 4) +
          (line.mean ? " (mean " + fmt(line.mean[best], 4) + ")" : "") +
          " @ " + line.steps[best]);
        span.style.color = line.color;
        readout.appendChild(span);
      });
      const x = left + ((shown - x0) / (x1 - x0)) * width;
      cursor.setAttribute("x1", x); cursor.setAttribute("x2", x);
      cursor.style.visibility = "visible";
    });
    svg.addEventListener("mouseleave", () => { cursor.style.visibility = "hidden"; });
  });

  // ------------------------------------------------------------ the rollout browser
  const meta = parse("rollout-meta");
  if (!meta) return;
  const FILTERS = ["min_reward", "max_reward", "min_f1", "max_f1", "format", "finish", "q"];
  const state = { run: 0, step: null };
  const cache = {};
  const samples = (k, step) => {
    const key = k + "-" + step;  // each step's JSON is parsed once, when first shown
    if (!(key in cache)) cache[key] = parse("samples-" + key) || [];
    return cache[key];
  };
  const promptsOf = (k) => {
    if (!(("p" + k) in cache)) cache["p" + k] = parse("prompts-" + k) || {};
    return cache["p" + k];
  };

  function readUrl() {
    const params = new URLSearchParams(location.search);
    new URLSearchParams(location.hash.slice(1)).forEach((v, k) => params.set(k, v));
    const run = meta.findIndex((r) => r.label === params.get("run"));
    state.run = run >= 0 ? run : 0;
    const step = parseInt(params.get("step"), 10);
    const steps = meta[state.run].steps;
    state.step = steps.includes(step) ? step : steps[steps.length - 1];
    FILTERS.forEach((f) => { state[f] = params.get(f) || ""; });
  }

  function writeUrl() {
    const params = new URLSearchParams();
    if (meta.length > 1) params.set("run", meta[state.run].label);
    params.set("step", state.step);
    FILTERS.forEach((f) => { if (state[f] !== "") params.set(f, state[f]); });
    // a shareable link to this view; some browsers refuse it on a file:// page
    try { history.replaceState(null, "", "#" + params.toString()); } catch (e) { /* keep going */ }
  }

  function fillControls() {
    const run = meta[state.run];
    const runSelect = byId("r-run");
    runSelect.textContent = "";
    meta.forEach((r, k) => runSelect.appendChild(new Option(r.label, k, false, k === state.run)));
    byId("r-run-label").style.display = meta.length > 1 ? "" : "none";
    const stepSelect = byId("r-step");
    stepSelect.textContent = "";
    run.steps.forEach((s) => stepSelect.appendChild(new Option(s, s, false, s === state.step)));
    const finish = byId("r-finish");
    finish.textContent = "";
    finish.appendChild(new Option("any", ""));
    const reasons = run.finish.slice();
    if (state.finish && !reasons.includes(state.finish)) reasons.push(state.finish);
    reasons.forEach((f) => finish.appendChild(new Option(f, f)));
    FILTERS.forEach((f) => { byId("r-" + f).value = state[f]; });
    const more = run.available > run.steps.length ?
      " (" + run.steps.length + " of its " + run.available + " sample steps embedded)" : "";
    byId("r-note").textContent = run.note + more;
  }

  function passes(row, prompt) {
    const num = (v) => (v === "" ? null : Number(v));
    const inRange = (v, lo, hi) => (lo === null || v >= lo) && (hi === null || v <= hi);
    if ("final" in row && !inRange(row.final, num(state.min_reward), num(state.max_reward))) {
      return false;
    }
    if ("f1" in row && !inRange(row.f1, num(state.min_f1), num(state.max_f1))) return false;
    if (state.format === "ok" && !(row.fmt >= 1)) return false;
    if (state.format === "bad" && !(row.fmt < 1)) return false;
    if (state.finish && String(row.finish_reason) !== state.finish) return false;
    if (state.q) {
      const q = state.q.toLowerCase();
      const texts = [row.response, row.id];
      if (prompt) texts.push(prompt.story, prompt.question, prompt.answer);
      if (!texts.some((t) => String(t).toLowerCase().includes(q))) return false;
    }
    return true;
  }

  function highlighted(text, q) {
    const pre = el("pre", "response");
    if (!q) { pre.textContent = text; return pre; }
    const lower = text.toLowerCase(), needle = q.toLowerCase();
    let at = 0;
    for (let i = lower.indexOf(needle); i >= 0; i = lower.indexOf(needle, at)) {
      pre.appendChild(document.createTextNode(text.slice(at, i)));
      pre.appendChild(el("mark", "", text.slice(i, i + needle.length)));
      at = i + needle.length;
    }
    pre.appendChild(document.createTextNode(text.slice(at)));
    return pre;
  }

  function promptCard(row, prompt, group) {
    const card = el("div", "prompt");
    card.appendChild(el("div", "id", row.id));
    if (!prompt) {
      card.appendChild(el("p", "empty", "story unknown (see the note above)"));
    } else {
      card.appendChild(el("p", "story", prompt.story));
      card.appendChild(el("p", "question", "Q: " + prompt.question));
      const gold = el("p", "gold", "gold answer: ");
      gold.appendChild(el("b", "", prompt.answer));
      card.appendChild(gold);
      if (prompt.options) {
        const list = el("ol", "options");
        prompt.options.forEach((o) => list.appendChild(el("li", "", o)));
        card.appendChild(list);
      }
    }
    const finals = group.map((r) => r.final).filter((v) => typeof v === "number");
    const mean = finals.reduce((a, b) => a + b, 0) / (finals.length || 1);
    card.appendChild(el("div", "stats", group.length + " samples, mean final reward " +
      fmt(mean, 3)));
    return card;
  }

  function sampleCard(row, columns) {
    const card = el("div", "sample");
    const chips = el("div", "chips");
    chips.appendChild(el("span", "chip", "#" + row.sample));
    columns.forEach(([key, name]) => {
      if (key in row) chips.appendChild(el("span", "chip " + key, name + " " + fmt(row[key], 3)));
    });
    const adv = row.advantage;
    chips.appendChild(el("span", "chip " + (adv > 0 ? "pos" : adv < 0 ? "neg" : ""),
      "advantage " + (adv > 0 ? "+" : "") + fmt(adv, 3)));
    chips.appendChild(el("span", "chip", row.tokens + " tokens"));
    chips.appendChild(el("span", "chip " + (row.finish_reason === "length" ? "length" : ""),
      "finish " + row.finish_reason));
    card.appendChild(chips);
    card.appendChild(highlighted(String(row.response), state.q));
    return card;
  }

  function render() {
    const run = meta[state.run];
    const rows = samples(state.run, state.step);
    const prompts = promptsOf(state.run);
    const groups = [];  // a prompt's G samples are consecutive, sample 0 first
    rows.forEach((row) => {
      const last = groups[groups.length - 1];
      if (!last || row.sample === 0 || row.id !== last[0].id) groups.push([row]);
      else last.push(row);
    });
    const out = document.createDocumentFragment();
    let shown = 0, shownGroups = 0;
    groups.forEach((group) => {
      const prompt = prompts[group[0].id];
      const kept = group.filter((row) => passes(row, prompt));
      if (!kept.length) return;
      shown += kept.length; shownGroups += 1;
      const box = el("article", "group");
      box.appendChild(promptCard(group[0], prompt, group));
      const list = el("div", "responses");
      kept.forEach((row) => list.appendChild(sampleCard(row, run.columns)));
      box.appendChild(list);
      out.appendChild(box);
    });
    const target = byId("r-rows");
    target.textContent = "";
    target.appendChild(out);
    byId("r-count").textContent = "step " + state.step + ": " + shown + " of " + rows.length +
      " samples shown (" + shownGroups + " of " + groups.length + " prompts).";
    byId("r-rows").dataset.shown = shown;
  }

  function update() { writeUrl(); render(); }

  readUrl();
  fillControls();
  render();
  byId("r-run").addEventListener("change", (e) => {
    state.run = +e.target.value;
    const steps = meta[state.run].steps;
    state.step = steps[steps.length - 1];
    fillControls(); update();
  });
  byId("r-step").addEventListener("change", (e) => { state.step = +e.target.value; update(); });
  const move = (by) => {
    const steps = meta[state.run].steps;
    const i = Math.min(steps.length - 1, Math.max(0, steps.indexOf(state.step) + by));
    state.step = steps[i]; byId("r-step").value = state.step; update();
  };
  byId("r-prev").addEventListener("click", () => move(-1));
  byId("r-next").addEventListener("click", () => move(1));
  FILTERS.forEach((f) => byId("r-" + f).addEventListener("input", (e) => {
    state[f] = e.target.value; update();
  }));
  byId("r-reset").addEventListener("click", () => {
    FILTERS.forEach((f) => { state[f] = ""; });
    fillControls(); update();
  });
  // a filter link (#step=...) applies; the section links of the page (#sec-...) do not
  window.addEventListener("hashchange", () => {
    if (location.hash.includes("=")) { readUrl(); fillControls(); render(); }
  });
})();
"""
