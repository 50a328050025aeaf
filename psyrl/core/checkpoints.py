"""The checkpoints a run leaves on disk, read without torch: which `checkpoints/step-N/` exist,
which are complete (their `manifest.json`, written last: the size of every file and its checksum),
which still hold a training state to resume from, and appendix B's choice among them by validation
F1. Writing and loading them is `psyrl.runtime.checkpoint`; `psyrl select-checkpoint`, `psyrl
report` and `psyrl experiment` only read, so they never import torch.

The checksum is XXH3-64 (`CHECKSUM`, the xxhash package), chosen by measurement (docs/
measurements.md, "what the checkpoint checksums cost"): each rank computes it over the bytes it
writes as it writes them, and `verify_checksums` recomputes it.

A manifest fails closed. `read_manifest` checks its schema (an object; `files`: relative path ->
byte count; `resumable`: true/false; `checksums`: name -> rank and 16 hex digits, one for every
listed file and none for a file not listed), so a malformed manifest is a damaged checkpoint, never
a crash, and an edit that drops a checksum cannot switch that file's check off. Its `version`
says what it must hold: version 2 (written now) has checksums and its own checksum beside it;
without a version field it is psyrl's earlier format, sizes only (written before checksums, the
one form allowed to have none) or with checksums.

The manifest's own checksum lives in a file of its own, `manifest.json.xxh3`, written atomically
after the manifest. Not inside the manifest: an edit of the manifest could rewrite it in the same
stroke. Not in the run's trainer state or an index above the checkpoint: a checkpoint or an export
copied on its own must still carry it, and a step-N's export (`hf/`) is covered twice, its manifest
and that file being files of step-N's manifest. So a damaged manifest, or an edit of the manifest
alone (a checksum rewritten to match changed bytes, an entry or the version dropped to pass for an
older format), no longer matches and the checkpoint is refused; while that file exists the
manifest is checked against it whatever its version says. The limit: this detects damage and
edits, not forgery. Whoever rewrites the files, the manifest and its checksum file consistently
(or deletes the version and the checksum file together) passes, as they could with any checksum
psyrl computes without a secret.

`verify_before_load` is the one check before a model directory is loaded (T-GRPO's and evaluate's
model.path, the export `psyrl select-checkpoint` hands on); `PSYRL_NO_VERIFY=1` skips it, saying so.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
from collections.abc import Callable, Iterable
from pathlib import Path

import xxhash

from psyrl.core.atomic import write_text
from psyrl.core.errors import PsyrlError

CHECKPOINT_GLOB = "step-*"
MANIFEST = "manifest.json"
MANIFEST_SUM = "manifest.json.xxh3"  # the manifest's own checksum, written after it
MANIFEST_VERSION = 2  # 2: checksums and MANIFEST_SUM; none (1): sizes, checksums optional
MANIFEST_KEYS = {"version", "files", "resumable", "checksum", "checksums"}
SKIP_VERIFY = "PSYRL_NO_VERIFY"  # =1: load a model directory without `verify_before_load`
STATE_PARTS = ("state", "rng")  # what `keep_state` prunes from older checkpoints
CHECKSUM = "xxh3_64"  # the manifest's name for `new_checksum`'s digest
CHUNK = 8 << 20  # bytes read at a time when a file is hashed from disk


class DamagedCheckpoint(PsyrlError, ValueError):
    """A checkpoint or export whose manifest or files fail their checks."""


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
        if p.is_file() and p not in (directory / MANIFEST, directory / MANIFEST_SUM)
    }


def _is_count(value) -> bool:
    return type(value) is int and value >= 0  # bool is an int: excluded


def _inside(name) -> bool:
    """A relative path that stays inside the checkpoint (no `..`, not absolute)."""
    return (
        isinstance(name, str)
        and name != ""
        and not Path(name).is_absolute()
        and (".." not in Path(name).parts)
    )


def _schema_problem(manifest) -> str | None:
    """What makes `manifest` (parsed JSON) other than a manifest psyrl writes, else None."""
    if not isinstance(manifest, dict):
        return f"is a JSON {type(manifest).__name__}, not an object"
    unknown = sorted(set(manifest) - MANIFEST_KEYS)
    if unknown:
        return f"has unknown key(s) {', '.join(map(repr, unknown))}"
    version = manifest.get("version", 1)
    if not _is_count(version) or version not in (1, MANIFEST_VERSION):
        return f"has version {version!r}; this psyrl reads 1 (no version field) and 2"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return 'has no "files" object (file name -> size)'
    for name, size in files.items():
        if not _inside(name):
            return f"lists {name!r}, not a path inside the directory"
        if not _is_count(size):
            return f"gives {name} the size {size!r}, not a byte count"
    if type(manifest.get("resumable")) is not bool:
        return 'has no true/false "resumable"'
    if "checksums" not in manifest:
        if version >= 2:
            return f'of version {version} has no "checksums"'
        if "checksum" in manifest:
            return 'names a "checksum" kind but has no "checksums"'
        return None  # version 1 as written before checksums: sizes only
    if manifest.get("checksum") != CHECKSUM:
        return (
            f"has checksums of an unknown kind {manifest.get('checksum')!r}, {CHECKSUM!r} expected"
        )
    sums = manifest["checksums"]
    if not isinstance(sums, dict):
        return 'has "checksums" that is not an object (file name -> rank and value)'
    for name, entry in sums.items():
        if name not in files:
            return f"has a checksum for {name!r}, a file it does not list"
        if not (isinstance(entry, dict) and entry.keys() == {"rank", "value"}):
            return f'gives {name} the checksum entry {entry!r}, not {{"rank", "value"}}'
        if not _is_count(entry["rank"]):
            return f"gives {name} the rank {entry['rank']!r}, not a rank number"
        if not (isinstance(entry["value"], str) and re.fullmatch("[0-9a-f]{16}", entry["value"])):
            return f"gives {name} the checksum {entry['value']!r}, not 16 hex digits"
    missing = sorted(set(files) - set(sums))
    if missing:
        return f"lists {missing[0]} but {missing[0]} has no checksum (they must cover every file)"
    return None


def _own_checksum_problem(directory: Path, raw: bytes, version: int) -> str | None:
    """Whether the manifest's bytes `raw` match MANIFEST_SUM beside it (required from version 2
    on; checked whenever it exists)."""
    path = directory / MANIFEST_SUM
    if not path.is_file():
        if version >= 2:
            return f"of version {version} has no {MANIFEST_SUM} (the manifest's own checksum)"
        return None
    try:
        recorded = re.fullmatch(f"{CHECKSUM} ([0-9a-f]{{16}})\n?", path.read_text(encoding="ascii"))
    except (OSError, ValueError) as e:
        return f"cannot be checked: {MANIFEST_SUM} is unreadable ({type(e).__name__})"
    if recorded is None:
        return f"cannot be checked: {MANIFEST_SUM} holds no {CHECKSUM} line"
    digest = new_checksum()
    digest.update(raw)
    if digest.hexdigest() != recorded[1]:
        return (
            f"does not match its checksum in {MANIFEST_SUM} ({digest.hexdigest()}, "
            f"{recorded[1]} recorded): edited or damaged after it was written"
        )
    return None


def read_manifest(directory: str | Path) -> dict:
    """`directory`'s manifest, checked: DamagedCheckpoint("manifest.json ...") when it is
    unreadable, not psyrl's schema (`_schema_problem`) or not the bytes its checksum file
    recorded."""
    directory = Path(directory)
    try:
        raw = (directory / MANIFEST).read_bytes()
        manifest = json.loads(raw)
    except (OSError, ValueError) as e:  # a UnicodeDecodeError is a ValueError
        raise DamagedCheckpoint(
            f"{MANIFEST} is missing or unreadable ({type(e).__name__})"
        ) from None
    problem = _schema_problem(manifest) or _own_checksum_problem(
        directory, raw, manifest.get("version", 1)
    )
    if problem:
        raise DamagedCheckpoint(f"{MANIFEST} {problem}")
    return manifest


def verify(directory: str | Path) -> str | None:
    """None if `directory` is a complete checkpoint, else what is wrong with it (its manifest,
    a missing file, a wrong size)."""
    directory = Path(directory)
    try:
        manifest = read_manifest(directory)
    except DamagedCheckpoint as e:
        return str(e)
    for name, size in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} expected"
    # a file the manifest does not list is read by no check but may be loaded (a shard dropped
    # from "files" and "checksums" together)
    for name in _sizes(directory):
        if name not in manifest["files"] and not _may_be_unlisted(name, manifest):
            return f"holds {name}, which its manifest does not list"
    return None


def _may_be_unlisted(name: str, manifest: dict) -> bool:
    """psyrl's unfinished temporaries (`tidy` deletes them), and the training state `prune_states`
    deletes after it withdrew the manifest's promise of one (a crash in between leaves it)."""
    parts = name.split("/")
    if any(_temporary(part) for part in parts):
        return True
    return parts[0] in STATE_PARTS and not manifest["resumable"]


