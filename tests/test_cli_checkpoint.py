"""`psyrl checkpoint verify DIR`: a checkpoint, an HF export or a whole run directory read back
against its manifests; a flipped byte, a missing file or a directory without a manifest ends with
exit status 1 and says which."""

import json

from click.testing import CliRunner

from psyrl.cli.main import main
from psyrl.core.checkpoints import write_manifest


def run_dir(tmp_path):
    """A run with two checkpoints and a final export, each a stand-in file under its manifest."""
    run = tmp_path / "sft"
    for d in (run / "checkpoints" / "step-1", run / "checkpoints" / "step-2", run / "hf"):
        d.mkdir(parents=True)
        (d / "model.safetensors").write_bytes(bytes(range(256)) * 4096)  # 1 MiB
        (d / "config.json").write_text("{}\n")
        write_manifest(d)
    return run


def verify(path):
    return CliRunner().invoke(main, ["checkpoint", "verify", str(path)])


def test_verify_a_run_a_checkpoint_and_an_export(tmp_path):
    run = run_dir(tmp_path)
    result = verify(run)
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines == [
        f"ok       {run / 'checkpoints' / 'step-1'} (2 files, 1.0 MiB, xxh3_64)",
        f"ok       {run / 'checkpoints' / 'step-2'} (2 files, 1.0 MiB, xxh3_64)",
        f"ok       {run / 'hf'} (2 files, 1.0 MiB, xxh3_64)",
    ]
    assert verify(run / "hf").output == lines[2] + "\n"


def test_a_flipped_byte_and_a_missing_file_are_named(tmp_path):
    run = run_dir(tmp_path)
    weights = run / "checkpoints" / "step-2" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0xFF  # the size kept
    weights.write_bytes(bytes(data))
    (run / "hf" / "config.json").unlink()
    result = verify(run)
    assert result.exit_code == 1
    assert (
        f"damaged  {run / 'checkpoints' / 'step-2'}: model.safetensors has xxh3_64 "
        in result.output
    )
    assert f"damaged  {run / 'hf'}: config.json is missing" in result.output
    assert f"Error: 2 of 3 directories in {run} are damaged" in result.output


def test_an_old_manifest_is_sizes_only_and_no_manifest_is_an_error(tmp_path):
    run = run_dir(tmp_path)
    old = run / "checkpoints" / "step-1"
    sizes = json.loads((old / "manifest.json").read_text())["files"]
    write_manifest(old, {"files": sizes, "resumable": False})
    assert "(2 files, 1.0 MiB, sizes only: written before checksums)" in verify(old).output
    result = verify(tmp_path)
    assert result.exit_code == 1
    assert f"Error: {tmp_path} holds no manifest.json: not a checkpoint" in result.output
