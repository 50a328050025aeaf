"""HF exports and the appendix-B checkpoint choice."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from psyrl.checkpoint import export_hf, json_text, select_checkpoint, tidy
from psyrl.config import ModelConfig
from psyrl.model import load_model, load_tokenizer


def make_run(tmp_path, scores):
    for step, f1 in scores.items():
        (tmp_path / "checkpoints" / f"step-{step}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step-{step}" / "validation.json").write_text(json_text({"valid/f1": f1}))
    (tmp_path / "checkpoints" / "step-99").mkdir()  # no validation.json: not a candidate
    return tmp_path


def test_median_best_last(tmp_path):
    run = make_run(tmp_path, {10: 0.30, 20: 0.10, 30: 0.50, 40: 0.20})
    assert select_checkpoint(run, "median")[:2] == (40, 0.20)  # sorted 0.10 0.20 0.30 0.50: lower median
    assert select_checkpoint(run, "best")[:2] == (30, 0.50)
    assert select_checkpoint(run, "last")[:2] == (40, 0.20)


def test_median_of_odd_count_and_ties(tmp_path):
    run = make_run(tmp_path, {5: 0.4, 10: 0.2, 15: 0.4})
    assert select_checkpoint(run, "median")[:2] == (5, 0.4)  # earlier step on a tie
    with pytest.raises(ValueError, match="unknown rule"):
        select_checkpoint(run, "mean")


def test_no_checkpoints(tmp_path):
    with pytest.raises(FileNotFoundError, match="checkpoint.every"):
        select_checkpoint(tmp_path)


def test_export_reloads_with_identical_logits(tmp_path):
    cfg = ModelConfig(tokenizer="tiny", hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                      intermediate_size=32)
    tokenizer = load_tokenizer(cfg)
    model = load_model(cfg, tokenizer, seed=3)
    out = export_hf(model, tokenizer, tmp_path / "hf")
    export_hf(model, tokenizer, tmp_path / "hf")  # replacing an export works and leaves no temporary directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([tokenizer("I felt proud of my sister.")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)
    assert AutoTokenizer.from_pretrained(out)("I felt proud")["input_ids"] == tokenizer("I felt proud")["input_ids"]
    stops = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    assert stops == [tokenizer.eos_token_id, tokenizer.pad_token_id]  # <|im_end|>, <|endoftext|> as in Qwen2.5


def test_tidy_removes_temporaries_and_restores_an_orphaned_old_version(tmp_path):
    checkpoints = tmp_path / "checkpoints"
    (checkpoints / ".step-9.tmp-4242" / "hf").mkdir(parents=True)  # a save that crashed half-way
    (checkpoints / "step-5.old").mkdir()  # crashed between the two renames of a replacement
    (checkpoints / "step-5.old" / "validation.json").write_text("{}")
    (checkpoints / "step-7").mkdir()
    (checkpoints / "step-7.old").mkdir()  # the replacement arrived: the old copy just goes
    tidy(tmp_path)
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-5", "step-7"]
    assert (checkpoints / "step-5" / "validation.json").exists()