def verify_checksums(directory: str | Path, names: Iterable[str] | None = None) -> str | None:
    """Recompute the checksums of the manifest's files `names` (all by default): None if every one
    matches (or the manifest predates checksums: see `has_checksums`), else what is wrong, naming
    the first file that differs."""
    directory = Path(directory)
    try:
        manifest = read_manifest(directory)
    except DamagedCheckpoint as e:
        return str(e)
    sums = manifest.get("checksums")
    if sums is None:
        return None
    for name in sorted(sums) if names is None else names:
        path = directory / name
        if name not in sums:
            return f"{name} has no checksum in {MANIFEST}"
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
    """Atomically (temporary file, then rename) write `manifest`, then its own checksum
    (MANIFEST_SUM), by default: the version, the size of every file now there, whether a training
    state is among them, and the checksum of each with the rank that computed it: `checksums`
    (name -> (rank, digest)) as the ranks computed them while writing, the others read back here by
    this process (rank 0). Returns the manifest."""
    if manifest is None:
        sizes, checksums = _sizes(directory), checksums or {}
        sums = {}
        for name in sizes:
            rank, value = checksums.get(name) or (0, file_checksum(directory / name))
            sums[name] = {"rank": rank, "value": value}
        manifest = {
            "version": MANIFEST_VERSION,
            "files": sizes,
            "resumable": (directory / "state").is_dir(),
            "checksum": CHECKSUM,
            "checksums": sums,
        }
    text = json_text(manifest)
    write_text(directory / MANIFEST, text)
    digest = new_checksum()
    digest.update(text.encode("utf-8"))
    write_text(directory / MANIFEST_SUM, f"{CHECKSUM} {digest.hexdigest()}\n")
    return manifest


