"""The checkpoints a run leaves on disk, read without torch: which `checkpoints/step-N/` exist,
which are complete (their `manifest.json`, written last: the size of every file and its checksum),
which still hold a training state to resume from, and appendix B's choice among them by validation
F1. Writing and loading them is `psyrl.runtime.checkpoint`; `psyrl select-checkpoint`, `psyrl
report` and `psyrl experiment` only read, so they never import torch.

The checksum is XXH3-64 (`CHECKSUM`, the xxhash package), chosen by measurement (docs/
measurements.md, "what the checkpoint checksums cost"): each rank computes it over the bytes it
writes as it writes them, and `verify_checksums` recomputes it. A manifest written before psyrl
recorded checksums has sizes only: such a checkpoint is complete but its contents cannot be
checked.
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path

import xxhash

from psyrl.core.atomic import write_text

CHECKPOINT_GLOB = "step-*"
MANIFEST = "manifest.json"
STATE_PARTS = ("state", "rng")  # what `keep_state` prunes from older checkpoints
CHECKSUM = "xxh3_64"  # the manifest's name for `new_checksum`'s digest
CHUNK = 8 << 20  # bytes read at a time when a file is hashed from disk


def new_checksum() -> xxhash.xxh3_64:
    """A running checksum of `CHECKSUM`'s kind: XXH3, 64 bits, seed 0 (hashlib's `update` and
    `hexdigest`); the fastest measured: +11 % of a 0.5B checkpoint's save, zlib's CRC-32 +64 %."""
    return xxhash.xxh3_64()


def file_checksum(path: Path) -> str:
    """The checksum of a file's bytes, read in CHUNK-sized pieces into one buffer."""
    digest, buffer = new_checksum(), bytearray(CHUNK)
    view = memoryview(buffer)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(buffer):
            digest.update(view[:n])
    return digest.hexdigest()


def write_hashed(path: Path, data: bytes) -> str:
    """Write `data` to `path` and return its checksum (computed from the bytes in memory: the file
    is not read back)."""
    digest = new_checksum()
    digest.update(data)
    path.write_bytes(data)
    return digest.hexdigest()


def _sizes(directory: Path) -> dict[str, int]:
    return {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p != directory / MANIFEST
    }


def read_manifest(directory: str | Path) -> dict:
    return json.loads((Path(directory) / MANIFEST).read_text(encoding="utf-8"))


def verify(directory: str | Path) -> str | None:
    """None if `directory` is a complete checkpoint, else what is wrong with it (missing manifest or
    file, wrong size)."""
    directory = Path(directory)
    try:
        manifest = read_manifest(directory)
    except (OSError, ValueError) as e:
        return f"no readable {MANIFEST} ({type(e).__name__})"
    for name, size in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} expected"
    return None


def verify_checksums(directory: str | Path, names: Iterable[str] | None = None) -> str | None:
    """Recompute the checksums of the manifest's files `names` (all by default): None if every one
    matches (or the manifest has no checksums: see `has_checksums`), else what is wrong, naming the
    first file that differs."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    sums = manifest.get("checksums")
    if sums is None:
        return None
    if manifest.get("checksum") != CHECKSUM:
        return f"checksums of an unknown kind {manifest.get('checksum')!r}, {CHECKSUM!r} expected"
    for name in sorted(sums) if names is None else names:
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        try:
            found, expected = file_checksum(path), sums[name]["value"]
        except OSError as e:  # a disk that fails to read is as bad as one that changes bytes
            return f"{name} cannot be read ({e})"
        if found != expected:
            return f"{name} has {CHECKSUM} {found}, {expected} expected: its bytes changed"
    return None


def has_checksums(directory: str | Path) -> bool:
    """Whether the manifest records checksums (checkpoints written before psyrl did: sizes only)."""
    return "checksums" in read_manifest(directory)


def verified_dirs(directory: str | Path) -> list[Path]:
    """What `psyrl checkpoint verify DIR` checks: DIR itself when it holds a manifest (a checkpoint
    or an HF export), else a run directory's checkpoints and final export."""
    directory = Path(directory)
    if (directory / MANIFEST).is_file():
        return [directory]
    found = [d for _, d in checkpoint_dirs(directory)]
    return found + ([directory / "hf"] if (directory / "hf" / MANIFEST).is_file() else [])


def check(directory: str | Path) -> str | None:
    """None if every file of `directory` is there with its size and checksum, else the first
    problem (sizes first: they cost no read)."""
    return verify(directory) or verify_checksums(directory)


