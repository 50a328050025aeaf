"""HF exports, resumable checkpoints (atomic, verified, pruned) and the appendix-B checkpoint
choice."""

import errno
import json

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from psyrl.core.atomic import tidy
from psyrl.core.checkpoints import (
    find_resumable,
    json_text,
    select_checkpoint,
    verify,
    write_manifest,
)
from psyrl.core.config import ModelConfig, OptimConfig
from psyrl.runtime import checkpoint as ckpt
from psyrl.runtime.checkpoint import CheckpointError, export_hf, load_checkpoint, save_checkpoint
from psyrl.runtime.model import Policy, load_model, load_tokenizer
from psyrl.runtime.optim import build_optimizer

TINY = ModelConfig(
    tokenizer="tiny",
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    intermediate_size=32,
)


def make_run(tmp_path, scores):
    for step, f1 in scores.items():
        (tmp_path / "checkpoints" / f"step-{step}").mkdir(parents=True)
        (tmp_path / "checkpoints" / f"step-{step}" / "validation.json").write_text(
            json_text({"valid/f1": f1})
        )
        write_manifest(tmp_path / "checkpoints" / f"step-{step}")
    (tmp_path / "checkpoints" / "step-99").mkdir()  # no validation.json: not a candidate
    (tmp_path / "checkpoints" / "step-98").mkdir()  # no manifest (cut short): not a candidate
    (tmp_path / "checkpoints" / "step-98" / "validation.json").write_text(
        json_text({"valid/f1": 0.9})
    )
    return tmp_path


def test_median_best_last(tmp_path):
    run = make_run(tmp_path, {10: 0.30, 20: 0.10, 30: 0.50, 40: 0.20})
    # sorted 0.10 0.20 0.30 0.50: lower median
    assert select_checkpoint(run, "median")[:2] == (40, 0.20)
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
    tokenizer = load_tokenizer(TINY)
    model = load_model(TINY, tokenizer, seed=3)
    out = export_hf(Policy(model), tokenizer, tmp_path / "hf")
    # replacing an export works and leaves no temporary directory
    export_hf(Policy(model), tokenizer, tmp_path / "hf")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    reloaded = AutoModelForCausalLM.from_pretrained(out)
    ids = torch.tensor([tokenizer("I felt proud of my sister.")["input_ids"]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, reloaded(ids).logits)
    assert (
        AutoTokenizer.from_pretrained(out)("I felt proud")["input_ids"]
        == tokenizer("I felt proud")["input_ids"]
    )
    stops = json.loads((out / "generation_config.json").read_text())["eos_token_id"]
    # <|im_end|>, <|endoftext|> as in Qwen2.5
    assert stops == [tokenizer.eos_token_id, tokenizer.pad_token_id]


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


def trained_policy(steps=1, seed=3):
    tokenizer = load_tokenizer(TINY)
    policy = Policy(load_model(TINY, tokenizer, seed=seed))
    optimizer = build_optimizer(policy, OptimConfig(lr=1e-2))
    ids = torch.tensor([tokenizer("I felt proud of my sister, she won.")["input_ids"]])
    for _ in range(steps):
        (-policy(ids, torch.ones_like(ids)).sum()).backward()
        optimizer.step()
        optimizer.zero_grad()
    return policy, optimizer, tokenizer


def test_loading_a_checkpoint_unpickles_no_python_object(tmp_path, monkeypatch):
    policy, optimizer, tokenizer = trained_policy()
    path = save_checkpoint(tmp_path, 1, policy, optimizer, tokenizer, {})
    calls, real_load = [], torch.load

    def recording_load(*args, **kwargs):
        calls.append(kwargs.get("weights_only"))
        return real_load(*args, **kwargs)

    monkeypatch.setattr(torch, "load", recording_load)
    load_checkpoint(path, *trained_policy(seed=5)[:2])
    # tensors are read with weights_only=True (DCP); no optimiser param_groups pickle
    assert False not in calls


def test_save_then_load_restores_model_optimiser_and_rng(tmp_path):
    policy, optimizer, tokenizer = trained_policy(steps=2)
    torch.manual_seed(11)
    path = save_checkpoint(
        tmp_path, 2, policy, optimizer, tokenizer, {"trainer.json": json_text({"step": 2})}
    )
    expected_draw = torch.rand(3)
    assert verify(path) is None and find_resumable(tmp_path, print) == path
    assert sorted(p.name for p in path.iterdir()) == [
        "hf",
        "manifest.json",
        "rng",
        "state",
        "trainer.json",
    ]
    # different weights and optimiser moments
    other, other_optimizer, _ = trained_policy(steps=1, seed=5)
    load_checkpoint(path, other, other_optimizer)
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG continues where the saved run stood
    for a, b in zip(policy.state_dict().values(), other.state_dict().values()):
        assert torch.equal(a, b)
    saved, loaded = optimizer.state_dict()["state"], other_optimizer.state_dict()["state"]
    assert saved.keys() == loaded.keys()
    for k in saved:
        assert all(
            torch.equal(saved[k][name], loaded[k][name])
            for name in ("step", "exp_avg", "exp_avg_sq")
        )
    weights = load_file(path / "hf" / "model.safetensors")  # the HF export holds the same weights
    assert torch.equal(weights["model.norm.weight"], policy.lm.model.norm.weight)


def test_cut_short_checkpoint_is_skipped_with_a_warning(tmp_path):
    policy, optimizer, tokenizer = trained_policy()
    good = save_checkpoint(tmp_path, 1, policy, optimizer, tokenizer, {})
    bad = save_checkpoint(tmp_path, 2, policy, optimizer, tokenizer, {})
    shard = next((bad / "state").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-10])  # a write that stopped 10 bytes short
    warnings = []
    assert find_resumable(tmp_path, warnings.append) == good
    assert verify(bad) == (
        f"state/{shard.name} has {shard.stat().st_size} bytes, {shard.stat().st_size + 10} expected"
    )
    assert len(warnings) == 1 and "step-2" in warnings[0] and "incomplete" in warnings[0]
    (bad / "manifest.json").unlink()  # crashed before the manifest: never complete
    assert "no readable manifest.json" in verify(bad)
    assert find_resumable(tmp_path / "nothing", print) is None


