"""Writing and loading what a run leaves on disk: Hugging Face exports and resumable checkpoints
(reading which exist, which are complete and appendix B's choice: `psyrl.core.checkpoints`).

`checkpoints/step-N/` holds `hf/` (an HF export: config, safetensors, tokenizer, generation config),
`state/` (model and optimiser shards, `torch.distributed.checkpoint`), `rng/rank-R.safetensors`
(every rank's RNG states), the trainer's JSON files (step, data position, trajectory cache, ...) and
`manifest.json`, the size of every file. Everything is written under a temporary name and renamed
into place (`psyrl.core.atomic`), and the manifest is written last: a directory cut short (a crash,
a full disk, a copy that stopped) fails `verify` and is skipped with a warning. psyrl pickles
nothing and never calls `torch.load`; the state holds tensors only, and DCP's own index
`state/.metadata` (torch's format) is the one pickle on disk.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import warnings
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as tdist
import torch.distributed.checkpoint as dcp
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from psyrl.core.atomic import replace_dir, sync_tree, temporary, write_text
from psyrl.core.checkpoints import prune_states, write_manifest
from psyrl.core.errors import PsyrlError
from psyrl.runtime.distributed import DTYPES, ONE_PROCESS, Dist, agree, gather_to_rank0

# a full disk surfaces as any of these
WRITE_ERRORS = (OSError, SafetensorError, CheckpointException)


class CheckpointError(PsyrlError, RuntimeError):
    """A checkpoint could not be written (the previous ones are intact) or read."""


def _temporary(final: Path, dist: Dist, tag: str) -> Path:
    """The same temporary name on every rank (a pid-named one in one process); rank 0 clears a
    leftover."""
    tmp = temporary(final, tag if dist.sharded else None)
    if dist.is_main:
        shutil.rmtree(tmp, ignore_errors=True)
    return tmp


def _write_hf(policy, tokenizer, directory: Path, dist: Dist, dtype: str = "float32") -> None:
    """Collective: the shards go to rank 0 one tensor at a time (`gather_to_rank0`: the other ranks
    only send), which casts them to `dtype` and writes. config.json states that dtype (transformers
    would write the live model's)."""
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

    def write():
        _write_hf(policy, tokenizer, tmp, dist, dtype)
        for name, text in (files or {}).items() if dist.is_main else ():
            write_text(tmp / name, text)

    _write_stages(
        [("HF export", write), ("rename", lambda: _publish(tmp, out, dist, manifest=False))],
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
    stages: list[tuple[str, Callable[[], None]]] = [
        ("directory", lambda: _make_dir(tmp, dist)),  # the ranks' agreement after it is the barrier
        ("HF export", lambda: _write_hf(policy, tokenizer, tmp / "hf", dist, export_dtype)),
        ("model and optimiser state", lambda: _save_state(policy, optimizer, tmp / "state")),
        ("RNG state", lambda: _save_rng(tmp, dist)),
        ("trainer files", lambda: _write_files(tmp, files, dist)),
        ("manifest", lambda: _publish(tmp, final, dist)),
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


def _save_state(policy, optimizer, directory: Path) -> None:
    """Tensors only: the optimiser's per-parameter state (step, moments), not its param_groups
    (hyper-parameters, rebuilt from the config), so DCP stores no pickled Python object besides its
    own index (`.metadata`)."""
    model_state, optim_state = get_state_dict(policy, optimizer)
    with _one_process_is_intended():
        dcp.save(
            {"model": model_state, "optim": optim_state["state"]},
            checkpoint_id=str(directory),
            no_dist=not tdist.is_initialized(),
        )


def _make_dir(tmp: Path, dist: Dist) -> None:
    if dist.is_main:
        tmp.mkdir(parents=True)


def _publish(tmp: Path, final: Path, dist: Dist, manifest: bool = True) -> None:
    """Rank 0: the manifest last, then the rename: only now does `step-N` exist, complete."""
    if dist.is_main:
        # on disk before it is published: a power cut leaves no complete-looking empty file
        sync_tree(tmp)
        if manifest:
            write_manifest(tmp)
        replace_dir(tmp, final)


def _save_rng(directory: Path, dist: Dist) -> None:
    state = {"cpu": torch.get_rng_state()}
    if dist.device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(dist.device)
    (directory / "rng").mkdir(exist_ok=True)
    save_file(state, str(directory / "rng" / f"rank-{dist.rank}.safetensors"))


def _write_files(directory: Path, files: dict[str, str], dist: Dist) -> None:
    if dist.is_main:
        for name, text in files.items():
            (directory / name).write_text(text, encoding="utf-8")


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
