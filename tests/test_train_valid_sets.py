"""train_tgrpo.py end to end with several held-out sets and 2 samples per item (issue 42 item 7):
each set is logged under its own name at every validation, a copy of data.valid_file scores exactly
what data.valid_file does, the checkpoint, the model card and the report carry every set; and the
paper's default (one set, one sample) logs the keys it always did."""

import json
import shutil

from test_train_tgrpo import run_in_process

from psyrl.core.checkpoints import select_checkpoint
from psyrl.core.records import load_benchmark, load_stimuliqa, write_jsonl
from psyrl.core.runlog import read_metrics
from psyrl.report.page import validation_section
from psyrl.report.read import read_run

PAPER_KEYS = ["valid/reward", "valid/f1", "valid/format", "valid/length", "valid/items"]


def held_out_files(tmp_path):
    valid, copy, bench = tmp_path / "valid.jsonl", tmp_path / "copy.jsonl", tmp_path / "tom.jsonl"
    write_jsonl(valid, load_stimuliqa("data/demo/test.jsonl")[:6])
    shutil.copy(valid, copy)
    write_jsonl(bench, load_benchmark("data/benchmarks/simpletom/test.jsonl")[:4])
    return valid, copy, bench


def test_two_extra_sets_with_two_samples_each(start, tmp_path):
    valid, copy, bench = held_out_files(tmp_path)
    result = run_in_process(
        start,
        tmp_path,
        f"data.valid_file={json.dumps(str(valid))}",
        f"data.valid_files={json.dumps([str(copy), str(bench)])}",
        "data.valid_samples=2",
        "checkpoint.every=1",
    )
    assert result.exit_code == 0, result.output
    run = tmp_path / "rl"
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "valid/f1" in r]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows:
        for prefix in ("valid/", "valid/copy/"):
            assert all(f"{prefix}{k}" in row for k in ("f1", "reward", "loss", "f1_mean@2"))
            assert row[f"{prefix}items"] == 6
        assert row["valid/tom/items"] == 4 and "valid/tom/loss" not in row
        # each set scored as if it were the only one: the copy of valid_file scores the same
        assert {k: v for k, v in row.items() if k.startswith("valid/copy/")} == {
            k.replace("valid/", "valid/copy/", 1): v
            for k, v in row.items()
            if k.startswith("valid/") and not k.startswith(("valid/copy/", "valid/tom/"))
        }
        for key in (
            "valid/f1_mean@2",
            "valid/pass@2",
            "valid/tom/f1_mean@2",
            "valid/tom/accuracy_mean@2",
            "valid/tom/pass@2",
        ):
            assert 0 <= row[key] <= 1, (key, row[key])
        # an item whose first response is right has c >= 1: pass@2 >= the first responses' score
        assert row["valid/tom/pass@2"] >= row["valid/tom/accuracy"]
    # the checkpoint: every set's metrics, one responses file per set, a row per response
    step = run / "checkpoints" / "step-2"
    saved = json.loads((step / "validation.json").read_text())
    assert saved == {k: v for k, v in rows[-1].items() if k.startswith("valid/")} | {"step": 2}
    for name, items in (("validation.jsonl", 6), ("validation-copy.jsonl", 6)):
        lines = [json.loads(x) for x in (step / name).read_text().splitlines()]
        assert [x["sample"] for x in lines] == [0, 1] * items
    assert (step / "validation.jsonl").read_text() == (step / "validation-copy.jsonl").read_text()
    assert len((step / "validation-tom.jsonl").read_text().splitlines()) == 8
    # psyrl select-checkpoint reads data.valid_file's valid/f1, as before
    assert select_checkpoint(run, "last")[:2] == (2, rows[-1]["valid/f1"])
    card = (run / "hf" / "README.md").read_text()
    assert f"| validation | `{valid}` |" in card
    assert f"| validation (copy) | `{copy}` |" in card
    assert f"| validation (tom) | `{bench}` |" in card
    assert "| valid/tom/pass@2 |" in card
    html = validation_section([read_run("rl", run, read_metrics(run / "metrics.jsonl"))])
    for column in ("f1", "pass@2", "copy/f1", "tom/accuracy", "tom/pass@2"):
        assert f"<th>{column}</th>" in html


def test_the_default_validation_logs_the_keys_it_always_did(start, tmp_path):
    valid, _, _ = held_out_files(tmp_path)
    result = run_in_process(
        start, tmp_path, f"data.valid_file={json.dumps(str(valid))}", "checkpoint.every=1"
    )
    assert result.exit_code == 0, result.output
    run = tmp_path / "rl"
    rows = [r for r in read_metrics(run / "metrics.jsonl") if "valid/f1" in r]
    assert [r["step"] for r in rows] == [0, 1, 2]
    for row in rows:
        assert [k for k in row if k.startswith("valid/")] == [*PAPER_KEYS, "valid/loss"]
    step = run / "checkpoints" / "step-2"
    assert sorted(p.name for p in step.glob("validation*")) == [
        "validation.json",
        "validation.jsonl",
    ]
    lines = [json.loads(x) for x in (step / "validation.jsonl").read_text().splitlines()]
    assert len(lines) == 6 and all(
        list(x) == ["id", "answer", "response", "tokens", "finish_reason"] for x in lines
    )
