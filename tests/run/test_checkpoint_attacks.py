"""Attacks on two promises: `--resume auto` never deletes a run that holds checkpoints, and nothing
loads a damaged checkpoint or export silently. Each attack runs on a real tiny SFT run (4 steps,
checkpoints at steps 2 and 4, a final export), copied for each test: a byte flipped, a manifest
replaced by garbage or edited to switch its own checks off, an export damaged before
`select-checkpoint`, `evaluate --model`, T-GRPO's start model or the experiment runner reads it."""

import json
import re
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

import evaluate as evaluate_script
from psyrl.cli import train as cli_train
from psyrl.cli.main import main as psyrl_main
from psyrl.core.checkpoints import file_checksum, select_checkpoint, write_manifest
from psyrl.core.config import ModelConfig, load_config
from psyrl.core.errors import PsyrlError, RunError
from psyrl.experiment.runner import restart_flag
from psyrl.run.directory import Run
from psyrl.runtime.distributed import ONE_PROCESS
from psyrl.runtime.model import load_model, load_tokenizer

SHARD = "state/__0_0.distcp"


def sft_sets(data: Path, runs: Path) -> list[str]:
    return [
        f"run.output_dir={json.dumps(str(runs))}",
        "run.name=sft",
        f"data.train_file={data / 'train.jsonl'}",
        f"data.valid_file={data / 'valid.jsonl'}",
        "run.steps=4",
        "checkpoint.every=2",
        "model.hidden_size=64",
        "model.num_layers=2",
        "model.intermediate_size=128",
        "optim.global_batch=4",
        "optim.micro_batch=4",
        "rollout.max_new_tokens=8",
        "sampler.batch=4",
        "log.progress=false",
    ]


def train_sft(data: Path, runs: Path, *flags: str):
    """train_sft.py's command in this process: click's result (exit code, output, exception)."""
    args = ["--config", "configs/sft/tiny.toml"]
    args += [a for s in sft_sets(data, runs) for a in ("--set", s)]
    return CliRunner().invoke(cli_train.train_sft, [*args, *flags])


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """The data and `runs/sft` of a 4-step SFT run with checkpoints at steps 2 and 4 (~6 s)."""
    data = tmp_path_factory.mktemp("attacks")
    lines = Path("data/demo/train.jsonl").read_text().splitlines()
    (data / "train.jsonl").write_text("\n".join(lines[:16]) + "\n")
    lines = Path("data/demo/test.jsonl").read_text().splitlines()
    (data / "valid.jsonl").write_text("\n".join(lines[:4]) + "\n")
    result = train_sft(data, data / "runs")
    assert result.exit_code == 0, result.output[-3000:]
    return data


@pytest.fixture
def run(trained, tmp_path) -> Path:
    """A fresh copy of the trained run (`tmp_path/runs/sft`), its data where it was."""
    shutil.copytree(trained / "runs", tmp_path / "runs")
    return tmp_path / "runs" / "sft"


def step(run: Path, n: int) -> Path:
    return run / "checkpoints" / f"step-{n}"


