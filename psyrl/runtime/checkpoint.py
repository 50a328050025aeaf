"""What a run leaves on disk: Hugging Face exports, resumable checkpoints, and the appendix-B
checkpoint choice.

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
import statistics
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
from psyrl.core.errors import PsyrlError
from psyrl.runtime.distributed import DTYPES, ONE_PROCESS, Dist, agree, gather_to_rank0

CHECKPOINT_GLOB = "step-*"
MANIFEST = "manifest.json"
STATE_PARTS = ("state", "rng")  # what `keep_state` prunes from older checkpoints
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


def _manifest(directory: Path) -> dict[str, int]:
    return {
        str(p.relative_to(directory)): p.stat().st_size
        for p in sorted(directory.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def verify(directory: str | Path) -> str | None:
    """None if `directory` is a complete checkpoint, else what is wrong with it (missing manifest or
    file, wrong size)."""
    directory = Path(directory)
    try:
        manifest = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        return f"no readable {MANIFEST} ({type(e).__name__})"
    for name, size in manifest["files"].items():
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if path.stat().st_size != size:
            return f"{name} has {path.stat().st_size} bytes, {size} expected"
    return None


def write_manifest(directory: Path, manifest: dict | None = None) -> None:
    """Atomically (temporary file, then rename) write `manifest`, by default the sizes of every file
    now there."""
    if manifest is None:
        manifest = {"files": _manifest(directory), "resumable": (directory / "state").is_dir()}
    write_text(directory / MANIFEST, json_text(manifest))


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
    return json.loads((directory / MANIFEST).read_text(encoding="utf-8")).get("resumable", False)


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
            manifest = json.loads((d / MANIFEST).read_text(encoding="utf-8"))
            manifest["files"] = {
                k: v for k, v in manifest["files"].items() if k.split("/")[0] not in STATE_PARTS
            }
            write_manifest(d, {**manifest, "resumable": False})
        except (OSError, ValueError, KeyError):
            continue
        for part in STATE_PARTS:
            shutil.rmtree(d / part, ignore_errors=True)


def find_resumable(run_dir: str | Path, warn: Callable[[str], None]) -> Path | None:
    """The newest complete checkpoint holding a training state; incomplete ones are reported through
    `warn` and skipped (the previous one is used)."""
    for _, d in reversed(checkpoint_dirs(run_dir)):
        problem = verify(d)
        if problem:
            warn(f"warning: skipping {d}: incomplete checkpoint ({problem})")
        elif _resumable(d):
            return d
    return None


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
            found.append((step, json.loads(scores.read_text())[metric], d))
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