def write_manifest(
    directory: Path,
    manifest: dict | None = None,
    checksums: dict[str, tuple[int, str]] | None = None,
) -> dict:
    """Atomically (temporary file, then rename) write `manifest`, by default: the size of every file
    now there, whether a training state is among them, and the checksum of each with the rank that
    computed it: `checksums` (name -> (rank, digest)) as the ranks computed them while writing, the
    others read back here by this process (rank 0). Returns the manifest."""
    if manifest is None:
        sizes, checksums = _sizes(directory), checksums or {}
        sums = {}
        for name in sizes:
            rank, value = checksums.get(name) or (0, file_checksum(directory / name))
            sums[name] = {"rank": rank, "value": value}
        manifest = {
            "files": sizes,
            "resumable": (directory / "state").is_dir(),
            "checksum": CHECKSUM,
            "checksums": sums,
        }
    write_text(directory / MANIFEST, json_text(manifest))
    return manifest


def checkpoint_dirs(run_dir: str | Path) -> list[tuple[int, Path]]:
    """(step, directory) of every `checkpoints/step-N`, by step (complete or not)."""
    found = []
    for d in Path(run_dir, "checkpoints").glob(CHECKPOINT_GLOB):
        suffix = d.name.split("-", 1)[1]
        if d.is_dir() and suffix.isdigit():
            found.append((int(suffix), d))
    return sorted(found)


def _resumable(directory: Path) -> bool:
    """Complete, and its manifest still promises a training state (pruning withdraws that promise
    first)."""
    if verify(directory) is not None:
        return False
    return read_manifest(directory).get("resumable", False)


def prune_states(checkpoints: Path, keep: int) -> None:
    """Drop `state/` and `rng/` from all but the `keep` newest resumable checkpoints (0: keep all);
    their HF exports and scores stay. The manifest is rewritten first, so a crash in between leaves
    a checkpoint that is complete but no longer offered for resume."""
    if keep <= 0:
        return
    resumable = [d for _, d in checkpoint_dirs(checkpoints.parent) if _resumable(d)]
    for d in resumable[:-keep]:
        # a failure here (full disk) costs only disk space: the checkpoint stays complete and
        # resumable
        try:
            manifest = read_manifest(d)
            for part in ("files", "checksums"):
                if part in manifest:  # checkpoints written before checksums have no "checksums"
                    manifest[part] = {
                        k: v
                        for k, v in manifest[part].items()
                        if k.split("/")[0] not in STATE_PARTS
                    }
            write_manifest(d, {**manifest, "resumable": False})
        except (OSError, ValueError, KeyError):
            continue
        for part in STATE_PARTS:
            shutil.rmtree(d / part, ignore_errors=True)


def find_resumable(
    run_dir: str | Path, warn: Callable[[str], None], skip: Iterable[Path] = ()
) -> Path | None:
    """The newest complete checkpoint holding a training state, not among `skip` (those whose
    checksums failed); incomplete ones are reported through `warn` and skipped (the previous one is
    used). Sizes only: the checksums are `verify_checksums`'s, read by every rank."""
    skip = set(skip)
    for _, d in reversed(checkpoint_dirs(run_dir)):
        if d in skip:
            continue
        problem = verify(d)
        if problem:
            warn(f"warning: skipping {d}: incomplete checkpoint ({problem})")
        elif _resumable(d):
            return d
    return None


def json_text(obj) -> str:
    """Stable, readable JSON for the files of a checkpoint."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def checkpoint_scores(
    run_dir: str | Path, metric: str = "valid/f1"
) -> list[tuple[int, float, Path]]:
    """(step, score, directory) of every complete checkpoint with a validation.json, by step."""
    found = []
    for step, d in checkpoint_dirs(run_dir):
        scores = d / "validation.json"
        if scores.is_file() and verify(d) is None:
            held_out = json.loads(scores.read_text())
            if metric not in held_out:  # e.g. a run validated on data.valid_files alone
                keys = ", ".join(k for k in held_out if k.endswith("/f1")) or "none"
                raise ValueError(f"{scores}: no {metric!r} score (its F1 keys: {keys})")
            found.append((step, held_out[metric], d))
    return found


def select_checkpoint(
    run_dir: str | Path, rule: str = "median", metric: str = "valid/f1"
) -> tuple[int, float, Path]:
    """Appendix B: GRPO starts from "the SFT checkpoint that achieves the median F1". `median` takes
    the lower median of the scores (a real checkpoint; the earlier step on ties); `best` the
    highest; `last` the latest."""
    scores = checkpoint_scores(run_dir, metric)
    if not scores:
        raise FileNotFoundError(
            f"{run_dir}: no checkpoints/step-N/validation.json (set checkpoint.every > 0)"
        )
    if rule == "last":
        return scores[-1]
    if rule == "best":
        return max(scores, key=lambda s: (s[1], -s[0]))
    if rule != "median":
        raise ValueError(f"unknown rule {rule!r}; expected median, best or last")
    by_score = sorted(scores, key=lambda s: (s[1], s[0]))
    target = statistics.median_low([s[1] for s in by_score])
    return next(s for s in by_score if s[1] == target)
