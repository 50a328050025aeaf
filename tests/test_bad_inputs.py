"""Every bad input a person produces, tried on every command that reads one, in one table.

Each case must end with a non-zero exit and one message that names the file (and the line, where the
input has lines), without a traceback, and must write nothing: not in its output directory, not
beside it, and not in an existing run of the same name. The count is in docs/runs.md."""

import csv
import hashlib
import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

import evaluate
from psyrl.cli import train as cli_train
from psyrl.cli.main import main as psyrl
from psyrl.core.config import ModelConfig
from psyrl.runtime.model import load_model, load_tokenizer

GOOD_STIMULIQA = Path("data/demo/train.jsonl").read_text().splitlines()[:16]
GOOD_BENCHMARK = Path("data/demo/mc.jsonl").read_text().splitlines()[:4]
GOOD_TABLE = [
    json.dumps(dict(zip(("id", "stimuli", "B_disap", "B_anger"), row[:4])))
    for row in csv.reader(Path("data/build/stimuli.csv").open())
    if row[0] != "id"
][:4]
TINY = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64)


# ------------------------------------------------------------------ the bad inputs, by kind of slot
def data_file(kind: str, ws: Path, good: list[str], huge: Path) -> tuple[Path, int | None]:
    """A JSONL file that is bad in the way `kind` says; the line a message must name, if any."""
    path = ws / "in" / f"{kind}.jsonl"
    path.parent.mkdir(exist_ok=True)
    line = None
    if kind == "missing":
        return path, None
    if kind == "directory":
        path.mkdir()
    elif kind == "empty":
        path.write_text("")
    elif kind == "not_utf8":
        path.write_bytes((good[0] + "\n").encode() + b'{"id": "\xff\xfe"}\n')
        line = 2
    elif kind == "truncated":
        path.write_text(good[0] + "\n" + good[1][: len(good[1]) // 2] + "\n")
        line = 2
    elif kind == "wrong_schema":
        path.write_text(good[0] + "\n" + json.dumps({"id": "x", "text": "no question"}) + "\n")
        line = 2
    elif kind == "duplicate_ids":
        path.write_text(good[0] + "\n" + good[0] + "\n")
        line = 2
    elif kind == "huge_line":  # 100 MB on one line, not a record (one file, linked)
        path.symlink_to(huge)
        line = 1
    return path, line


DATA_KINDS = [
    "missing",
    "empty",
    "directory",
    "not_utf8",
    "truncated",
    "wrong_schema",
    "duplicate_ids",
    "huge_line",
]


def config_file(kind: str, ws: Path) -> tuple[Path, int | None]:
    path = ws / "in" / f"{kind}.toml"
    path.parent.mkdir(exist_ok=True)
    text = {
        "truncated_toml": '[run]\nname = "x"\n[optim\nlr = 1e-4\n',
        "unknown_key": '[run]\nname = "x"\nstepz = 3\n',
        "negative": '[run]\nname = "x"\n[optim]\nlr = -1e-4\n',
        "non_finite": "[optim]\nlr = nan\n",
    }.get(kind)
    line = {"truncated_toml": 3, "unknown_key": 3, "negative": 4, "non_finite": 2}.get(kind)
    if kind == "directory":
        path.mkdir()
    elif kind == "not_utf8":
        path.write_bytes(b'[run]\nname = "\xff"\n')
        line = None  # a decoder error names the file; TOML never got a line
    elif text is not None:
        path.write_text(text)
    return path, line


CONFIG_KINDS = [
    "missing",
    "directory",
    "not_utf8",
    "truncated_toml",
    "unknown_key",
    "negative",
    "non_finite",
]
SET_KINDS = {
    "set_without_value": "run.steps",
    "set_unknown_key": "run.stepz=3",
    "set_bad_type": "run.steps=many",
    "set_negative": "optim.lr=-1",
}


def model_dir(kind: str, ws: Path, good: Path) -> Path:
    path = ws / "in" / f"model-{kind}"
    if kind == "missing":
        return path
    if kind == "no_weights":
        path.mkdir(parents=True)
        for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
            (path / name).write_bytes((good / name).read_bytes())
    elif kind == "remote_code":
        path.mkdir(parents=True)
        for f in good.iterdir():
            (path / f.name).write_bytes(f.read_bytes())
        config = json.loads((path / "config.json").read_text())
        config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilForCausalLM"}
        (path / "config.json").write_text(json.dumps(config))
        (path / "modeling_evil.py").write_text("raise SystemExit('remote code ran')\n")
    elif kind == "no_chat_template":
        path.mkdir(parents=True)
        for f in good.iterdir():
            (path / f.name).write_bytes(f.read_bytes())
        tokenizer_config = json.loads((path / "tokenizer_config.json").read_text())
        tokenizer_config.pop("chat_template", None)
        (path / "tokenizer_config.json").write_text(json.dumps(tokenizer_config))
        (path / "chat_template.jinja").unlink(missing_ok=True)
    return path


MODEL_KINDS = ["missing", "no_weights", "remote_code", "no_chat_template"]
RUN_KINDS = ["run_without_metrics", "run_not_utf8", "run_truncated", "run_wrong_schema"]
EVAL_KINDS = ["eval_empty", "eval_truncated"]


def run_dir(kind: str, ws: Path) -> tuple[Path, Path, int | None]:
    """A run directory with a bad metrics.jsonl: (the run, the file a message names, its line)."""
    run = ws / "in" / kind
    run.mkdir(parents=True)
    metrics = run / "metrics.jsonl"
    good = '{"step": 1, "steps": 2, "reward/final": 0.5, "reward/f1": 0.4}\n'
    if kind == "run_without_metrics":
        return run, metrics, None
    metrics.write_bytes(
        {
            "run_not_utf8": good.encode() + b'{"step": 2, "x": "\xff"}\n',
            "run_truncated": (good + good[:20] + "\n").encode(),
            "run_wrong_schema": (good + '{"reward/final": 0.5}\n').encode(),
        }[kind]
    )
    return run, metrics, 2


def eval_dir(kind: str, ws: Path) -> tuple[Path, Path, int | None]:
    """An evaluate.py --out directory, empty or with a cut results.json and predictions.jsonl."""
    out = ws / "in" / kind
    out.mkdir(parents=True)
    if kind == "eval_empty":  # each command names the file it missed first
        return out, out, None
    (out / "results.json").write_text('{"settings": {"prompt": "cot"}, "results": {"tomb')
    (out / "predictions.jsonl").write_text('{"id": "a", "benchmark": "tombench", "respo\n')
    return out, out, None


OUT_KINDS = ["out_is_file", "out_read_only"]


def out_dir(kind: str, ws: Path) -> Path:
    if kind == "out_is_file":
        path = ws / "in" / "out-file"
        path.parent.mkdir(exist_ok=True)
        path.write_text("a file, not a directory\n")
        return path
    if os.geteuid() == 0:  # root ignores permission bits; sysfs refuses even root a directory
        if not Path("/sys").is_dir():
            pytest.skip("running as root without /sys: no directory this user cannot write")
        return Path("/sys/psyrl-out")
    locked = ws / "in" / "locked"
    locked.mkdir(parents=True, exist_ok=True)
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return locked / "out"


# a column that no row of the file has is named with the file, without a line
NO_LINE = {("psyrl data convert", "huge_line")}


# ---------------------------------------------------------------- the commands and their slots
def trainer_args(
    script: str, config: str, ws: Path, data=None, model=None, out=None, cfg=None, sets=()
):
    args = [
        "--config",
        str(cfg or config),
        "--set",
        f"run.output_dir={json.dumps(str(out or ws / 'runs'))}",
        "--set",
        "run.name=fresh",
        "--set",
        "run.steps=1",
        "--set",
        "log.progress=false",
        "--set",
        'data.valid_file=""',
        "--set",
        f"data.train_file={data or ws / 'good.jsonl'}",
        "--set",
        f"model.path={model or ws / 'model'}",
        "--set",
        'model.tokenizer=""',
    ]
    for s in sets:
        args += ["--set", s]
    return getattr(cli_train, script), args  # the command the script parses for


COMMANDS = {
    "train_sft.py": (
        lambda ws, **k: trainer_args("train_sft", "configs/sft/tiny.toml", ws, **k),
        ["data", "config", "set", "model", "out"],
    ),
    "train_tgrpo.py": (
        lambda ws, **k: trainer_args("train_tgrpo", "configs/tgrpo/tiny.toml", ws, **k),
        ["data", "config", "set", "model", "out"],
    ),
    "evaluate.py": (
        lambda ws, data=None, model=None, out=None: (
            evaluate.evaluate,
            [
                "--model",
                str(model or ws / "model"),
                "--benchmarks",
                str(data or ws / "good-mc.jsonl"),
                "--out",
                str(out or ws / "eval"),
                "--max-new-tokens",
                "4",
                "--no-progress",
            ],
        ),
        ["data", "model", "out"],
    ),
    # the tokenizer from elsewhere: the model directory is still checked before any write
    "evaluate.py --tokenizer tiny": (
        lambda ws, model: (
            evaluate.evaluate,
            [
                "--model",
                str(model),
                "--tokenizer",
                "tiny",
                "--benchmarks",
                str(ws / "good-mc.jsonl"),
                "--out",
                str(ws / "eval"),
                "--max-new-tokens",
                "4",
                "--no-progress",
            ],
        ),
        ["weights"],
    ),
    "psyrl data check": (lambda ws, data: (psyrl, ["data", "check", str(data)]), ["data"]),
    "psyrl data convert": (
        lambda ws, data=None, out=None: (
            psyrl,
            [
                "data",
                "convert",
                str(data or ws / "good.jsonl"),
                "--to",
                "stimuliqa",
                "--map",
                "question=question,answer=answer,stimuli=stimuli,id=id",
                "--out",
                str((out / "x.jsonl") if out else ws / "converted.jsonl"),
            ],
        ),
        ["data", "out"],
    ),
    "psyrl config show": (
        lambda ws, cfg=None, sets=(): (
            psyrl,
            [
                "config",
                "show",
                *(["--config", str(cfg)] if cfg else []),
                *[a for s in sets for a in ("--set", s)],
            ],
        ),
        ["config", "set"],
    ),
    "psyrl plan": (
        lambda ws, cfg=None, sets=(): (
            psyrl,
            [
                "plan",
                "--config",
                str(cfg or "configs/tgrpo/tiny.toml"),
                *[a for s in sets for a in ("--set", s)],
            ],
        ),
        ["config", "set"],
    ),
    "psyrl demo-data": (lambda ws, out: (psyrl, ["demo-data", "--out", str(out)]), ["out"]),
    "psyrl summary": (lambda ws, run: (psyrl, ["summary", str(run)]), ["run"]),
    "psyrl plot": (
        lambda ws, run: (psyrl, ["plot", str(run), "--out", str(ws / "p.png")]),
        ["run"],
    ),
    "psyrl report": (
        lambda ws, run: (psyrl, ["report", str(run), "--out", str(ws / "r.html")]),
        ["run"],
    ),
    "psyrl select-checkpoint": (lambda ws, run: (psyrl, ["select-checkpoint", str(run)]), ["ckpt"]),
    "psyrl evaluate compare": (
        lambda ws, run: (psyrl, ["evaluate", "compare", str(run)]),
        ["eval"],
    ),
    "psyrl evaluate lengths": (
        lambda ws, run: (psyrl, ["evaluate", "lengths", str(run), "--out", str(ws / "l.png")]),
        ["eval"],
    ),
    "psyrl self-label": (
        lambda ws, run: (psyrl, ["self-label", str(run), "--out", str(ws / "s.jsonl")]),
        ["eval"],
    ),
    "psyrl build qa": (
        lambda ws, data=None, cfg=None, model=None, out=None: (
            psyrl,
            [
                "build",
                "qa",
                "--catalogue",
                str(cfg or "data/build/catalogue.toml"),
                "--table",
                str(data or ws / "good-table.jsonl"),
                "--model",
                str(model or ws / "model"),
                "--out",
                str(out or ws / "built"),
                "--max-new-tokens",
                "4",
                "--no-progress",
            ],
        ),
        ["data", "catalogue", "model", "out"],
    ),
}


def cases():
    for command, (_, slots) in COMMANDS.items():
        kinds = {
            "data": DATA_KINDS,
            "config": CONFIG_KINDS,
            "set": list(SET_KINDS),
            "model": MODEL_KINDS,
            "out": OUT_KINDS,
            "run": RUN_KINDS,
            "eval": EVAL_KINDS,
            "catalogue": CONFIG_KINDS[:4],
            "ckpt": ["no_checkpoints"],
            "weights": MODEL_KINDS[:3],
        }
        for slot in slots:
            for kind in kinds[slot]:
                yield pytest.param(command, slot, kind, id=f"{command}-{kind}")


# ------------------------------------------------------------------------------- the workspace
def snapshot(root: Path) -> dict[str, str]:
    """Every file and directory under root with a hash of its bytes (directories: '')."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            found[os.path.join(dirpath, d)] = ""
        for f in filenames:
            path = os.path.join(dirpath, f)
            if os.path.getsize(path) > 10_000_000:  # the 100 MB line: its size and time suffice
                found[path] = f"{os.path.getsize(path)}:{os.path.getmtime(path)}"
            else:
                found[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
    return found


@pytest.fixture(scope="module")
def huge(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("huge") / "line.jsonl"
    with path.open("w") as f:
        f.write('{"id": "big", "question": "' + "x" * 100_000_000 + '"}\n')
    return path


@pytest.fixture(scope="module")
def good_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("good") / "model"
    tokenizer = load_tokenizer(TINY)
    load_model(TINY, tokenizer, seed=0).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


@pytest.mark.parametrize("command,slot,kind", list(cases()))
def test_bad_input(command, slot, kind, tmp_path, good_model, huge):
    ws = tmp_path
    (ws / "good.jsonl").write_text("\n".join(GOOD_STIMULIQA) + "\n")
    (ws / "good-mc.jsonl").write_text("\n".join(GOOD_BENCHMARK) + "\n")
    (ws / "good-table.jsonl").write_text("\n".join(GOOD_TABLE) + "\n")
    (ws / "model").symlink_to(good_model)
    existing = ws / "runs" / "existing"  # a run beside: a bad command must leave it as it is
    existing.mkdir(parents=True)
    (existing / "metrics.jsonl").write_text('{"step": 1, "train/loss": 1.0}\n')
    build, _ = COMMANDS[command]
    line = None
    if slot == "data":
        good = {"evaluate.py": GOOD_BENCHMARK, "psyrl build qa": GOOD_TABLE}
        bad, line = data_file(kind, ws, good.get(command, GOOD_STIMULIQA), huge)
        kwargs, named = {"data": bad}, bad
    elif slot in ("config", "catalogue"):
        bad, line = config_file(kind, ws)
        kwargs, named = {"cfg": bad}, bad
    elif slot == "run":
        bad, named, line = run_dir(kind, ws)
        kwargs = {"run": bad}
    elif slot == "ckpt":  # a run directory without a checkpoint to choose
        bad = named = ws / "in" / kind
        bad.mkdir(parents=True)
        kwargs = {"run": bad}
    elif slot == "eval":
        bad, named, line = eval_dir(kind, ws)
        kwargs = {"run": bad}
    elif slot == "set":
        kwargs, named = {"sets": [SET_KINDS[kind]]}, SET_KINDS[kind].split("=")[0]
    elif slot in ("model", "weights"):  # weights: the model directory without its tokenizer
        bad = model_dir(kind, ws, good_model)
        kwargs, named = {"model": bad}, bad
    else:
        bad = out_dir(kind, ws)
        kwargs, named = {"out": bad}, bad
    target, args = build(ws, **kwargs)
    before = snapshot(ws)
    try:
        result = CliRunner().invoke(target, args)
    finally:
        (ws / "in" / "locked").exists() and (ws / "in" / "locked").chmod(0o755)
    output = result.output
    assert result.exit_code not in (0, None), output[-2000:]
    assert isinstance(result.exception, SystemExit), (type(result.exception), output[-3000:])
    assert "Traceback" not in output, output[-3000:]
    # the file (or the key) is named, and its line where it has one
    assert str(named) in output or Path(str(named)).name in output, output[-2000:]
    if line is not None and (command, kind) not in NO_LINE:
        assert f":{line}" in output or f"line {line}" in output, output[-2000:]
    assert snapshot(ws) == before
