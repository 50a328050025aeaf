"""`psyrl checkpoint verify DIR`: every file of a checkpoint, an HF export or a whole run directory
read back and compared with its manifest (sizes and checksums), as a resume compares them; a
malformed or edited manifest is a damaged directory, reported, and the next one is checked."""

from __future__ import annotations

import click

from psyrl.cli.errors import reported


@click.group("checkpoint")
def checkpoint_group():
    """Checkpoints and HF exports on disk."""


@click.command("verify")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
def verify_command(directory):
    """Read every file of DIR (a checkpoints/step-N, an hf/ export, or a run directory: all its
    checkpoints and its final export) and compare its size and checksum with the manifest; exit
    status 1 when one differs."""
    from psyrl.core.checkpoints import CHECKSUM, check, read_manifest, verified_dirs
    from psyrl.core.errors import PsyrlError

    with reported("psyrl checkpoint verify", also=(OSError, ValueError)):
        found = verified_dirs(directory)
        if not found:
            raise PsyrlError(
                f"{directory} holds no manifest.json: not a checkpoint, an HF export or a run "
                "directory with either"
            )
        bad = 0
        for d in found:
            problem = check(d)
            bad += problem is not None
            if problem:
                click.echo(f"damaged  {d}: {problem}")
                continue
            manifest = read_manifest(d)
            files = manifest["files"]
            how = CHECKSUM if "checksums" in manifest else "sizes only: written before checksums"
            click.echo(
                f"ok       {d} ({len(files)} files, {sum(files.values()) / 2**20:.1f} MiB, {how})"
            )
        if bad:
            raise PsyrlError(f"{bad} of {len(found)} directories in {directory} are damaged")


checkpoint_group.add_command(verify_command)
