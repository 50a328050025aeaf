"""run.resume = "auto" (--resume auto) decides from the run directory alone, before any model is
built: no run, start afresh; a run with a complete checkpoint, continue it (`on`'s checks); a run of
this config cut short before its first checkpoint, start over; one of another config, refuse. The
restarts themselves, with real faults under torchrun, are tests/test_restarts.py."""

import json

import pytest
from click.testing import CliRunner

from psyrl.core.checkpoints import write_manifest
from psyrl.core.config import dump_config, load_config
from psyrl.core.errors import RunError
from psyrl.run.directory import Run
from psyrl.runtime.distributed import ONE_PROCESS


def config(tmp_path, *sets):
    return load_config(None, [f"run.output_dir={json.dumps(str(tmp_path))}", *sets])


def cut_short(tmp_path, cfg) -> None:
    """What a run leaves when it dies after a step and before its first checkpoint."""
    run = tmp_path / cfg.run.name
    run.mkdir()
    (run / "config.resolved.toml").write_text(dump_config(cfg))
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 1.0}) + "\n")


def test_auto_starts_afresh_where_there_is_no_run(tmp_path):
    run = Run(config(tmp_path), ONE_PROCESS, "sft", [], overwrite=False, resume="auto")
    assert run.checkpoint is None and not run.wipe


def test_auto_starts_over_a_run_of_this_config_cut_short_before_its_first_checkpoint(tmp_path):
    cut_short(tmp_path, config(tmp_path))
    # run.resume and the log table may differ: they are free on --resume too
    cfg = config(tmp_path, "run.resume=auto", "log.every=5")
    run = Run(cfg, ONE_PROCESS, "sft", [], overwrite=False, resume="auto")
    assert run.checkpoint is None and run.wipe  # start() empties it, then writes its config


def test_auto_refuses_a_run_of_another_config_and_on_refuses_no_checkpoint(tmp_path):
    cut_short(tmp_path, config(tmp_path))
    with pytest.raises(RunError, match=r"--resume auto: .* differs from this one in optim.lr"):
        Run(config(tmp_path, "optim.lr=0.5"), ONE_PROCESS, "sft", [], False, "auto")
    with pytest.raises(RunError, match="--resume: .* holds no complete checkpoint"):
        Run(config(tmp_path), ONE_PROCESS, "sft", [], False, "on")
    with pytest.raises(RunError, match="already holds a run; pass --resume"):
        Run(config(tmp_path), ONE_PROCESS, "sft", [], False, "off")


def test_the_resume_option_takes_auto_or_nothing(monkeypatch):
    from psyrl.cli import train

    seen = []
    monkeypatch.setattr(train, "resolve_config", lambda path, kind: path)
    monkeypatch.setattr(
        "psyrl.run.launch.launch", lambda loop, cfg, sets, overwrite, resume: seen.append(resume)
    )
    for args, expected in ((["--resume"], "on"), (["--resume", "auto"], "auto"), ([], None)):
        result = CliRunner().invoke(train.train_sft, ["--config", "x.toml", *args])
        assert result.exit_code == 0, result.output
        assert seen.pop() == expected
    result = CliRunner().invoke(train.train_sft, ["--config", "x.toml", "--resume", "always"])
    assert result.exit_code == 2 and "'always' is not one of 'on', 'auto'" in result.output


def checkpointed(tmp_path, cfg, steps=(1, 2)):
    """A run with a complete checkpoint at each of `steps` (a 16 KiB stand-in for the DCP shard)."""
    run = tmp_path / cfg.run.name
    for step in steps:
        d = run / "checkpoints" / f"step-{step}"
        (d / "state").mkdir(parents=True)
        (d / "state" / "__0_0.distcp").write_bytes(bytes(range(256)) * 64)
        (d / "config.resolved.toml").write_text(dump_config(cfg))
        write_manifest(d)
    (run / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 1.0}) + "\n")
    return run


def test_a_corrupted_checkpoint_is_skipped_by_auto_and_refused_by_on(tmp_path, capsys):
    cfg = config(tmp_path)
    run = checkpointed(tmp_path, cfg)
    shard = run / "checkpoints" / "step-2" / "state" / "__0_0.distcp"
    data = bytearray(shard.read_bytes())
    data[100] ^= 0x01  # one bit flipped, the size kept
    shard.write_bytes(bytes(data))
    expected = (
        f"{run / 'checkpoints' / 'step-2'}: damaged checkpoint (state/__0_0.distcp has xxh3_64"
    )
    resumed = Run(cfg, ONE_PROCESS, "sft", [], overwrite=False, resume="auto")
    assert resumed.checkpoint == run / "checkpoints" / "step-1"
    said = capsys.readouterr().out
    assert f"warning: skipping {expected}" in said and "its bytes changed" in said
    with pytest.raises(RunError) as refused:
        Run(cfg, ONE_PROCESS, "sft", [], overwrite=False, resume="on")
    assert str(refused.value).startswith(f"--resume: {expected}")
    assert "--resume auto would skip it" in str(refused.value)


def test_a_checkpoint_from_before_checksums_resumes_with_a_note(tmp_path, capsys):
    cfg = config(tmp_path)
    run = checkpointed(tmp_path, cfg, steps=(1,))
    d = run / "checkpoints" / "step-1"
    manifest = json.loads((d / "manifest.json").read_text())
    write_manifest(d, {"files": manifest["files"], "resumable": True})  # sizes only, as before
    assert Run(cfg, ONE_PROCESS, "sft", [], overwrite=False, resume="on").checkpoint == d
    assert f"note: {d} was written before psyrl recorded checksums" in capsys.readouterr().out


CONSTANT = ['optim.schedule="constant"', "optim.warmup_ratio=0.0"]


def test_extend_lets_run_steps_grow_and_nothing_else(tmp_path):
    checkpointed(tmp_path, config(tmp_path, "run.steps=4", *CONSTANT), steps=(4,))
    longer = config(tmp_path, "run.steps=6", "run.extend=true", *CONSTANT)
    run = Run(longer, ONE_PROCESS, "sft", [], overwrite=False, resume="on")
    assert run.checkpoint.name == "step-4" and run.planned == 4
    with pytest.raises(RunError, match=r"differs .* in run.steps; .* \(--extend lets run.steps"):
        Run(config(tmp_path, "run.steps=6", *CONSTANT), ONE_PROCESS, "sft", [], False, "on")
    with pytest.raises(RunError, match="grow, not shrink: .* planned 4 steps, this config 3"):
        Run(
            config(tmp_path, "run.steps=3", "run.extend=true", *CONSTANT),
            ONE_PROCESS,
            "sft",
            [],
            False,
            "on",
        )
    with pytest.raises(RunError, match=r"differs from .* in optim.lr; resuming would not"):
        cfg = config(tmp_path, "run.steps=6", "run.extend=true", "optim.lr=0.5", *CONSTANT)
        Run(cfg, ONE_PROCESS, "sft", [], False, "on")
    with pytest.raises(RunError, match="--extend .* pass --resume with it"):
        Run(longer, ONE_PROCESS, "sft", [], overwrite=True, resume="off")
