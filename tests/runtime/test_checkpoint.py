"""HF exports, resumable checkpoints (atomic, verified, pruned) and the appendix-B checkpoint
choice."""

import errno
import json

import pytest
import torch
import xxhash
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from psyrl.core.atomic import tidy
from psyrl.core.checkpoints import (
    CHECKSUM,
    DamagedCheckpoint,
    check,
    file_checksum,
    find_resumable,
    has_checksums,
    json_text,
    new_checksum,
    read_manifest,
    select_checkpoint,
    verify,
    verify_checksums,
    write_hashed,
    write_manifest,
)
from psyrl.core.config import ModelConfig, OptimConfig
from psyrl.runtime import checkpoint as ckpt
from psyrl.runtime.checkpoint import (
    CheckpointError,
    export_hf,
    load_checkpoint,
    save_checkpoint,
    verify_files,
)
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
    (tmp_path / "checkpoints" / "step-99").mkdir()  # no validation.json, no manifest: skipped
    return tmp_path


def test_a_score_without_its_manifest_chooses_nothing(tmp_path):
    run = make_run(tmp_path, {10: 0.30, 20: 0.10})
    (run / "checkpoints" / "step-98").mkdir()  # a score no manifest vouches for
    (run / "checkpoints" / "step-98" / "validation.json").write_text(json_text({"valid/f1": 0.9}))
    with pytest.raises(DamagedCheckpoint, match="step-98: damaged checkpoint .*manifest.json"):
        select_checkpoint(run, "best")


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


def test_a_run_without_the_metric_says_which_scores_it_has(tmp_path):
    # validated on data.valid_files alone: valid/<stem>/f1, no valid/f1
    d = tmp_path / "checkpoints" / "step-10"
    d.mkdir(parents=True)
    (d / "validation.json").write_text(json_text({"valid/tom/f1": 0.5, "valid/tom/items": 4}))
    write_manifest(d)
    with pytest.raises(ValueError, match=r"no 'valid/f1' score \(its F1 keys: valid/tom/f1\)"):
        select_checkpoint(tmp_path)


