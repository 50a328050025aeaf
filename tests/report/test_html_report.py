"""`psyrl report` on real run directories: a 4-step SFT run, a 2-step T-GRPO run that dumps its
samples every step, and an evaluation of the SFT run (one module fixture). The page's curves, tables
and escaping are checked in Python, then in headless Chromium after its JS ran: the rollout rows of
the default step, and filters given in the URL. The page's CSS and JS are files of the package
(psyrl/assets/report/), inlined verbatim, and pyproject.toml ships them in the wheel."""

import json
import os
import re
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from importlib import resources
from pathlib import Path, PurePosixPath

import pytest
import tomli
from click.testing import CliRunner

import psyrl
from psyrl.cli.runs import report_command
from psyrl.core.checkpoints import select_checkpoint
from psyrl.core.records import load_records
from psyrl.core.runlog import read_metrics
from psyrl.report.page import SFT_PANELS, write_report
from psyrl.report.plot import PANELS, series
from psyrl.report.read import read_samples, spaced
from psyrl.report.summary import summary_table

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"  # Debian's package
TINY = [
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.intermediate_size=128",
    "data.valid_items=4",
    "log.progress=false",
]
INJECTED = "</script><b>x</b> \"quoted\" & 'single' <!--"


def launch(args: list[str], log: Path) -> tuple[subprocess.Popen, Path]:
    """A CLI in the background, its output in a file (a pipe nobody reads could fill and block)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    with log.open("w") as f:
        return subprocess.Popen(
            [sys.executable, *args], stdout=f, stderr=subprocess.STDOUT, env=env
        ), log


def finish(started: tuple[subprocess.Popen, Path]) -> None:
    process, log = started
    assert process.wait(timeout=600) == 0, log.read_text()[-5000:]


def trainer(script: str, config: str, sets: list[str], log: Path):
    return launch([script, "--config", config] + [a for s in sets for a in ("--set", s)], log)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    """runs/sft (4 steps, checkpoints with validation at 2 and 4, no samples) with its export
    evaluated in runs/sft/eval-mc, while runs/rl trains from that export, as `make demo` does (its
    rewards vary, a random-init model's are all 0): 2 T-GRPO steps, samples and a checkpoint each,
    no evaluation."""
    out = tmp_path_factory.mktemp("report") / "runs"
    finish(
        trainer(
            "train_sft.py",
            "configs/sft/tiny.toml",
            [
                f"run.output_dir={json.dumps(str(out))}",
                "run.name=sft",
                "run.steps=4",
                "optim.lr=5e-3",
                "checkpoint.every=2",
                "rollout.max_new_tokens=8",
                "sampler.batch=4",
                *TINY,
            ],
            out.parent / "sft.log",
        )
    )
    evaluation = launch(
        [
            "evaluate.py",
            "--model",
            str(out / "sft" / "hf"),
            "--benchmarks",
            "data/demo/mc.jsonl",
            "--limit",
            "1",
            "--max-new-tokens",
            "16",
            "--out",
            str(out / "sft" / "eval-mc"),
            "--no-progress",
        ],
        out.parent / "eval.log",
    )
    finish(
        trainer(
            "train_tgrpo.py",
            "configs/tgrpo/tiny.toml",
            [
                f"run.output_dir={json.dumps(str(out))}",
                "run.name=rl",
                f"model.path={out}/sft/hf",
                "run.steps=2",
                "rollout.prompts=8",
                "rollout.samples=4",
                "optim.global_batch=8",
                "optim.micro_batch=8",
                "optim.logprob_micro_batch=8",
                "rollout.max_new_tokens=24",
                "sampler.batch=32",
                "checkpoint.every=1",
                "log.samples_every=1",
                *TINY,
            ],
            out.parent / "rl.log",
        )
    )
    finish(evaluation)
    return out


def report(*run_dirs, out: Path | None = None, extra=()) -> tuple[Path, str]:
    args = [str(d) for d in run_dirs] + (["--out", str(out)] if out else []) + list(extra)
    result = CliRunner().invoke(report_command, args)
    assert result.exit_code == 0, result.output
    path = out or Path(run_dirs[0]) / "report.html"
    assert f"wrote {path}" in result.output
    return path, path.read_text(encoding="utf-8")


@pytest.fixture(scope="module")
def page(runs, tmp_path_factory) -> tuple[Path, str]:
    return report(runs / "rl", runs / "sft", out=tmp_path_factory.mktemp("page") / "both.html")


class Dom(HTMLParser):
    """Every element of a page with its attributes, children and text (descendants' included)."""

    VOID = {
        "area",
        "base",
        "br",
        "col",
        "embed",
        "hr",
        "img",
        "input",
        "link",
        "meta",
        "source",
        "track",
        "wbr",
    }

    def __init__(self, text: str):
        super().__init__(convert_charrefs=True)
        self.nodes, self.stack = [], []
        self.feed(text)
        self.close()

    def handle_starttag(self, tag, attrs):
        node = {"tag": tag, "attrs": dict(attrs), "children": [], "text": []}
        if self.stack:
            self.stack[-1]["children"].append(node)
        self.nodes.append(node)
        if tag not in self.VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in self.VOID:
            self.stack.pop()

    def handle_endtag(self, tag):
        for i in range(len(self.stack) - 1, -1, -1):
            if self.stack[i]["tag"] == tag:
                del self.stack[i:]
                return

    def handle_data(self, data):
        for node in self.stack:
            node["text"].append(data)

    def find(self, tag: str, **attrs) -> list[dict]:
        return [
            n
            for n in self.nodes
            if n["tag"] == tag and all(n["attrs"].get(k.rstrip("_")) == v for k, v in attrs.items())
        ]


def text(node) -> str:
    return "".join(node["text"]).strip()


def table_rows(table: dict) -> list[list[dict]]:
    """The cells (th or td nodes) of each row."""
    rows, todo = [], [table]
    while todo:
        node = todo.pop(0)
        if node["tag"] == "tr":
            rows.append([c for c in node["children"] if c["tag"] in ("th", "td")])
        else:
            todo[:0] = node["children"]
    return rows


def shown_count(
    rows: list[dict], prompts: dict, finish=None, q=None, min_reward=None, max_f1=None
) -> int:
    """The samples the page's filters keep (its JS `passes`), computed from the files."""

    def keep(r):
        prompt = prompts.get(r["id"])
        texts = [r["response"], r["id"]] + (
            [prompt.stimuli, prompt.question, prompt.answer] if prompt else []
        )
        return (
            (finish is None or r["finish_reason"] == finish)
            and (q is None or any(q.lower() in t.lower() for t in texts))
            and (min_reward is None or r["final"] >= min_reward)
            and (max_f1 is None or r["f1"] <= max_f1)
        )

    return sum(map(keep, rows))


# ---------------------------------------------------------------- the HTML, checked in Python


def test_curves_draw_a_path_per_metric_and_run(runs, page):
    _, html = page
    dom = Dom(html)
    logged = {label: read_metrics(runs / label / "metrics.jsonl") for label in ("rl", "sft")}
    drawn = [m for m, _ in PANELS + SFT_PANELS if any(series(r, m)[0] for r in logged.values())]
    assert [n["attrs"]["data-metric"] for n in dom.find("svg", class_="panel")] == drawn
    assert "train/loss" in drawn and "reward/final" in drawn
    for metric in drawn:
        for label, rows in logged.items():
            paths = dom.find("path", class_="line", **{"data-run": label, "data-metric": metric})
            steps, _ = series(rows, metric)
            if not steps:
                assert not paths
                continue
            # one point per logged step: M x,y then L x,y for each further step
            assert len(paths) == 1 and paths[0]["attrs"]["d"].count("L") == len(steps) - 1
    # the per-step curves also get their raw thin line (smoothing 5), the validation scores dots
    assert dom.find("path", class_="raw", **{"data-run": "rl", "data-metric": "reward/final"})
    assert (
        len(dom.find("circle", class_="dot", **{"data-run": "sft", "data-metric": "valid/f1"})) == 3
    )  # 0, 2, 4


def test_tables_hold_the_numbers_of_the_files(runs, page):
    _, html = page
    dom = Dom(html)
    for label in ("rl", "sft"):
        table = dom.find("table", class_="validation", **{"data-run": label})[0]
        head, *body = table_rows(table)
        columns = [text(c) for c in head]
        start = read_metrics(runs / label / "metrics.jsonl")[0]
        expected = {0: start}
        for d in sorted((runs / label / "checkpoints").iterdir()):
            expected[int(d.name.split("-")[1])] = json.loads((d / "validation.json").read_text())
        assert [int(text(row[0])) for row in body] == sorted(expected)
        for row in body:
            scores = expected[int(text(row[0]))]
            for name, cell in zip(columns[1:-1], row[1:-1]):
                assert float(cell["attrs"]["data-value"]) == scores[f"valid/{name}"], (label, name)
    # appendix B's median-F1 checkpoint of the SFT run is marked
    chosen, _, _ = select_checkpoint(runs / "sft", "median")
    sft_rows = table_rows(dom.find("table", class_="validation", **{"data-run": "sft"})[0])
    marked = [int(text(r[0])) for r in sft_rows[1:] if "median F1" in text(r[-1])]
    assert marked == [chosen]
    # the summary is `psyrl summary`'s table, cell for cell
    markdown = summary_table([runs / "rl", runs / "sft"], 5).splitlines()
    summary = table_rows(dom.find("table", class_="md")[0])
    cells = [[c.strip() for c in line.strip("| ").split(" | ")] for line in markdown]
    assert [[text(c) for c in row] for row in summary] == [cells[0]] + cells[2:]
    # the evaluation: per task n and F1 (x100, 2 digits) as results.json holds them
    results = json.loads((runs / "sft" / "eval-mc" / "results.json").read_text())["results"]
    evaluation = dom.find("div", class_="evaluation", **{"data-dir": "eval-mc"})[0]
    tables = [n for n in all_below(evaluation) if n["tag"] == "table"]
    per_task = {
        (text(r[0]), text(r[1])): (text(r[2]), text(r[3])) for r in table_rows(tables[-1])[1:]
    }
    for task, s in results["demo"]["tasks"].items():
        assert per_task[("demo", task)] == (str(s["count"]), f"{s['f1']:.2f}")
    # the resolved config, verbatim (escaped)
    config = (runs / "rl" / "config.resolved.toml").read_text()
    assert any(text(n) == config.strip() for n in dom.find("pre"))


def all_below(node) -> list[dict]:
    """The descendants of a node, in document order."""
    return [d for child in node["children"] for d in [child, *all_below(child)]]


def with_injected_response(runs: Path, out: Path) -> Path:
    """A copy of the T-GRPO run (metrics, config, samples) whose first sample of step 1 says
    INJECTED."""
    run = out / "injected"
    (run / "samples").mkdir(parents=True)
    for name in ("metrics.jsonl", "config.resolved.toml"):
        shutil.copy(runs / "rl" / name, run / name)
    for path in (runs / "rl" / "samples").glob("step-*.jsonl"):
        rows = read_samples(path)
        if path.name == "step-1.jsonl":
            rows[0]["response"] = INJECTED
        (run / "samples" / path.name).write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run


def test_a_response_cannot_break_out_of_its_json_block(runs, tmp_path):
    _, html = report(with_injected_response(runs, tmp_path))
    assert "</script><b>x</b>" not in html and "<!--" not in html
    dom = Dom(html)
    block = dom.find("script", type="application/json", id="samples-0-1")[0]
    assert json.loads(text(block))[0]["response"] == INJECTED
    assert not dom.find("b")  # the markup stayed text


def test_runs_without_samples_or_evaluation_still_make_a_page(runs, tmp_path):
    _, html = report(runs / "sft", out=tmp_path / "sft.html")
    assert "No rollout samples" in html and 'id="rollout-meta"' not in html
    assert not (runs / "sft" / "report.html").exists()  # --out given
    _, html = report(runs / "rl", out=tmp_path / "rl.html")
    assert "No evaluation results" in html and 'class="evaluation"' not in html
    Dom(html)  # parses


def test_a_long_run_embeds_evenly_spaced_sample_steps(runs, tmp_path):
    assert spaced(list(range(10)), 4) == [0, 3, 6, 9] and spaced([1, 2], 0) == [1, 2]
    assert spaced(list(range(10)), 1) == [9]  # the newest
    _, html = report(runs / "rl", out=tmp_path / "one.html", extra=["--sample-steps", "1"])
    assert 'id="samples-0-2"' in html and 'id="samples-0-1"' not in html
    meta = json.loads(text(Dom(html).find("script", id="rollout-meta")[0]))
    assert meta[0]["steps"] == [2] and meta[0]["available"] == 2


def test_bad_input_names_the_file_and_line(runs, tmp_path):
    runner = CliRunner()
    (tmp_path / "empty").mkdir()
    result = runner.invoke(report_command, [str(tmp_path / "empty")])
    assert result.exit_code == 1 and f"{tmp_path / 'empty' / 'metrics.jsonl'}: not found" in (
        result.output
    )
    broken = tmp_path / "broken"
    shutil.copytree(runs / "rl" / "samples", broken / "samples")
    lines = (runs / "rl" / "metrics.jsonl").read_text().splitlines()
    (broken / "metrics.jsonl").write_text(lines[0] + "\n{not json\n")
    result = runner.invoke(report_command, [str(broken)])
    assert result.exit_code == 1 and f"{broken / 'metrics.jsonl'}:2: invalid JSON" in result.output
    (broken / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    samples = broken / "samples" / "step-2.jsonl"
    lines = samples.read_text().splitlines()
    samples.write_text("\n".join(lines + ['{"id": "x"}']) + "\n")
    result = runner.invoke(report_command, [str(broken)])
    assert result.exit_code == 1
    assert f"{samples}:{len(lines) + 1}: missing sample, response" in result.output


# ---------------------------------------------------------------- the assets


def asset_text(name: str) -> str:
    return (resources.files("psyrl") / "assets" / "report" / name).read_text(encoding="utf-8")


def test_the_css_and_js_files_are_inlined_verbatim(tmp_path):
    """A run with nothing but metrics.jsonl is enough: the page inlines the package's asset files
    byte for byte and fetches nothing (no src= or href= to another file)."""
    run = tmp_path / "run"
    run.mkdir()
    rows = [{"step": 0, "valid/f1": 0.1}, {"step": 1, "train/loss": 2.0, "valid/f1": 0.2}]
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    html = write_report([run], tmp_path / "page.html").read_text(encoding="utf-8")
    css, js = asset_text("report.css"), asset_text("report.js")
    assert "svg.panel" in css and '"use strict";' in js  # the real files, not empty ones
    assert html.count(f"<style>\n{css}</style>") == 1
    assert html.count(f"<script>\n{js}</script>") == 1
    assert "src=" not in html and "<link" not in html
    assert all(href.startswith("#") for href in re.findall(r'href="([^"]*)"', html))


def test_pyproject_ships_every_report_asset():
    """Every file under psyrl/assets/report/ matches a [tool.setuptools.package-data] pattern,
    matched as setuptools globs it from the package folder (`*` within one path segment)."""
    package = Path(psyrl.__file__).parent
    pyproject = tomli.loads((package.parent / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["psyrl"]
    files = [p.relative_to(package) for p in (package / "assets" / "report").rglob("*")]
    files = [PurePosixPath(f.as_posix()) for f in files if (package / f).is_file()]
    assert {f.name for f in files} >= {"report.css", "report.js"}

    def shipped(path: PurePosixPath) -> bool:
        # Path.match matches from the right: equal segment counts make it a whole-path match
        return any(
            len(path.parts) == len(PurePosixPath(p).parts) and path.match(p) for p in patterns
        )

    assert [f for f in files if not shipped(f)] == []


# ---------------------------------------------------------------- the page in a real browser


def chromium(tmp_path: Path, url: str, *flags: str) -> str:
    """The page's DOM after its scripts ran (with --dump-dom); a script error fails the test."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"needs Debian's chromium at {CHROMIUM}: apt-get install -y chromium")
    args = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--enable-logging=stderr",
        f"--user-data-dir={tmp_path / 'chromium-profile'}",
        *flags,
        url,
    ]
    result = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    errors = [line for line in result.stderr.splitlines() if "Uncaught" in line]
    assert not errors, errors
    return result.stdout


# Loads the report in a frame, moves the mouse onto the right edge of a panel and copies the
# readout out: --dump-dom shows only the top document.
HOVER = """<iframe id="f" src="%s" width="1280" height="2000"></iframe><pre id="out"></pre>
<script>document.getElementById("f").onload = () => {
  const svg = document.getElementById("f").contentDocument.querySelector(
    'svg.panel[data-metric="valid/f1"]');
  const box = svg.getBoundingClientRect();
  svg.dispatchEvent(new MouseEvent("mousemove", {clientX: box.left + box.width * 0.99,
    clientY: box.top + box.height / 2, bubbles: true}));
  const spans = svg.parentNode.querySelectorAll(".readout span");
  document.getElementById("out").textContent = JSON.stringify(
    [...spans].map((s) => s.textContent));
};</script>"""


def test_the_page_in_headless_chromium(runs, page, tmp_path):
    path, _ = page
    url = path.resolve().as_uri()
    dom = Dom(chromium(tmp_path, url, "--dump-dom"))
    assert len(dom.find("svg", class_="panel")) >= 10
    assert len(dom.find("table", class_="validation")) == 2
    assert dom.find("div", class_="evaluation", **{"data-dir": "eval-mc"})
    # hovering a panel near its last step reads out each run's last validation
    harness = path.parent / "hover.html"
    harness.write_text(HOVER % path.name)
    hover = Dom(
        chromium(
            tmp_path, harness.resolve().as_uri(), "--allow-file-access-from-files", "--dump-dom"
        )
    )
    last = {
        label: series(read_metrics(runs / label / "metrics.jsonl"), "valid/f1")
        for label in ("rl", "sft")
    }
    assert json.loads(text(hover.find("pre", id="out")[0])) == [
        f"{label} {values[-1]:.4f} @ {steps[-1]}" for label, (steps, values) in last.items()
    ]
    # the default step is the last: all its samples, grouped by prompt, rendered by the JS
    rows = read_samples(runs / "rl" / "samples" / "step-2.jsonl")
    target = dom.find("div", id="r-rows")[0]
    assert (
        target["attrs"]["data-shown"]
        == str(len(rows))
        == str(len(dom.find("div", class_="sample")))
    )
    assert len(dom.find("article", class_="group")) == len(rows) // 4  # G = 4
    # (HTML serialises a carriage return as a line feed)
    assert [text(n) for n in dom.find("pre", class_="response")] == [
        r["response"].replace("\r\n", "\n").replace("\r", "\n").strip() for r in rows
    ]
    # the story and the gold answer beside each prompt's responses
    prompts = {r.id: r for r in load_records("data/demo/train.jsonl")}
    stories = [text(n) for n in dom.find("p", class_="story")]
    assert stories == [prompts[r["id"]].stimuli for r in rows[::4]]

    # filters from the fragment: step 1, the first sample's finish reason, a word of its response
    rows = read_samples(runs / "rl" / "samples" / "step-1.jsonl")
    word = max(rows[0]["response"].split(), key=len)
    finish = rows[0]["finish_reason"]
    expected = shown_count(rows, prompts, finish=finish, q=word)
    assert 1 <= expected
    query = f"#step=1&finish={finish}&q={word}"
    dom = Dom(chromium(tmp_path, url + query.replace(" ", "%20"), "--dump-dom"))
    assert len(dom.find("div", class_="sample")) == expected
    assert all(word.lower() in text(m).lower() for m in dom.find("mark"))
    # ... and from a query string: the samples with a positive reward (the step that has some)
    step, rows = max(
        ((s, read_samples(runs / "rl" / "samples" / f"step-{s}.jsonl")) for s in (1, 2)),
        key=lambda found: sum(r["final"] > 0 for r in found[1]),
    )
    least = min([r["final"] for r in rows if r["final"] > 0] or [0.01])
    expected = shown_count(rows, prompts, min_reward=least, max_f1=1.0)
    dom = Dom(chromium(tmp_path, url + f"?step={step}&min_reward={least!r}&max_f1=1", "--dump-dom"))
    assert len(dom.find("div", class_="sample")) == expected

    # a response holding markup shows as text in the browser too
    injected, _ = report(with_injected_response(runs, tmp_path))
    dom = Dom(
        chromium(tmp_path, injected.resolve().as_uri() + "#step=1&q=%3C%2Fscript%3E", "--dump-dom")
    )
    assert [text(n) for n in dom.find("pre", class_="response")] == [INJECTED.strip()]
    assert not [n for n in dom.find("b") if text(n) == "x"]

    # an SFT run alone: no rollouts, the JS runs through
    sft, _ = report(runs / "sft", out=tmp_path / "sft.html")
    dom = Dom(chromium(tmp_path, sft.resolve().as_uri(), "--dump-dom"))
    assert dom.find("svg", class_="panel") and not dom.find("div", id="r-rows")

    shot = tmp_path / "report.png"
    chromium(tmp_path, url, f"--screenshot={shot}", "--window-size=1280,2000")
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 50_000