def flip(path: Path, offset: int = 100) -> None:
    """One bit flipped in place, the size kept."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def edit_manifest(directory: Path, change) -> None:
    """Rewrite `directory`'s manifest.json alone, as a hand edit would: `change(manifest)` returns
    the new JSON value, or a string written as it is."""
    path = directory / "manifest.json"
    new = change(json.loads(path.read_text()))
    path.write_text(new if isinstance(new, str) else json.dumps(new, indent=2))


def snapshot(run: Path) -> dict[str, int]:
    return {str(p.relative_to(run)): p.stat().st_size for p in run.rglob("*") if p.is_file()}


def resume_run(run: Path, resume: str) -> Run:
    """The `Run` a trainer builds on `run` with its own resolved config and `resume`."""
    sets = [f"run.output_dir={json.dumps(str(run.parent))}"]
    cfg = load_config(run / "config.resolved.toml", sets)
    return Run(cfg, ONE_PROCESS, "sft", [], overwrite=False, resume=resume)


def refused_cleanly(result) -> None:
    """A psyrl error: a non-zero exit status, one message, no traceback."""
    assert result.exit_code != 0, result.output[-2000:]
    assert isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output


def verify(path: Path):
    return CliRunner().invoke(psyrl_main, ["checkpoint", "verify", str(path)])


# ------------------------------------------------------------------------------------- data loss
@pytest.mark.parametrize("fault", ["flipped shards", "garbage manifests"])
def test_auto_refuses_when_every_checkpoint_fails_and_deletes_nothing(trained, run, fault):
    for n in (2, 4):
        if fault == "flipped shards":
            flip(step(run, n) / SHARD)
        else:
            for manifest in step(run, n).rglob("manifest.json"):
                manifest.write_text("{garbage")
    before = snapshot(run)
    result = train_sft(trained, run.parent, "--resume", "auto")
    refused_cleanly(result)
    assert snapshot(run) == before  # not one file deleted or rewritten
    message = result.output
    assert "nothing was deleted" in message and "--overwrite" in message
    for n in (2, 4):
        assert str(step(run, n)) in message
    why = "its bytes changed" if fault == "flipped shards" else "manifest.json"
    assert message.count(why) >= 2


def test_the_experiment_runner_resumes_with_auto_and_never_overwrites(run):
    assert restart_flag(run) == ["--resume", "auto"]
    for n in (2, 4):
        flip(step(run, n) / SHARD)
    assert restart_flag(run) == ["--resume", "auto"]
    shutil.rmtree(run / "checkpoints")  # cut short before its first checkpoint
    assert restart_flag(run) == ["--resume", "auto"]


def test_auto_falls_back_to_the_checkpoint_before_a_corrupted_newest(run, capsys):
    flip(step(run, 4) / SHARD)
    assert resume_run(run, "auto").checkpoint == step(run, 2)
    assert f"warning: skipping {step(run, 4)}" in capsys.readouterr().out


def _renamed(run):  # what "move them away" inside checkpoints/ does
    for n in (2, 4):
        step(run, n).rename(step(run, n).with_name(f"step-{n}.damaged"))


def _quarantined(run):
    (run / "checkpoints" / "quarantine").mkdir()
    for n in (2, 4):
        step(run, n).rename(run / "checkpoints" / "quarantine" / f"step-{n}")


def _a_file(run):
    shutil.rmtree(run / "checkpoints")
    (run / "checkpoints").mkdir()
    step(run, 4).write_text("x")


LEFTOVERS = {
    "renamed step-N.damaged": (_renamed, ["step-2.damaged", "step-4.damaged"]),
    "moved into a subdirectory": (_quarantined, ["quarantine"]),
    "a file named step-4": (_a_file, ["step-4"]),
    "a finished run without checkpoints/": (
        lambda run: shutil.rmtree(run / "checkpoints"),
        ["hf"],
    ),
}


@pytest.mark.parametrize("fault", list(LEFTOVERS))
def test_auto_never_starts_over_a_run_that_holds_checkpoints_or_an_export(run, fault):
    mutate, named = LEFTOVERS[fault]
    mutate(run)
    with pytest.raises(RunError, match="nothing was deleted") as refused:
        resume_run(run, "auto")
    for name in named:
        assert name in str(refused.value)
    assert "--overwrite" in str(refused.value)


def test_auto_refuses_renamed_checkpoints_end_to_end_and_deletes_nothing(trained, run):
    _renamed(run)
    before = snapshot(run)
    result = train_sft(trained, run.parent, "--resume", "auto")
    refused_cleanly(result)
    assert snapshot(run) == before
    assert "step-4.damaged" in result.output and "starting over" not in result.output


def test_auto_starts_over_only_an_empty_checkpoints_directory_without_an_export(run):
    shutil.rmtree(run / "checkpoints")
    shutil.rmtree(run / "hf")
    (run / "checkpoints").mkdir()
    assert resume_run(run, "auto").wipe


def test_the_refusal_does_not_advise_moving_checkpoints_within_the_run(run):
    for n in (2, 4):
        flip(step(run, n) / SHARD)
    with pytest.raises(RunError, match="nothing was deleted") as refused:
        resume_run(run, "auto")
    assert "move them away" not in str(refused.value)


# ---------------------------------------------------------------- a run without metrics.jsonl
def test_a_run_without_metrics_but_with_checkpoints_is_never_treated_as_new(run):
    (run / "metrics.jsonl").unlink()
    assert restart_flag(run) == ["--resume", "auto"]
    with pytest.raises(RunError, match="already holds"):
        resume_run(run, "off")
    for resume in ("auto", "on"):
        with pytest.raises(RunError, match="no metrics.jsonl") as refused:
            resume_run(run, resume)
        assert "checkpoints/step-2" in str(refused.value) and "--overwrite" in str(refused.value)
    sets = [f"run.output_dir={json.dumps(str(run.parent))}"]
    cfg = load_config(run / "config.resolved.toml", sets)
    assert Run(cfg, ONE_PROCESS, "sft", [], overwrite=True, resume="off").wipe


def test_an_export_alone_makes_a_run_that_exists(run):
    (run / "metrics.jsonl").unlink()
    shutil.rmtree(run / "checkpoints")
    assert restart_flag(run) == ["--resume", "auto"]
    with pytest.raises(RunError, match="already holds"):
        resume_run(run, "off")


# ----------------------------------------------------------------- a manifest that fails closed
def _rank_as_text(m):
    m["checksums"][SHARD]["rank"] = "0"
    return m


def _checksum_five(m):
    m["checksums"][SHARD]["value"] = 5
    return m


def _entry_five(m):
    m["checksums"][SHARD] = 5
    return m


MALFORMED = {
    "a list": lambda m: "[]",
    "garbage": lambda m: "{garbage",
    "rank as text": _rank_as_text,
    "checksums null": lambda m: {**m, "checksums": None},
    "a checksum of 5": _checksum_five,
    "an entry of 5": _entry_five,
    "no files": lambda m: {k: v for k, v in m.items() if k != "files"},
    "sizes as text": lambda m: {**m, "files": {k: str(v) for k, v in m["files"].items()}},
    "a path outside": lambda m: {**m, "files": {**m["files"], "../../x": 1}},
}


@pytest.mark.parametrize("fault", list(MALFORMED))
def test_a_malformed_manifest_is_a_damaged_checkpoint_everywhere(run, fault, capsys):
    edit_manifest(step(run, 4), MALFORMED[fault])
    result = verify(run)
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    assert "Traceback" not in result.output
    assert f"damaged  {step(run, 4)}: manifest.json" in result.output
    # verify goes on to the other directories
    assert f"ok       {step(run, 2)}" in result.output and f"ok       {run / 'hf'}" in result.output
    assert resume_run(run, "auto").checkpoint == step(run, 2)
    assert f"warning: skipping {step(run, 4)}" in capsys.readouterr().out
    with pytest.raises(RunError, match=rf"--resume: {step(run, 4)}: damaged checkpoint"):
        resume_run(run, "on")


def test_a_manifest_that_drops_its_checksums_does_not_pass_a_corrupted_shard(run):
    flip(step(run, 4) / SHARD)
    edit_manifest(step(run, 4), lambda m: {k: v for k, v in m.items() if k != "checksums"})
    result = verify(step(run, 4))
    assert result.exit_code == 1 and "sizes only" not in result.output, result.output
    assert f"damaged  {step(run, 4)}: manifest.json" in result.output
    with pytest.raises(RunError, match="damaged checkpoint"):
        resume_run(run, "on")


def test_the_checksums_must_cover_every_listed_file(run):
    flip(step(run, 4) / SHARD)

    def drop_shard(m):
        del m["checksums"][SHARD]
        return m

    edit_manifest(step(run, 4), drop_shard)
    result = verify(step(run, 4))
    assert result.exit_code == 1, result.output
    assert f"{SHARD} has no checksum" in result.output
    with pytest.raises(RunError, match=f"damaged checkpoint .*{SHARD} has no checksum"):
        resume_run(run, "on")


def test_an_edit_of_the_manifest_alone_is_detected(run):
    # the shard's checksum rewritten to match its flipped bytes: a consistent-looking manifest
    flip(step(run, 4) / SHARD)
    found = file_checksum(step(run, 4) / SHARD)

    def rewrite(m):
        m["checksums"][SHARD]["value"] = found
        return m

    edit_manifest(step(run, 4), rewrite)
    result = verify(step(run, 4))
    assert result.exit_code == 1, result.output
    assert "manifest.json does not match" in result.output
    with pytest.raises(RunError, match="manifest.json does not match"):
        resume_run(run, "on")


def test_a_new_manifest_cannot_pass_for_one_written_before_checksums(run):
    flip(step(run, 4) / SHARD)
    edit_manifest(step(run, 4), lambda m: {"files": m["files"], "resumable": True})
    result = verify(step(run, 4))
    assert result.exit_code == 1 and "sizes only" not in result.output, result.output
    with pytest.raises(RunError, match="damaged checkpoint"):
        resume_run(run, "on")


def test_manifests_psyrl_wrote_before_keep_loading(run):
    # sizes only (before checksums), and checksums with no version and no hash of the manifest: as
    # psyrl wrote them before, rebuilt from the files on disk in those shapes
    old = {2: ("files", "resumable"), 4: ("files", "resumable", "checksum", "checksums")}
    for n, keys in old.items():
        d = step(run, n)
        manifest = write_manifest(d)
        for p in d.glob("manifest.json?*"):
            p.unlink()
        (d / "manifest.json").write_text(json.dumps({k: manifest[k] for k in keys}))
    result = verify(run)
    assert result.exit_code == 0, result.output
    assert "sizes only: written before checksums" in result.output
    assert resume_run(run, "on").checkpoint == step(run, 4)


def test_a_file_the_manifest_does_not_list_is_damage(run, capsys):
    # a manifest without version or checksum file (psyrl's earlier format) that drops a corrupted
    # shard from both "files" and "checksums": the shard is still on disk, and loaded
    d = step(run, 4)
    flip(d / SHARD)

    def drop_shard(m):
        del m["version"], m["files"][SHARD], m["checksums"][SHARD]
        return m

    edit_manifest(d, drop_shard)
    (d / "manifest.json.xxh3").unlink()
    result = verify(d)
    assert result.exit_code == 1, result.output
    assert f"holds {SHARD}, which its manifest does not list" in result.output
    with pytest.raises(RunError, match="which its manifest does not list"):
        resume_run(run, "on")
    assert resume_run(run, "auto").checkpoint == step(run, 2)
    assert f"warning: skipping {step(run, 4)}" in capsys.readouterr().out


def test_an_export_holding_a_file_its_manifest_does_not_list_is_refused(run):
    (run / "hf" / "added.safetensors").write_bytes(b"x" * 10)
    with pytest.raises(PsyrlError, match="holds added.safetensors, which its manifest does not"):
        load_tokenizer(ModelConfig(path=str(run / "hf")))


# ---------------------------------------------------------------------- exports verified on load
def chosen(run: Path, rule: str) -> Path:
    from psyrl.core.checkpoints import checkpoint_scores

    scores = checkpoint_scores(run)
    if rule == "last":
        return scores[-1][2]
    if rule == "best":
        return max(scores, key=lambda s: (s[1], -s[0]))[2]
    return scores[0][2]  # two equal scores: the lower median is the earlier step


@pytest.mark.parametrize("rule", ["best", "last", "median"])
def test_select_checkpoint_never_prints_a_damaged_export(run, rule):
    damaged = chosen(run, rule)
    flip(damaged / "hf" / "model.safetensors", offset=4096)
    result = CliRunner().invoke(psyrl_main, ["select-checkpoint", str(run), "--rule", rule])
    refused_cleanly(result)
    assert str(damaged / "hf") in result.output and "damaged" in result.output
    assert result.stdout.strip() != str(damaged / "hf")


def test_the_skip_is_explicit_and_says_so(run, monkeypatch):
    damaged = chosen(run, "last")
    flip(damaged / "hf" / "model.safetensors", offset=4096)
    monkeypatch.setenv("PSYRL_NO_VERIFY", "1")
    result = CliRunner().invoke(psyrl_main, ["select-checkpoint", str(run), "--rule", "last"])
    assert result.exit_code == 0, result.output
    assert result.stdout.strip().endswith(str(damaged / "hf"))
    assert "PSYRL_NO_VERIFY" in result.stderr and "not verified" in result.stderr


def test_evaluate_refuses_a_damaged_export(run, tmp_path):
    flip(run / "hf" / "model.safetensors", offset=4096)
    args = ["--model", run / "hf", "--benchmarks", "bbh", "--limit", 1, "--out", tmp_path / "e"]
    args += ["--max-new-tokens", "2", "--no-progress"]
    result = CliRunner().invoke(evaluate_script.evaluate, [str(a) for a in args])
    refused_cleanly(result)
    assert f"{run / 'hf'}: damaged" in result.output and "model.safetensors" in result.output
    assert not (tmp_path / "e" / "predictions.jsonl").exists()


@pytest.mark.parametrize("where", ["final export", "checkpoint export"])
def test_a_damaged_export_is_never_loaded_as_a_model(run, where):
    # T-GRPO's start model (model.path), the SFT -> T-GRPO handoff and any reload of an export
    hf = run / "hf" if where == "final export" else step(run, 4) / "hf"
    cfg = ModelConfig(path=str(hf))
    tokenizer = load_tokenizer(cfg)
    flip(hf / "model.safetensors", offset=4096)
    with pytest.raises(PsyrlError, match=f"{hf}: damaged .*model.safetensors"):
        load_model(cfg, tokenizer)
    with pytest.raises(PsyrlError, match="damaged"):
        load_tokenizer(cfg)


def test_an_export_whose_manifest_was_removed_is_refused(run):
    (run / "hf" / "manifest.json").unlink()
    with pytest.raises(PsyrlError, match="manifest.json is missing"):
        load_tokenizer(ModelConfig(path=str(run / "hf")))


def test_tgrpo_refuses_a_damaged_start_model(trained, run, tmp_path):
    flip(run / "hf" / "model.safetensors", offset=4096)
    sets = [
        f"run.output_dir={json.dumps(str(tmp_path / 'rl'))}",
        f"model.path={run / 'hf'}",
        f"data.train_file={trained / 'train.jsonl'}",
        'data.valid_file=""',
        "run.steps=1",
        "rollout.prompts=4",
        "rollout.samples=2",
        "optim.global_batch=4",
        "optim.micro_batch=4",
        "optim.logprob_micro_batch=4",
        "rollout.max_new_tokens=4",
        "sampler.batch=4",
        "log.progress=false",
    ]
    args = ["--config", "configs/tgrpo/tiny.toml", *(a for s in sets for a in ("--set", s))]
    result = CliRunner().invoke(cli_train.train_tgrpo, args)
    refused_cleanly(result)
    assert f"{run / 'hf'}: damaged" in result.output
    assert not (tmp_path / "rl").exists()


def test_the_experiment_runner_refuses_a_damaged_selected_checkpoint(run, monkeypatch):
    from psyrl.experiment import runner

    damaged = chosen(run, "median")
    flip(damaged / "hf" / "model.safetensors", offset=4096)
    monkeypatch.setattr(runner, "unit_dir", lambda experiment, spec, seed: run)

    class Experiment:
        path = "x.toml"
        runs = {"sft": object()}

    monkeypatch.setattr(runner, "partner_seed", lambda spec, seed: seed)
    with pytest.raises(SystemExit, match=f"{damaged / 'hf'}: damaged"):
        runner.resolve(Experiment(), "sft@median", None, dry=False)


def test_a_corrupted_validation_score_never_chooses(run):
    # the score's digits raised to 9s, the file's size kept: only its checksum tells
    scores = step(run, 2) / "validation.json"
    text = scores.read_text()
    number = re.search(r'"valid/f1": ([0-9.]+)', text)
    raised = re.sub("[0-8]", "9", number[1])
    scores.write_text(text[: number.start(1)] + raised + text[number.end(1) :])
    result = CliRunner().invoke(psyrl_main, ["select-checkpoint", str(run), "--rule", "best"])
    refused_cleanly(result)
    assert str(step(run, 2)) in result.output and "validation.json" in result.output
    for rule in ("median", "last"):  # the SFT run's own median choice and the experiment tables
        with pytest.raises(PsyrlError, match="validation.json"):
            select_checkpoint(run, rule)


def test_every_rank_verifies_an_export_before_loading_it(run, monkeypatch):
    # a rank other than a node's first must refuse too, not go on into the collectives
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("RANK", "1")
    flip(run / "hf" / "model.safetensors", offset=4096)
    with pytest.raises(PsyrlError, match=f"{run / 'hf'}: damaged"):
        load_tokenizer(ModelConfig(path=str(run / "hf")))


def test_the_sft_runs_median_choice_names_a_damaged_checkpoint_and_chooses_none(
    trained, tmp_path, monkeypatch
):
    # the run itself is complete: a warning instead of a choice, not a failed run
    from psyrl.core.checkpoints import DamagedCheckpoint
    from psyrl.recipes import sft

    def damaged(run_dir, rule):
        raise DamagedCheckpoint(
            f"{run_dir}/checkpoints/step-2: damaged checkpoint (validation.json)"
        )

    monkeypatch.setattr(sft, "select_checkpoint", damaged)
    result = train_sft(trained, tmp_path / "runs")
    assert result.exit_code == 0, result.output[-2000:]
    assert "warning: sft: no median-F1 checkpoint chosen" in result.output
    assert (
        "step-2: damaged checkpoint" in result.output
        and "median-F1 checkpoint (" not in result.output
    )