def _temporary(name: str) -> bool:
    """psyrl's unfinished `.<name>.tmp-<tag>` (`psyrl.core.atomic`), which `tidy` deletes."""
    return name.startswith(".") and ".tmp-" in name


def run_results(run_dir: str | Path) -> list[str]:
    """What of `run_dir` only a trainer writes and only --overwrite may delete, as paths relative
    to it: every entry of `checkpoints/`, a checkpoint or not (a renamed or moved one, a stray
    file), psyrl's unfinished temporaries aside, and the final export `hf/`."""
    run_dir = Path(run_dir)
    checkpoints = run_dir / "checkpoints"
    held = []
    if checkpoints.is_dir():
        held += sorted(
            f"checkpoints/{p.name}" for p in checkpoints.iterdir() if not _temporary(p.name)
        )
    elif checkpoints.exists():
        held.append("checkpoints")
    return held + (["hf"] if (run_dir / "hf").exists() else [])


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
    return read_manifest(directory)["resumable"]


def prune_states(checkpoints: Path, keep: int) -> None:
    """Drop `state/` and `rng/` from all but the `keep` newest resumable checkpoints (0: keep all);
    their HF exports and scores stay. The manifest is rewritten first, so a crash in between leaves
    a checkpoint that is complete but no longer offered for resume (a crash between the manifest
    and its checksum file leaves it refused as damaged: fail closed)."""
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
        except (OSError, ValueError):
            continue
        for part in STATE_PARTS:
            shutil.rmtree(d / part, ignore_errors=True)


def find_resumable(
    run_dir: str | Path, warn: Callable[[str], None], skip: Iterable[Path] = ()
) -> Path | None:
    """The newest complete checkpoint holding a training state, not among `skip` (those whose
    checksums failed); damaged ones (manifest, missing file, size) are reported through `warn` and
    skipped (the previous one is used). Sizes only: the checksums are `verify_checksums`'s, read by
    every rank."""
    skip = set(skip)
    for _, d in reversed(checkpoint_dirs(run_dir)):
        if d in skip:
            continue
        problem = verify(d)
        if problem:
            warn(f"warning: skipping {d}: damaged checkpoint ({problem})")
        elif _resumable(d):
            return d
    return None


def checkpoint_problems(
    run_dir: str | Path, corrupted: dict[Path, str], after: Path | None = None
) -> list[tuple[Path, str]]:
    """Why each checkpoint of `run_dir` newer than `after` (all when None) cannot be resumed, by
    step: its checksum problem in `corrupted`, `verify`'s, or no training state."""
    first = -1 if after is None else int(after.name.split("-", 1)[1])
    return [
        (d, corrupted.get(d) or verify(d) or "no training state (checkpoint.keep_state pruned it)")
        for step, d in checkpoint_dirs(run_dir)
        if step > first
    ]