def test_write_error_leaves_no_checkpoint_and_the_previous_intact(tmp_path, monkeypatch):
    policy, optimizer, tokenizer = trained_policy()
    previous = save_checkpoint(tmp_path, 1, policy, optimizer, tokenizer, {"trainer.json": "{}"})

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "save_file", disk_full)  # the RNG files are written after the weights
    with pytest.raises(
        CheckpointError, match=r"step-2 \(RNG state, rank 0: OSError: .*No space left on device\)"
    ):
        save_checkpoint(tmp_path, 2, policy, optimizer, tokenizer, {})
    # no temporary left
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1"]
    assert verify(previous) is None and find_resumable(tmp_path, print) == previous


def test_keep_state_prunes_old_states_but_keeps_exports(tmp_path):
    policy, optimizer, tokenizer = trained_policy()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, policy, optimizer, tokenizer, {}, keep_state=2)
    first = tmp_path / "checkpoints" / "step-1"
    assert sorted(p.name for p in first.iterdir()) == ["hf", "manifest.json"]
    assert (
        verify(first) is None
        and json.loads((first / "manifest.json").read_text())["resumable"] is False
    )
    assert all((tmp_path / "checkpoints" / f"step-{s}" / "state").is_dir() for s in (2, 3))


def test_a_checkpoint_whose_pruning_was_interrupted_is_not_resumed(tmp_path):
    policy, optimizer, tokenizer = trained_policy()
    first = save_checkpoint(tmp_path, 1, policy, optimizer, tokenizer, {})
    second = save_checkpoint(tmp_path, 2, policy, optimizer, tokenizer, {})
    manifest = json.loads((second / "manifest.json").read_text())
    # pruning withdrew the state, then crashed
    write_manifest(second, {**manifest, "resumable": False})
    assert verify(second) is None and find_resumable(tmp_path, print) == first
