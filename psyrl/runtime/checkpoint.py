"""Writing and loading what a run leaves on disk: Hugging Face exports and resumable checkpoints
(reading which exist, which are complete and appendix B's choice: `psyrl.core.checkpoints`).

`checkpoints/step-N/` holds `hf/` (an HF export: config, safetensors, tokenizer, generation config),
`state/` (model and optimiser shards, `torch.distributed.checkpoint`), `rng/rank-R.safetensors`
(every rank's RNG states), the trainer's JSON files (step, data position, trajectory cache, ...) and
`manifest.json`, the size and checksum of every file (version 2; its own checksum in
`manifest.json.xxh3`, why there: `psyrl.core.checkpoints`). Everything is written under a
temporary name and renamed into place (`psyrl.core.atomic`), and the manifest is written last: a
directory cut short (a crash, a full disk, a copy that stopped) fails `verify` and is skipped with
a warning. Each
rank computes the checksums of the files it writes while writing them (DCP's shards through
`_HashingFileSystem`, the RNG and text files from memory); only the HF export's files, written by
transformers and safetensors, are read back; rank 0 gathers them into the manifest, and on resume
each rank recomputes those of its own files (`verify_files`). An HF export (`hf/`, in a checkpoint
or the run's final one) carries a manifest of its own: `psyrl checkpoint verify DIR`. psyrl pickles
nothing and never calls `torch.load`; the state holds tensors only, and DCP's own index
`state/.metadata` (torch's format) is the one pickle on disk.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError
from safetensors.torch import load_file, save
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.filesystem import FileSystem
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from psyrl.core.atomic import replace_dir, sync_tree, temporary, write_text
from psyrl.core.checkpoints import (
    DamagedCheckpoint,
    new_checksum,
    prune_states,
    read_manifest,
    verify_checksums,
    write_hashed,
    write_manifest,
)
from psyrl.core.errors import PsyrlError
from psyrl.runtime.distributed import (
    DTYPES,
    ONE_PROCESS,
    Dist,
    agree,
    all_gather_lists,
    gather_to_rank0,
)

# a full disk surfaces as any of these
WRITE_ERRORS = (OSError, SafetensorError, CheckpointException)
Checksums = dict[str, str]  # a rank's files, relative to the directory being written -> checksum


class CheckpointError(PsyrlError, RuntimeError):
    """A checkpoint could not be written (the previous ones are intact) or read."""


def _temporary(final: Path, dist: Dist, tag: str) -> Path:
    """The same temporary name on every rank (a pid-named one in one process); rank 0 clears a
    leftover."""
    tmp = temporary(final, tag if dist.sharded else None)
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def _write_hf(
    policy,
    tokenizer,
    directory: Path,
    dist: Dist,
    dtype: str = "float32",
    files: dict[str, str] | None = None,
    sums: Checksums | None = None,
) -> None:
    """Collective: the shards go to rank 0 one tensor at a time (`gather_to_rank0`: the other ranks
    only send), which casts them to `dtype` and writes, with `files` (name -> text) beside them and
    a manifest of them all (sizes and checksums, read back once: transformers writes the files),
    whose checksums also go to `sums` (a checkpoint's, under `hf/`). config.json states that dtype
    (transformers would write the live model's)."""
    state = {
        name: tensor.to(DTYPES[dtype])
        for name, tensor in gather_to_rank0(policy, prefix="lm.")
        if tensor is not None
    }
    if dist.is_main:
        policy.lm.save_pretrained(str(directory), state_dict=state, safe_serialization=True)
        tokenizer.save_pretrained(str(directory))
        config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
        write_text(
            directory / "config.json",
            json.dumps({**config, "dtype": dtype}, indent=2, sort_keys=True) + "\n",
        )
        for name, text in (files or {}).items():
            write_text(directory / name, text)
        manifest = write_manifest(directory)
        for name, entry in manifest["checksums"].items() if sums is not None else ():
            sums[f"{directory.name}/{name}"] = entry["value"]


def _fail(stage: str, final: Path, error: BaseException | None, dist: Dist) -> CheckpointError:
    reason = f"{type(error).__name__}: {error}" if error else "another rank failed"
    return CheckpointError(
        f"could not write {final} ({stage}, rank {dist.rank}: {reason}); the directory was not "
        "created and earlier checkpoints are intact"
    )


def export_hf(
    policy,
    tokenizer,
    out_dir: str | Path,
    dist: Dist = ONE_PROCESS,
    dtype: str = "float32",
    files: dict[str, str] | None = None,
) -> Path:
    """config.json, safetensors weights (in `dtype`), generation config and tokenizer files of
    `policy.lm` (sharded or not): loadable as they are by
    `transformers.AutoModelForCausalLM.from_pretrained` (and by vLLM); plus `files` (name -> text,
    e.g. the model card README.md), all published at once. Collective."""
    out = Path(out_dir)
    tmp = _temporary(out, dist, "export")
    _write_stages(
        [
            ("HF export", lambda: _write_hf(policy, tokenizer, tmp, dist, dtype, files)),
            ("rename", lambda: _publish(tmp, out, dist)),
        ],
        tmp,
        out,
        dist,
    )
    return out


def _write_stages(
    stages: list[tuple[str, Callable[[], None]]], tmp: Path, final: Path, dist: Dist
) -> None:
    """Run each stage on every rank; after each one the ranks agree it succeeded on all of them,
    else the temporary directory goes and every rank raises (none is left waiting in the next
    collective)."""
    for stage, write in stages:
        error = None
        try:
            write()
        except WRITE_ERRORS as e:
            error = e
        if not agree(error is None, dist):
            if dist.is_main:
                shutil.rmtree(tmp, ignore_errors=True)
            raise _fail(stage, final, error, dist)


def save_checkpoint(
    run_dir: str | Path,
    step: int,
    policy,
    optimizer,
    tokenizer,
    files: dict[str, str],
    dist: Dist = ONE_PROCESS,
    keep_state: int = 0,
    export_dtype: str = "float32",
) -> Path:
    """`checkpoints/step-N/`: HF export (in `export_dtype`), model + optimiser shards (float32
    master weights), every rank's RNG state and the given text files (resolved config, trainer
    state, scores, ...), assembled in a temporary directory and renamed into place. Collective. A
    write error on any rank raises CheckpointError on every rank and leaves no `step-N`."""
    final = Path(run_dir) / "checkpoints" / f"step-{step}"
    tmp = _temporary(final, dist, "save")
    sums: Checksums = {}  # this rank's files, hashed as they are written
    stages: list[tuple[str, Callable[[], None]]] = [
        ("directory", lambda: _make_dir(tmp, dist)),  # the ranks' agreement after it is the barrier
        (
            "HF export",
            lambda: _write_hf(policy, tokenizer, tmp / "hf", dist, export_dtype, sums=sums),
        ),
        ("model and optimiser state", lambda: _save_state(policy, optimizer, tmp, sums)),
        ("RNG state", lambda: _save_rng(tmp, dist, sums)),
        ("trainer files", lambda: _write_files(tmp, files, dist, sums)),
        ("manifest", lambda: _publish(tmp, final, dist, sums)),
    ]
    _write_stages(stages, tmp, final, dist)
    if dist.is_main:
        prune_states(final.parent, keep_state)
    return final


@contextlib.contextmanager
def _one_process_is_intended():
    """DCP warns on every save/load without a process group; psyrl's one-process mode means exactly
    that."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore", message="torch.distributed is disabled, unavailable or uninitialized"
        )
        yield


class _HashingStream(io.RawIOBase):
    """A file DCP writes, hashed on the way: DCP only appends (`_write_item` writes each item at
    `tell()`, torch.save into it streams its zip records in order: torch/distributed/checkpoint/
    filesystem.py:320-355, :422-476), so the running checksum is the file's."""

    def __init__(self, f, digest):
        self.f, self.digest = f, digest

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self.digest.update(data)
        return self.f.write(data)

    def tell(self) -> int:
        return self.f.tell()

    def fileno(self) -> int:  # DCP fsyncs it (filesystem.py:470-473)
        return self.f.fileno()

    def flush(self) -> None:
        self.f.flush()

    def close(self) -> None:
        super().close()  # flushes first (io.IOBase.close)
        self.f.close()


class _HashingFileSystem(FileSystem):
    """DCP's local filesystem, with every file it writes hashed while written into `sums` (keyed
    by the path relative to `root`), renames followed (`.metadata` is written as `.metadata.tmp`,
    then renamed: filesystem.py:758-790)."""

    def __init__(self, root: Path, sums: Checksums):
        super().__init__()
        self.root, self.sums = root, sums

    def _name(self, path) -> str:
        return str(Path(path).relative_to(self.root))

    @contextlib.contextmanager
    def create_stream(self, path, mode: str) -> Iterator[io.IOBase]:
        if "w" not in mode:
            with super().create_stream(path, mode) as stream:
                yield stream
            return
        digest = new_checksum()
        with super().create_stream(path, mode) as stream:
            yield _HashingStream(stream, digest)
        self.sums[self._name(path)] = digest.hexdigest()

    def rename(self, path, new_path) -> None:
        super().rename(path, new_path)
        self.sums[self._name(new_path)] = self.sums.pop(self._name(path))


def _save_state(policy, optimizer, checkpoint: Path, sums: Checksums) -> None:
    """`checkpoint/state/`: tensors only: the optimiser's per-parameter state (step, moments), not
    its param_groups (hyper-parameters, rebuilt from the config), so DCP stores no pickled Python
    object besides its own index (`.metadata`); each file hashed into `sums` as it is written."""
    model_state, optim_state = get_state_dict(policy, optimizer)
    writer = dcp.FileSystemWriter(checkpoint / "state")
    writer.fs = _HashingFileSystem(checkpoint, sums)
    with _one_process_is_intended():
        dcp.save(
            {"model": model_state, "optim": optim_state["state"]},
            storage_writer=writer,
            no_dist=not tdist.is_initialized(),
        )


def _make_dir(tmp: Path, dist: Dist) -> None:
    if dist.is_main:
        tmp.mkdir(parents=True)


def _publish(tmp: Path, final: Path, dist: Dist, sums: Checksums | None = None) -> None:
    """Collective: every rank's checksums to rank 0, which writes the manifest last (an HF export
    has its own already), then renames: only now does `step-N` exist, complete."""
    gathered = all_gather_lists(
        [(dist.rank, name, value) for name, value in (sums or {}).items()], dist
    )
    if dist.is_main:
        # on disk before it is published: a power cut leaves no complete-looking empty file
        sync_tree(tmp)
        if sums is not None:
            write_manifest(tmp, checksums={name: (rank, value) for rank, name, value in gathered})
        replace_dir(tmp, final)


def _save_rng(directory: Path, dist: Dist, sums: Checksums) -> None:
    state = {"cpu": torch.get_rng_state()}
    if dist.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(dist.device)
    (directory / "rng").mkdir(exist_ok=True)
    name = f"rng/rank-{dist.rank}.safetensors"
    sums[name] = write_hashed(directory / name, save(state))


def _write_files(directory: Path, files: dict[str, str], dist: Dist, sums: Checksums) -> None:
    if dist.is_main:
        for name, text in files.items():
            sums[name] = write_hashed(directory / name, text.encode("utf-8"))


def verify_files(directory: str | Path, dist: Dist = ONE_PROCESS) -> str | None:
    """Collective: every rank recomputes the checksums of the checkpoint's files it wrote (those of
    rank r go to rank r % world when the rank count changed), and all learn the first problem any
    rank found (None: every file is as written, or the manifest predates checksums)."""
    try:
        sums = read_manifest(directory).get("checksums", {})
        mine = [n for n, entry in sorted(sums.items()) if entry["rank"] % dist.world == dist.rank]
        problem = verify_checksums(directory, mine)
    except DamagedCheckpoint as e:  # this rank's read of the manifest: still a collective below
        problem = str(e)
    problems = all_gather_lists([problem] if problem else [], dist)
    return problems[0] if problems else None


def load_checkpoint(
    directory: str | Path,
    policy,
    optimizer,
    dist: Dist = ONE_PROCESS,
    warn: Callable[[str], None] = print,
) -> None:
    """Restore model and optimiser shards (resharded by DCP if the rank count changed) and this
    rank's RNG states from a checkpoint `save_checkpoint` wrote. Collective."""
    directory = Path(directory)
    model_state, optim_state = get_state_dict(policy, optimizer)
    state = {"model": model_state, "optim": optim_state["state"]}
    with _one_process_is_intended():
        dcp.load(state, checkpoint_id=str(directory / "state"), no_dist=not tdist.is_initialized())
    set_state_dict(
        policy,
        optimizer,
        model_state_dict=state["model"],
        optim_state_dict={"state": state["optim"], "param_groups": optim_state["param_groups"]},
    )
    rng_file = directory / "rng" / f"rank-{dist.rank}.safetensors"
    if not rng_file.is_file():
        warn(
            f"warning: {directory} has no RNG state for rank {dist.rank} (written with another "
            "rank count); random streams restart from the seed"
        )
        return
    rng = load_file(str(rng_file))
    torch.set_rng_state(rng["cpu"])
    if dist.device.type == "cuda" and "cuda" in rng:
        torch.cuda.set_rng_state(rng["cuda"], dist.device)
