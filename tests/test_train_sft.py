"""`train_sft.py` end to end on a tiny model: it learns, exports, and refuses bad input before
training."""

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from transformers import AutoModelForCausalLM, AutoTokenizer

from psyrl.cli import train as cli_train
from psyrl.core.config import load_config
from psyrl.core.records import load_stimuliqa
from psyrl.core.runlog import read_metrics
from psyrl.run.validation import sample_items
from psyrl.runtime.model import collate, token_logprobs
from psyrl.sft.loss import build_examples, response_tokens, sft_loss

SHORT = [  # a smaller, shorter version of configs/sft/tiny.toml
    "model.hidden_size=64",
    "model.num_layers=2",
    "model.intermediate_size=128",
    "run.steps=60",
    "optim.lr=3e-3",
    "optim.global_batch=8",
    "optim.micro_batch=4",
    "checkpoint.every=20",
    "data.valid_items=16",
    "rollout.max_new_tokens=24",
    "sampler.batch=16",
    "log.progress=false",
]


def run_sft(tmp_path, *extra, config="configs/sft/tiny.toml", resume=False):
    sets = [f"run.output_dir={json.dumps(str(tmp_path / 'runs'))}", *SHORT, *extra]
    args = [sys.executable, "train_sft.py", "--config", config] + [
        a for s in sets for a in ("--set", s)
    ]
    args += ["--resume"] if resume else []
    return subprocess.run(args, capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_tiny_sft_learns_and_exports(tmp_path):
    result = run_sft(tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "runs" / "tiny-sft"
    rows = read_metrics(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(61))
    first, last = rows[0], rows[-1]
    # measured here: valid loss 8.18 (untrained, ~ln 3424) -> 4.02 after 60 steps (F1 needs longer:
    # README)
    assert last["valid/loss"] < first["valid/loss"] - 3.0, (first, last)
    assert all(r["train/skipped_updates"] == 0 for r in rows[1:])
    assert "step 60/60 | loss" in result.stdout and "median-F1 checkpoint" in result.stdout

    resolved = load_config(run / "config.resolved.toml")
    # the model card: base model, the data by hash, the last held-out scores, the resolved config
    card = (run / "hf" / "README.md").read_text()
    train_sha = hashlib.sha256(Path(resolved.data.train_file).read_bytes()).hexdigest()
    valid_sha = hashlib.sha256(Path(resolved.data.valid_file).read_bytes()).hexdigest()
    assert card.startswith("---\nbase_model: null\nlibrary_name: transformers\n")
    assert f"| train | `{resolved.data.train_file}` | `{train_sha}` |" in card
    assert f"| validation | `{resolved.data.valid_file}` | `{valid_sha}` |" in card
    assert "## Held-out scores (validation at step 60)" in card
    assert f"| valid/f1 | {last['valid/f1']:.4f} |" in card
    assert (run / "config.resolved.toml").read_text().rstrip() in card
    assert resolved.run.steps == 60 and resolved.model.hidden_size == 64
    for step in (20, 40, 60):
        scores = json.loads((run / "checkpoints" / f"step-{step}" / "validation.json").read_text())
        assert scores["step"] == step and 0 <= scores["valid/f1"] <= 1
        lines = (run / "checkpoints" / f"step-{step}" / "validation.jsonl").read_text().splitlines()
        assert (
            len(lines) == 16
            and {"id", "answer", "response", "tokens"} <= json.loads(lines[0]).keys()
        )

    # the export, loaded by transformers as it is, reproduces the run's own last held-out loss
    final = AutoModelForCausalLM.from_pretrained(run / "hf")
    tokenizer = AutoTokenizer.from_pretrained(run / "hf")
    records = sample_items(load_stimuliqa("data/demo/test.jsonl"), 16, seed=0)
    examples, _ = build_examples(records, tokenizer, resolved.prompt, resolved.data.max_length)
    ids, mask, loss_mask = collate(
        [e.input_ids for e in examples], [e.prompt_len for e in examples], tokenizer.pad_token_id
    )
    with torch.no_grad():
        loss = sft_loss(
            token_logprobs(final, ids, mask, 1.0, loss_mask), loss_mask, response_tokens(examples)
        )
    assert loss.item() == pytest.approx(last["valid/loss"], rel=1e-5)
    last_checkpoint = AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step-60" / "hf")
    with torch.no_grad():
        assert torch.equal(final(ids).logits, last_checkpoint(ids).logits)
    assert (run / "checkpoints" / "step-60" / "config.resolved.toml").read_text() == (
        run / "config.resolved.toml"
    ).read_text()

    chosen = subprocess.run(
        [sys.executable, "-m", "psyrl", "select-checkpoint", str(run)],
        capture_output=True,
        text=True,
    )
    assert (
        chosen.returncode == 0 and Path(chosen.stdout.strip()).parent.parent == run / "checkpoints"
    )

    again = run_sft(tmp_path)  # an existing run is never overwritten silently
    assert again.returncode != 0 and "--overwrite" in again.stderr


@pytest.mark.slow
@pytest.mark.parametrize(
    "content, expected",
    [
        ('{"id": "a", "stimuli": "s"\n', ":1: invalid JSON"),
        (
            '{"id": "a", "stimuli": "s", "question": "q", "answer": "a", "variable": "v", '
            '"dimension": "emotional reactions", "subdimension": "specific emotions", '
            '"reasoning": 5}\n',
            ":1: key 'reasoning': expected",
        ),
        ("", "holds no records"),
        ('{"id": "a", "stimuli": "s", "question": "q"}\n', ":1: missing key 'answer'"),
    ],
)
def test_bad_training_data_trains_nothing(tmp_path, content, expected):
    # in this process (the script's command, as tests/test_bad_inputs.py runs it): the refusal comes
    # before any training, so a process of its own would only add its start-up
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    sets = [f"run.output_dir={json.dumps(str(tmp_path / 'runs'))}", *SHORT]
    sets.append(f"data.train_file={json.dumps(str(bad))}")
    args = ["--config", "configs/sft/tiny.toml", *(a for s in sets for a in ("--set", s))]
    result = CliRunner().invoke(cli_train.train_sft, args)
    assert result.exit_code not in (0, None) and isinstance(result.exception, SystemExit)
    assert str(bad) in result.output and expected in result.output
    assert "Traceback" not in result.output and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_missing_model_directory_trains_nothing(tmp_path):
    result = run_sft(tmp_path, f"model.path={json.dumps(str(tmp_path / 'qwen'))}")
    assert result.returncode != 0 and "no such model directory" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_checkpoint_every_zero_keeps_only_the_final_export(tmp_path):
    result = run_sft(tmp_path, "checkpoint.every=0", "run.steps=2")
    assert result.returncode == 0, result.stderr[-2000:]
    run = tmp_path / "runs" / "tiny-sft"
    assert sorted(p.name for p in run.iterdir()) == ["config.resolved.toml", "hf", "metrics.jsonl"]
    assert "valid/f1" in read_metrics(run / "metrics.jsonl")[-1]  # the last step is still validated


@pytest.mark.slow
def test_resume_drops_a_cut_short_metrics_line_and_refuses_changed_data(tmp_path):
    data = tmp_path / "train.jsonl"
    lines = Path("data/demo/train.jsonl").read_text().splitlines(keepends=True)
    data.write_text("".join(lines[:64]))
    quick = [
        f"data.train_file={json.dumps(str(data))}",
        'data.valid_file=""',
        "run.steps=3",
        "checkpoint.every=1",
        "checkpoint.keep_state=0",
        "optim.micro_batch=8",
    ]
    assert run_sft(tmp_path, *quick).returncode == 0
    run = tmp_path / "runs" / "tiny-sft"
    shutil.rmtree(run / "checkpoints" / "step-3")
    with (run / "metrics.jsonl").open("a") as f:
        f.write('{"step": 4, "train/lo')  # the crash cut the last row short
    resumed = run_sft(tmp_path, *quick, resume=True)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "dropped 1 unreadable line" in resumed.stdout
    assert "resuming after step 2" in resumed.stdout
    assert [r["step"] for r in read_metrics(run / "metrics.jsonl")] == [1, 2, 3]
    # same path, other records: the saved data position would mean nothing
    data.write_text("".join(lines[:48]))
    refused = run_sft(tmp_path, *quick, resume=True)
    assert refused.returncode != 0
    assert "is not the data" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_help_explains():
    out = subprocess.run(
        [sys.executable, "train_sft.py", "--help"], capture_output=True, text=True
    ).stdout
    assert "--config" in out
    assert "--set" in out
    assert "--overwrite" in out
    assert "--resume" in out
    assert "torchrun" in out