def test_export_reloads_with_identical_logits(tmp_path):
    tokenizer = load_tokenizer(TINY)
    model = load_model(TINY, tokenizer, seed=3)
    out = export_hf(Policy(model), tokenizer, tmp_path / "hf")
    # replacing an export works and leaves no temporary directory
    export_hf(Policy(model), tokenizer, tmp_path / "hf", files={"README.md": "# card\n"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["hf"]
    # its files under a manifest with their checksums, the model card too
    assert "README.md" in read_manifest(out)["checksums"] and check(out) is None
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
        "manifest.json.xxh3",
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
    assert len(warnings) == 1 and "step-2" in warnings[0] and "damaged" in warnings[0]
    (bad / "manifest.json").unlink()  # crashed before the manifest: never complete
    assert "manifest.json is missing or unreadable" in verify(bad)
    assert find_resumable(tmp_path / "nothing", print) is None


def test_write_error_leaves_no_checkpoint_and_the_previous_intact(tmp_path, monkeypatch):
    policy, optimizer, tokenizer = trained_policy()
    previous = save_checkpoint(tmp_path, 1, policy, optimizer, tokenizer, {"trainer.json": "{}"})

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "write_hashed", disk_full)  # the RNG files come after the weights
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
    assert sorted(p.name for p in first.iterdir()) == ["hf", "manifest.json", "manifest.json.xxh3"]
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


def test_xxh3_reference_values_and_file_checksum(tmp_path):
    # XXH3_64bits(""), seed 0: 2d06800538d394c2, the xxHash reference's sanity value
    assert (CHECKSUM, new_checksum().hexdigest()) == ("xxh3_64", "2d06800538d394c2")
    digest = new_checksum()
    digest.update(b"12345")
    digest.update(memoryview(b"6789"))  # in pieces, as the writers feed it
    assert digest.hexdigest() == xxhash.xxh3_64(b"123456789").hexdigest()
    (tmp_path / "f").write_bytes(b"123456789")
    assert file_checksum(tmp_path / "f") == digest.hexdigest()
    assert write_hashed(tmp_path / "g", b"") == "2d06800538d394c2"
    assert (tmp_path / "g").read_bytes() == b""


def test_the_manifest_holds_every_files_checksum_as_written(tmp_path):
    policy, optimizer, tokenizer = trained_policy()
    path = save_checkpoint(tmp_path, 1, policy, optimizer, tokenizer, {"trainer.json": "{}\n"})
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["checksum"] == "xxh3_64"
    assert manifest["checksums"].keys() == manifest["files"].keys()
    # hashed while written (DCP's shards and index, the RNG and text files) or read back (hf/):
    # each the XXH3-64 of the bytes now on disk, computed here independently
    for name, entry in manifest["checksums"].items():
        value = xxhash.xxh3_64((path / name).read_bytes()).hexdigest()
        assert entry == {"rank": 0, "value": value}, name
    assert {"state/.metadata", "state/__0_0.distcp", "rng/rank-0.safetensors"} <= set(
        manifest["files"]
    )
    # xxh3_64 of the 3 bytes b"{}" + newline, the trainer.json given
    assert manifest["checksums"]["trainer.json"]["value"] == "daa13e4f205dc5ba"
    # the HF export inside carries its own manifest, as the final export does
    assert verify(path / "hf") is None and verify_checksums(path / "hf") is None
    assert "model.safetensors" in read_manifest(path / "hf")["checksums"]
    assert verify_checksums(path) is None and verify_files(path) is None


def flip(path, offset=4096, count=4096):
    """Invert `count` bytes in place from `offset` (the issue's `b ^= 0xFF`): the size is kept."""
    data = bytearray(path.read_bytes())
    data[offset : offset + count] = bytes(b ^ 0xFF for b in data[offset : offset + count])
    path.write_bytes(bytes(data))


def test_flipped_truncated_and_missing_shards_are_all_caught(tmp_path):
    policy, optimizer, tokenizer = trained_policy()
    path = save_checkpoint(tmp_path, 1, policy, optimizer, tokenizer, {})
    shard = path / "state" / "__0_0.distcp"
    size, expected = shard.stat().st_size, read_manifest(path)["checksums"]["state/__0_0.distcp"]
    flip(shard)
    assert shard.stat().st_size == size and verify(path) is None  # the sizes cannot see it
    found = xxhash.xxh3_64(shard.read_bytes()).hexdigest()
    assert verify_checksums(path) == (
        f"state/__0_0.distcp has xxh3_64 {found}, {expected['value']} expected: its bytes changed"
    )
    assert verify_files(path) == verify_checksums(path)
    flip(shard)  # flipped back: the same bytes again
    assert verify_checksums(path) is None
    shard.write_bytes(shard.read_bytes()[:-1])
    assert verify(path) == f"state/__0_0.distcp has {size - 1} bytes, {size} expected"
    shard.unlink()
    assert verify(path) == "state/__0_0.distcp is missing"
    assert verify_checksums(path) == "state/__0_0.distcp is missing"
    # only the files a rank is given: the others' damage is theirs to find
    assert (
        verify_checksums(path, ["trainer.json"] if (path / "trainer.json").exists() else []) is None
    )


def test_pruning_keeps_the_checksums_of_what_stays(tmp_path):
    policy, optimizer, tokenizer = trained_policy()
    for step in (1, 2):
        save_checkpoint(tmp_path, step, policy, optimizer, tokenizer, {}, keep_state=1)
    manifest = read_manifest(tmp_path / "checkpoints" / "step-1")
    assert manifest["checksums"].keys() == manifest["files"].keys()
    assert not any(k.startswith(("state/", "rng/")) for k in manifest["checksums"])
    assert verify_checksums(tmp_path / "checkpoints" / "step-1") is None


def test_a_checkpoint_without_checksums_is_complete_but_unchecked(tmp_path):
    # as psyrl wrote them before checksums: sizes only
    policy, optimizer, tokenizer = trained_policy()
    path = save_checkpoint(tmp_path, 1, policy, optimizer, tokenizer, {})
    manifest = read_manifest(path)
    write_manifest(path, {"files": manifest["files"], "resumable": True})
    flip(path / "state" / "__0_0.distcp")
    assert not has_checksums(path) and verify(path) is None and verify_checksums(path) is None
    assert find_resumable(tmp_path, print) == path
    write_manifest(path, {**manifest, "checksum": "md5"})
    assert verify_checksums(path) == (
        "manifest.json has checksums of an unknown kind 'md5', 'xxh3_64' expected"
    )
