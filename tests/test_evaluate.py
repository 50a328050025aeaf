"""`evaluate.py` end to end on a tiny random model: every benchmark on 2 ranks, resume, compare,
lengths, self-label into train_sft.py, and the refusals of bad input."""

import json
import os
import subprocess
import sys
from functools import partial
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

import evaluate as evaluate_script
from psyrl.cli.main import main as psyrl_main
from psyrl.core.config import ModelConfig
from psyrl.core.records import load_benchmark
from psyrl.eval.benchmarks import PAPER_BENCHMARKS, resolve_sources, select_items
from psyrl.runtime.model import load_model, load_tokenizer

run = partial(subprocess.run, capture_output=True, text=True)

ALL = list(PAPER_BENCHMARKS) + ["emobench", "data/demo/test.jsonl", "data/demo/mc.jsonl"]
FAST = ["--max-new-tokens", "6", "--no-progress"]
FIELDS = {
    "id",
    "benchmark",
    "task",
    "index",
    "prompt",
    "response",
    "extracted",
    "f1",
    "format",
    "tokens",
    "finish",
    "mean_logprob",
    "option_f1",
    "choice",
    "correct",
}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    """A random-init tiny Qwen2 exported like a psyrl run's hf/ (weights, config, tokenizer)."""
    out = tmp_path_factory.mktemp("model") / "hf"
    cfg = ModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
    )
    tokenizer = load_tokenizer(cfg)
    load_model(cfg, tokenizer, seed=0).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def evaluate(*args, ranks=1):
    launcher = (
        [sys.executable]
        if ranks == 1
        else [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            str(ranks),
        ]
    )
    return run(launcher + ["evaluate.py", *map(str, args)], timeout=600)


def here(command, *args) -> Result:
    """A click command (evaluate.py's, or `psyrl`) in this process, one rank: for tests about its
    input and output, not its launcher (a process of its own costs 4-7 s of imports)."""
    return CliRunner().invoke(command, [str(a) for a in args])


def lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.mark.slow
def test_every_benchmark_on_two_ranks_then_resume(tiny_model, tmp_path):
    out = tmp_path / "eval"
    args = [
        "--model",
        tiny_model,
        "--benchmarks",
        ",".join(ALL),
        "--limit",
        1,
        "--out",
        out,
        "--batch",
        4,
        *FAST,
    ]
    result = evaluate(*args, ranks=2)
    assert result.returncode == 0, result.stderr[-3000:]
    expected = [
        r.id
        for s in resolve_sources(ALL, "data/benchmarks")
        for r in select_items(s.records, 1, "all", 0)
    ]
    rows = lines(out / "predictions.jsonl")
    # the union over ranks is the item set: none lost or doubled
    assert [r["id"] for r in rows] == expected
    assert all(set(r) == FIELDS for r in rows)
    results = json.loads((out / "results.json").read_text())
    assert list(results["results"]) == [
        "tombench",
        "simpletom",
        "socialiqa",
        "cosmosqa",
        "bbh",
        "emobench",
        "demo/test",
        "demo",
    ]
    assert (
        results["results"]["tombench"]["count"] == 20
        and len(results["results"]["tombench"]["tasks"]) == 20
    )
    # StimuliQA format: by subdimension, no options
    assert results["results"]["demo/test"]["accuracy"] is None
    assert sorted(p["items"] for p in results["perf"]["per_rank"]) == [
        len(rows) // 2,
        len(rows) - len(rows) // 2,
    ]
    markdown = (out / "results.md").read_text()
    assert "| run | ToMbench F1 | ToMbench Acc | SimpleToM F1 |" in markdown
    assert "**demo/test**" in markdown
    assert "## RQ5" in markdown and markdown in result.stdout

    # a crash mid-write: the last 5 lines lost and a torn one left; the resume redoes exactly those
    # 5 items
    full = (out / "predictions.jsonl").read_text().splitlines(keepends=True)
    (out / "predictions.jsonl").write_text("".join(full[:-5]) + full[-5][:30])
    again = evaluate(*args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert f"{len(rows) - 5} already in" in again.stdout and "5 to generate" in again.stdout
    resumed = lines(out / "predictions.jsonl")
    # the mean log-prob's last bits vary with the batch
    strip = lambda r: {k: v for k, v in r.items() if k != "mean_logprob"}
    assert [strip(r) for r in resumed] == [strip(r) for r in rows]
    assert [r["mean_logprob"] for r in resumed] == pytest.approx(
        [r["mean_logprob"] for r in rows], abs=1e-5
    )

    # other generation settings are refused, not mixed in
    changed = evaluate(*args[: -len(FAST)], "--max-new-tokens", 7, "--no-progress")
    assert changed.returncode != 0 and "max_new_tokens: 6 -> 7" in changed.stderr

    # compare (deltas against the first) and the RQ5 plot read the outputs
    compared = evaluate("compare", out, out, "--label", "a", "--label", "b")
    assert compared.returncode == 0, compared.stderr
    assert "| b | " in compared.stdout and "(+0.00)" in compared.stdout
    figure = evaluate("lengths", out, "--out", tmp_path / "fig6.png")
    assert figure.returncode == 0, figure.stderr
    assert (tmp_path / "fig6.png").stat().st_size > 0 and "index 1" in figure.stdout
    by_file = evaluate("lengths", out, "--by", "benchmark", "--out", tmp_path / "by.png")
    assert by_file.returncode == 0, by_file.stderr
    assert (tmp_path / "by.png").stat().st_size > 0 and "| tombench: " in by_file.stdout
    assert "| tombench: " in (tmp_path / "by.md").read_text()


@pytest.mark.slow
def test_a_failed_write_on_rank_0_stops_every_rank(tiny_model, tmp_path):
    """Rank 0 cannot append the first round to predictions.jsonl (a full disk, planted): it raises
    its error, and rank 1 learns of it and stops too instead of waiting in the next round's
    collective (torchrun's timeout would be the only end)."""
    worker = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node"]
    root = Path(__file__).resolve().parents[1]  # this checkout's psyrl, whatever is installed
    done = run(
        [*worker, "2", "tests/workers/evaluate_write_failure.py", str(tiny_model), str(tmp_path)],
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(root), "OMP_NUM_THREADS": "1"},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    predictions = tmp_path / "eval" / "predictions.jsonl"
    raised = [json.loads((tmp_path / f"rank-{r}.json").read_text()) for r in (0, 1)]
    assert raised == [
        {"type": "OSError", "message": f"[Errno 28] No space left on device: '{predictions}'"},
        {"type": "OSError", "message": f"rank 0 could not write {predictions}"},
    ]
    assert predictions.read_text() == ""  # start_output's empty file; no round was written


@pytest.mark.slow
def test_self_train_round_pieces(tiny_model, tmp_path):
    # evaluate and self-label in this process (one rank), train_sft.py as a process of its own
    # a random model keeps nothing at tau = 0.4, and says so instead of writing an empty set
    out = tmp_path / "label"
    result = here(
        evaluate_script.evaluate,
        "--model",
        tiny_model,
        "--benchmarks",
        "data/demo/mc.jsonl",
        "--split",
        "selftrain",
        "--limit",
        2,
        "--out",
        out,
        *FAST,
    )
    assert result.exit_code == 0, result.output[-3000:]
    ids = [r["id"] for r in lines(out / "predictions.jsonl")]
    held = select_items(load_benchmark("data/demo/mc.jsonl"), 0, "eval", 0)
    assert ids and not set(ids) & {r.id for r in held}
    labelled = here(psyrl_main, "self-label", out, "--out", tmp_path / "s.jsonl")
    assert labelled.exit_code == 1 and "no prediction kept at tau = 0.4" in labelled.stderr

    # with answers that match their options (rewritten predictions), the set is written and
    # train_sft.py takes it
    rows = lines(out / "predictions.jsonl")
    records = {r.id: r for r in load_benchmark("data/demo/mc.jsonl")}
    for row in rows:
        row["response"] = f"<think>the cue</think><answer>{records[row['id']].options[1]}</answer>"
        row["extracted"], row["format"] = records[row["id"]].options[1], 1.0
    (out / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    labelled = here(psyrl_main, "self-label", out, "--out", tmp_path / "s.jsonl")
    assert labelled.exit_code == 0, labelled.output
    assert f"kept {len(rows)} of {len(rows)}" in labelled.stdout
    sft = subprocess.run(
        [
            sys.executable,
            "train_sft.py",
            "--config",
            "configs/sft/tiny-self-train.toml",
            "--set",
            f"model.path={json.dumps(str(tiny_model))}",
            "--set",
            f"data.train_file={json.dumps(str(tmp_path / 's.jsonl'))}",
            "--set",
            f"run.output_dir={json.dumps(str(tmp_path / 'runs'))}",
            "--set",
            "run.steps=2",
            "--set",
            "data.valid_items=4",
            "--set",
            "log.progress=false",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert sft.returncode == 0, sft.stderr[-3000:]
    assert f"{len(rows)} training examples" in sft.stdout
    assert (tmp_path / "runs" / "tiny-self-train" / "hf" / "config.json").is_file()

    # the eval half is refused: it would train on what is reported
    result = here(
        evaluate_script.evaluate,
        "--model",
        tiny_model,
        "--benchmarks",
        "data/demo/mc.jsonl",
        "--split",
        "eval",
        "--limit",
        1,
        "--out",
        tmp_path / "held",
        *FAST,
    )
    assert result.exit_code == 0, result.output[-3000:]
    refused = here(psyrl_main, "self-label", tmp_path / "held", "--out", tmp_path / "x.jsonl")
    assert refused.exit_code == 1 and "--split selftrain" in refused.stderr


@pytest.mark.slow
def test_overwrite_keeps_other_files_and_the_default_out_names_the_run(
    tiny_model, tmp_path, monkeypatch
):
    # in this process (one rank, no process group): the test is about the output directory
    out = tmp_path / "shared"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    args = ["--model", tiny_model, "--benchmarks", "bbh", "--limit", 1, "--out", out, *FAST]
    first = here(evaluate_script.evaluate, *args)
    assert first.exit_code == 0, first.output[-2000:]
    again = here(evaluate_script.evaluate, *args, "--overwrite")
    assert again.exit_code == 0, again.output[-2000:]
    assert "0 already in" in again.stdout and (out / "notes.txt").read_text() == "mine"
    # runs/<name>/hf evaluates into runs/eval/<name>, not runs/eval/hf
    run_dir = tmp_path / "work"
    (run_dir / "runs" / "my-run").mkdir(parents=True)
    (run_dir / "runs" / "my-run" / "hf").symlink_to(tiny_model, target_is_directory=True)
    monkeypatch.chdir(run_dir)
    named = here(
        evaluate_script.evaluate,
        "--model",
        "runs/my-run/hf",
        "--benchmarks",
        "bbh",
        "--limit",
        1,
        *FAST,
    )
    assert named.exit_code == 0, named.output[-2000:]
    assert (run_dir / "runs" / "eval" / "my-run" / "results.md").is_file()


def test_bad_input_is_refused_before_any_model_is_read(tmp_path):
    unknown = here(evaluate_script.evaluate, "--model", tmp_path, "--benchmarks", "tombench,tomb")
    assert unknown.exit_code == 1
    assert (
        "unknown benchmark 'tomb': expected one of tombench, simpletom, socialiqa, cosmosqa, "
        "bbh, emobench"
    ) in unknown.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text(
        '{"id": "x/1", "benchmark": "x", "task": "", "context": "c", "question": "q", "options": '
        '["a"], "answer_index": 0, "answer": "a"}\n'
    )
    refused = here(evaluate_script.evaluate, "--model", tmp_path, "--benchmarks", bad)
    assert refused.exit_code == 1
    assert f"{bad}:1: key 'options': expected at least 2 options" in refused.stderr
    missing = here(
        evaluate_script.evaluate, "--model", tmp_path / "nope", "--benchmarks", "bbh", "--limit", 1
    )
    assert missing.exit_code == 1 and "no such model directory" in missing.stderr
    assert (
        here(evaluate_script.evaluate, "--benchmarks", "bbh").exit_code == 2
    )  # --model is required
    bounds = here(
        evaluate_script.evaluate,
        "--model",
        tmp_path,
        "--temperature",
        -1,
        "--top-p",
        0,
        "--limit",
        -1,
    )
    assert bounds.exit_code == 2
    assert (
        "--temperature must be >= 0; --top-p must be in (0, 1]; --limit must be >= 0"
        in bounds.stderr
    )
    # the script itself, once: its exit status and its one message on stderr
    script = evaluate("--model", tmp_path / "nope", "--benchmarks", "bbh", "--limit", 1)
    assert script.returncode == 1 and script.stderr.strip().endswith(missing.stderr.strip())
    assert "Traceback" not in script.stderr
    helped = here(evaluate_script.evaluate, "--help")
    assert helped.exit_code == 0 and "compare" in helped.stdout and "--split" in helped.stdout