def _run_export(directory: Path) -> bool:
    """An HF export psyrl wrote inside a run: `hf/` of a checkpoint or of a run directory."""
    parent = directory.parent
    return directory.name == "hf" and (
        (parent / MANIFEST).is_file() or (parent / "config.resolved.toml").is_file()
    )


def _state(directory: Path) -> tuple:
    """What changes when a file of `directory` (or its checkpoint's manifest) is rewritten."""
    paths = [p for p in sorted(directory.rglob("*")) if p.is_file()]
    paths += [directory.parent / name for name in (MANIFEST, MANIFEST_SUM)]
    return tuple(
        (str(p), st.st_size, st.st_mtime_ns) for p in paths if p.is_file() and (st := p.stat())
    )


_VERIFIED: set[tuple] = set()  # `_state`s this process verified: each export is read once


def _export_problem(directory: Path) -> str | None:
    """`check` of the export, and of its manifest files as its checkpoint's manifest lists them."""
    if not (directory / MANIFEST).is_file():
        return f"{MANIFEST} is missing: a psyrl export always has one"
    problem = check(directory)
    parent = directory.parent
    if problem is None and (parent / MANIFEST).is_file():
        names = [f"{directory.name}/{name}" for name in (MANIFEST, MANIFEST_SUM)]
        try:
            listed = read_manifest(parent).get("checksums", {})
        except DamagedCheckpoint as e:
            return f"its checkpoint's {e}"
        problem = verify_checksums(parent, [n for n in names if n in listed])
        problem = problem and f"its checkpoint {parent.name}: {problem}"
    return problem


def verify_before_load(directory: str | Path, note: Callable[[str], None] = print) -> None:
    """The check before psyrl loads a model directory (T-GRPO's start model, evaluate --model, the
    export `psyrl select-checkpoint` and the experiment runner hand on): a directory with a
    manifest, or an `hf/` export inside a run, must pass `check` (manifest, sizes, checksums) and,
    as a checkpoint's `hf/`, match its checkpoint's checksums of its manifest; else
    DamagedCheckpoint. A model psyrl did not write (a downloaded one: no manifest) has nothing to
    check. Each export is read once per process while its files are unchanged. With
    PSYRL_NO_VERIFY=1 nothing is read, and `note` says so."""
    directory = Path(directory)
    if not ((directory / MANIFEST).is_file() or _run_export(directory)):
        return
    if os.environ.get(SKIP_VERIFY, "") not in ("", "0"):
        note(
            f"note: {SKIP_VERIFY}={os.environ[SKIP_VERIFY]}: {directory} not verified (its files "
            "were not compared with its manifest)"
        )
        return
    state = _state(directory)
    if state in _VERIFIED:
        return
    problem = _export_problem(directory)
    if problem:
        raise DamagedCheckpoint(
            f"{directory}: damaged ({problem}); refusing to load it (`psyrl checkpoint verify "
            f"{directory}` lists every problem; {SKIP_VERIFY}=1 loads it unchecked)"
        )
    if "checksums" not in read_manifest(directory):
        note(f"note: {directory} was written before checksums: only its sizes were checked")
    _VERIFIED.add(state)


def json_text(obj) -> str:
    """Stable, readable JSON for the files of a checkpoint."""
    return json.dumps(obj, indent=2, sort_keys=True) + "\n"


def checkpoint_scores(
    run_dir: str | Path, metric: str = "valid/f1"
) -> list[tuple[int, float, Path]]:
    """(step, score, directory) of every checkpoint with a validation.json, by step. Every
    checkpoint must pass `verify` and its validation.json its checksum, else DamagedCheckpoint: a
    choice among the others, or by a changed score, would be another choice, made silently."""
    found = []
    for step, d in checkpoint_dirs(run_dir):
        scores = d / "validation.json"
        if not (scores.is_file() or (d / MANIFEST).is_file()):
            continue  # neither a score nor a manifest: nothing there could be chosen
        problem = verify(d)
        if problem is None and scores.is_file():
            problem = verify_checksums(d, ["validation.json"])
        if problem:
            raise DamagedCheckpoint(
                f"{d}: damaged checkpoint ({problem}); no checkpoint of {run_dir} is chosen while "
                f"one is damaged (`psyrl checkpoint verify {d}` lists every problem; move it out "
                "of the run directory to choose among the others)"
            )
        if scores.is_file():
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
