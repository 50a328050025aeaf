"""Every shipped tiny experiment file, run end to end in a 1-step, 1-seed form (issue 22: CI keeps
them working): `psyrl experiment` with each trainer cut to one step of a few prompts and each
evaluation to one item per task, in one process per run. Where a file's runs differ only in --set
or args values (Table 2's reward variants and prompts, Table 1's three data sets, Table 3's five
per-benchmark rounds, RQ4's two protocols, the baselines' estimators), one of each kind runs, to
keep CI within its time (each run costs ~7 s of start-up); every run's config with its overrides is
loaded in test_every_run_config_loads. What the full files measure is in docs/experiments.md."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from psyrl.experiment.read import load_experiment
from psyrl.experiment.spec import plan

REPO = Path(__file__).resolve().parent.parent
TINY = sorted((REPO / "experiments").glob("*-tiny.toml"))
ONE_STEP = [
    "run.steps=1",
    "checkpoint.every=1",
    "data.valid_items=2",
    "rollout.prompts=2",
    "rollout.samples=2",
    "rollout.max_new_tokens=4",
    "sampler.batch=4",
    "optim.global_batch=2",
    "optim.micro_batch=2",
    "optim.logprob_micro_batch=2",
    "log.progress=false",
]
# a one-step model answers no multiple-choice item with confidence, so `psyrl self-label` would
# keep nothing: rq4's label sets are put in place (a finished run is skipped) from the demo's own
# training records; self-label itself is tested in tests/eval/
PLACED = {"rq4-tiny": ("labels-split", "labels-all"), "table3-tiny": ("labels-cosmosqa",)}
ONLY = {
    "table2-tiny": ("naive", "sft-median", "bilateral-cache"),
    "table1-tiny": ("sft-set-1-median", "r1-set-1"),
    "table3-tiny": ("sft-median", "psy-interpreter", "after-cosmosqa"),
    "rq4-tiny": ("before-split", "after-split"),
    "baselines-tiny": ("dapo",),
    "testbed-check-tiny": ("sft-cot", "cot"),  # the direct row is table2-tiny naive's kind of run
    # Figure 6 by level: Basic R1 and BR from the stand-in, `evaluate lengths --by benchmark`
    "testbed-tiny": ("fig6",),
    "testbed-choice-tiny": ("cot",),  # its T-GRPO rows are testbed-tiny's on other data (below)
}
# further overrides for one file: baselines-tiny's dapo row sets reward.overlong_buffer = 16, which
# the trainer refuses above rollout.max_new_tokens (ONE_STEP's 4), so its responses get 16 tokens
# and the row runs with its own buffer
EXTRA = {"baselines-tiny": ["rollout.max_new_tokens=16"]}


def smoke(path: Path, out: Path) -> subprocess.CompletedProcess:
    copy = out / path.name  # results.md goes beside the file: keep it out of the checkout
    shutil.copy(path, copy)
    for run in PLACED.get(path.stem, ()):
        (out / "runs" / path.stem / run).mkdir(parents=True, exist_ok=True)
        lines = (REPO / "data/demo/train.jsonl").read_text().splitlines()[:8]
        (out / "runs" / path.stem / run / "self-labelled.jsonl").write_text("\n".join(lines) + "\n")
    args = [
        sys.executable,
        "-m",
        "psyrl",
        "experiment",
        str(copy),
        "--seeds",
        "0",
        "--nproc",
        "1",
        "--limit",
        "1",
        "--eval-args",
        "--max-new-tokens 4 --batch 8",
        "--output-dir",
        str(out / "runs"),
    ]
    args += [a for s in ONE_STEP + EXTRA.get(path.stem, []) for a in ("--set", s)]
    args += [a for run in ONLY.get(path.stem, ()) for a in ("--only", run)]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("path", TINY, ids=[p.stem for p in TINY])
def test_tiny_experiment_runs_end_to_end(tmp_path, path):
    result = smoke(path, tmp_path)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    results = json.loads((tmp_path / path.stem / "results.json").read_text())
    done = {run["run"] for run in results["runs"] if run["status"] == "done"}
    ran = result.stdout.count("psyrl experiment: [")
    assert ran and (not ONLY.get(path.stem) or set(ONLY[path.stem]) <= done), results["runs"]
    if path.stem not in ONLY:
        assert done == {run["run"] for run in results["runs"]}, results["runs"]
    experiment = load_experiment(path)
    for table in results["tables"]:  # every row that ran has its score and interval
        for row in table["rows"]:
            cell = row["cells"]["all items"]["psyrl"]
            parts = experiment.runs[row["run"]].parts or (row["run"],)  # a join: its runs
            if done & set(parts):
                assert cell is not None and cell["low"] <= cell["mean"] <= cell["high"], row
            else:
                assert cell is None, row
    markdown = (tmp_path / path.stem / "results.md").read_text()
    assert all(f"## {t['title']}" in markdown for t in results["tables"])
    for run in results["runs"]:  # Figures 5 and 6 as files, named in results.md
        if run.get("writes", "").endswith(".png") and run["status"] == "done":
            assert Path(run["writes"]).is_file() and run["writes"] in markdown
    # a second invocation finds everything finished and runs nothing
    again = smoke(path, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "$ " not in again.stdout and "done, skipped" in again.stdout


def test_tiny_files_write_figures_5_and_6():
    """The fig6 file draws Figure 6 and Figure 5 (psyrl plot) and counts Figure 6's valid samples
    in a table; CI runs it whole (above)."""
    experiment = load_experiment(REPO / "experiments" / "fig6-tiny.toml")
    assert {r.creates for r in experiment.runs.values() if r.kind == "psyrl"} == {
        "fig5.png",
        "fig6.png",
    }
    assert any(t.metric == "valid" and t.columns == "index" for t in experiment.tables)


def run_config(experiment, unit):
    """A trainer unit's config with the file's overrides, placeholders filled in as a dry run
    would (run from the repository root)."""
    from psyrl.core.config import load_config
    from psyrl.experiment.runner import substitute

    sets = [substitute(experiment, unit, o, dry=True) for o in unit.run.overrides]
    return load_config(unit.run.config, sets)


def trainer_configs(experiment, kinds=("sft", "tgrpo")):
    """Run name -> its resolved config (run_config) for each run of `kinds`, at seed 0 (or the
    run's only unit when it has no seeds)."""
    return {
        u.run.name: run_config(experiment, u)
        for u in plan(experiment)
        if u.run.kind in kinds and u.seed in (0, None)
    }


# tiny SFT runs that stand in for a model the paper starts from, evaluated as it is: table2-tiny's
# for Qwen2.5-Instruct (its prompting rows); fig6-tiny's and rq4-tiny's start RL or self-training
STAND_INS = {
    "table2-tiny": {"instruct"},
    "fig6-tiny": {"sft"},
    "rq4-tiny": {"sft"},
    "testbed-tiny": {"instruct"},
    "testbed-choice-tiny": {"instruct"},
}


@pytest.mark.parametrize(
    "path", sorted((REPO / "experiments").glob("*.toml")), ids=lambda p: p.stem
)
def test_every_sft_row_is_its_runs_median_checkpoint(path, monkeypatch):
    """One rule for every SFT row (appendix B): an evaluation of an SFT run is its median-F1
    checkpoint, chosen on every held-out item in the Qwen files; only a run without checkpoints (a
    continual-learning round) is its final export."""
    monkeypatch.chdir(REPO)
    experiment = load_experiment(path)
    units = {u.run.name: u for u in plan(experiment)}

    def config(name: str):
        return run_config(experiment, units[name])

    rows = {r for t in experiment.tables for r in t.rows}
    rows |= {p for r in set(rows) for p in experiment.runs[r].parts}
    for name in rows:
        run = experiment.runs[name]
        target, _, rule = run.model.partition("@")
        if run.kind == "sft":
            assert config(name).checkpoint.every == 0, name
        elif run.kind != "evaluate" or target in STAND_INS.get(path.stem, ()):
            continue  # a T-GRPO row is its final export, whatever it starts from
        elif target in experiment.runs and experiment.runs[target].kind == "sft":
            assert rule == "median" or config(target).checkpoint.every == 0, name
            if rule == "median" and "qwen" in path.stem:
                cfg = config(target)
                assert cfg.data.valid_items == 0, name  # the whole test split
                assert cfg.data.valid_file == "data/stimuliqa/test.jsonl", name


@pytest.mark.parametrize(
    "path", sorted((REPO / "experiments").glob("*.toml")), ids=lambda p: p.stem
)
def test_every_run_config_loads(path, monkeypatch):
    """Each trainer run's config with the file's overrides (placeholders filled in) is a valid
    config: a bad key or value in any run fails here, not hours into an experiment."""
    monkeypatch.chdir(REPO)
    experiment = load_experiment(path)
    checked = 0
    for unit in plan(experiment):
        if unit.run.kind in ("sft", "tgrpo"):
            run_config(experiment, unit)
            checked += 1
    assert checked


def test_testbed_reward_rows_differ_only_in_the_reward_variant(monkeypatch):
    """Issue 43 item 4: on the testbed, every T-GRPO row shares all but its reward variant (and the
    advantage scope of the eq. 2 pair), so what was chosen on the Basic R1 row (the rollout
    temperature) holds for every row, and the reward's constants are the tiny config's (SPEC's
    δ, τ−, τ+, τ_rep; the paper gives no values)."""
    from psyrl.core.config import config_changes, load_config

    monkeypatch.chdir(REPO)
    experiment = load_experiment(REPO / "experiments" / "testbed-tiny.toml")
    configs = trainer_configs(experiment, ("tgrpo",))
    variants = {"base", "length", "short", "length_rp", "bilateral"}
    assert set(configs) == variants | {"base-cache", "bilateral-cache"}
    base = configs["base"]
    for name, cfg in configs.items():
        changed = set(config_changes(base, cfg))
        assert changed <= {"run.name", "reward.variant", "advantage.scope"}, name
        assert cfg.reward.variant == name.removesuffix("-cache")
        assert cfg.advantage.scope == ("cache" if name.endswith("-cache") else "group")
    tiny = load_config("configs/tgrpo/tiny.toml")
    assert {c for c in config_changes(tiny, base) if c.startswith("reward.")} == {"reward.variant"}
    assert base.rollout.temperature == 1.0  # the paper's (A.3), chosen once on the Basic R1 row


def test_the_length_choice_file_is_the_testbed_file_on_other_data(monkeypatch):
    """testbed-choice-tiny runs testbed-tiny's Basic R1 and BR rows (both scopes) and its
    evaluation unchanged but for the data (nothing chosen again on the new testbed), and the cache
    pair once more with token-mean aggregation."""
    from psyrl.core.config import config_changes

    monkeypatch.chdir(REPO)
    swing = load_experiment(REPO / "experiments" / "testbed-tiny.toml")
    choice = load_experiment(REPO / "experiments" / "testbed-choice-tiny.toml")

    ours, theirs = trainer_configs(choice), trainer_configs(swing)
    shared = {"instruct", "base", "bilateral", "base-cache", "bilateral-cache"}
    assert set(ours) == shared | {"base-cache-token", "bilateral-cache-token"}
    for name, cfg in ours.items():
        # the two token-mean rows are the cache rows with DAPO's loss aggregation
        changed = set(config_changes(theirs[name.removesuffix("-token")], cfg))
        steps = {"run.steps", "checkpoint.every"} if name == "instruct" else set()
        token = {"loss.agg"} if name.endswith("-token") else set()
        expected = {"data.train_file", "data.valid_file"} | steps | token
        assert changed == expected, name
        assert cfg.loss.agg == ("token-mean" if token else "seq-mean-token-mean")
        assert cfg.data.train_file == "data/testbed-choice/train.jsonl"
        assert cfg.data.valid_file == "data/testbed-choice/test.jsonl"
    assert ours["instruct"].run.steps == 800 and theirs["instruct"].run.steps == 400
    assert choice.eval_args == swing.eval_args
    assert choice.eval_benchmarks == tuple(
        b.replace("testbed-swing", "testbed-choice") for b in swing.eval_benchmarks
    )


PREEMPTED_FILE = """
[experiment]
nproc = 1

[evaluate]
benchmarks = ["data/demo/test.jsonl"]
args = ["--max-new-tokens", "4", "--limit", "1", "--no-progress"]

[runs.sft]
kind = "sft"
config = "configs/sft/tiny.toml"
set = ["run.steps=12", "checkpoint.every=3", "data.valid_items=2", "log.progress=false",
       "model.num_layers=1", "model.hidden_size=64", "model.intermediate_size=128",
       "rollout.max_new_tokens=4"]

[[tables]]
rows = ["sft"]
"""


@pytest.mark.slow
def test_preempted_experiment_exits_75_and_the_same_command_finishes(tmp_path):
    """SIGTERM to `psyrl experiment` reaches the trainer (forwarded), which checkpoints at the end
    of its step and exits 75; so does the experiment. The same command then resumes the run (not
    starts it over) and finishes."""
    import signal
    import time

    path = tmp_path / "preempt.toml"
    path.write_text(PREEMPTED_FILE)
    args = [
        sys.executable,
        "-m",
        "psyrl",
        "experiment",
        str(path),
        "--output-dir",
        str(tmp_path / "runs"),
    ]
    process = subprocess.Popen(
        args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    run_dir = tmp_path / "runs" / "preempt" / "sft"
    deadline = time.monotonic() + 300
    while not (run_dir / "checkpoints" / "step-3").is_dir():  # training, past its first save
        assert process.poll() is None and time.monotonic() < deadline, process.stdout.read()
        time.sleep(0.2)
    process.send_signal(signal.SIGTERM)
    output = process.communicate(timeout=300)[0]
    assert process.returncode == 75, output
    assert "sft: preempted by SIGTERM" in output and "run the same command" in output
    assert not (run_dir / "hf").exists()
    again = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "--resume" in again.stdout and "--overwrite" not in again.stdout
    assert (run_dir / "hf" / "config.json").is_file()
    assert (tmp_path / "preempt" / "results.md").is_file()
