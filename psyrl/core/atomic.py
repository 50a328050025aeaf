"""All-or-nothing writes: a file or directory is assembled under a temporary name
`.<name>.tmp-<tag>` and renamed into place, so a crash never leaves a half-written one under its
real name; `tidy` clears what a crash left behind."""

from __future__ import annotations

import os
import shutil
from pathlib import Path


def temporary(final: Path, tag: str | int | None = None) -> Path:
    """`.<name>.tmp-<tag>` next to `final` (tag: this process's pid unless given)."""
    return final.with_name(f".{final.name}.tmp-{os.getpid() if tag is None else tag}")


def write_text(path: str | Path, text: str) -> None:
    """Write a UTF-8 text file atomically: a temporary file in the same directory, then a rename."""
    path = Path(path)
    tmp = temporary(path)
    with tmp.open("w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        # on disk before the rename makes it visible: a power cut leaves no empty file
        os.fsync(f.fileno())
    tmp.replace(path)
    _sync_dir(path.parent)


def sync_tree(directory: Path) -> None:
    """fsync every file below `directory` (before the rename that publishes it)."""
    for path in directory.rglob("*"):
        if path.is_file():
            with path.open("rb") as f:
                os.fsync(f.fileno())


def _sync_dir(directory: Path) -> None:
    """Persist a rename (POSIX: the directory entry lives in the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_dir(tmp: Path, final: Path) -> None:
    """Move a finished directory into place. The previous version is renamed to `<name>.old` first
    and deleted last: at every instant one complete version exists under `final` or `<name>.old`
    (`tidy` restores it)."""
    old = final.with_name(final.name + ".old")
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
    tmp.rename(final)
    _sync_dir(final.parent)
    shutil.rmtree(old, ignore_errors=True)


def tidy(directory: str | Path) -> None:
    """After a crash: delete unfinished `.<name>.tmp-<tag>` directories and files; put back a
    `<name>.old` whose replacement never arrived."""
    directory = Path(directory)
    if not directory.is_dir():
        return
    for path in sorted(directory.rglob(".*.tmp-*")):
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)
    for old in sorted(directory.rglob("*.old")):
        final = old.with_name(old.name[: -len(".old")])
        if final.exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.rename(final)
