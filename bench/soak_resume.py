"""The kill-anywhere soak: SIGKILL a training run's whole process group at random moments, resume
after each kill, and compare the end with the same run never killed.

    .venv/bin/python bench/soak_resume.py --kills 30                  # T-GRPO, 2 torchrun ranks
    .venv/bin/python bench/soak_resume.py --trainer sft --kills 10

First a small start model is taught the answer format (as tests/test_train_tgrpo.py's fixture does),
then the reference run goes through uninterrupted. The soaked run is launched again and again; each
launch is killed (SIGKILL to torchrun and both workers at once, as a node failure would) at a moment
aimed at a step drawn uniformly over the whole run (the N draws sorted, one per launch), of one of
five kinds taken in turn:
  - time: a random moment inside that step, timed from the reference run's start-up and steps;
  - checkpoint: while the first checkpoint at or after that step is being written (its
    `.step-N.tmp-*` directory exists), after a random 0-300 ms;
  - metrics: inside that step's metrics.jsonl append: the worker writes a random part of the row's
    line, flushes it and kills the whole job (a torn last line, as a crash mid-write leaves);
  - corrupt: as `time`, then silent corruption of the newest resumable checkpoint: 1-8 random bits
    flipped in its files (a file drawn with probability proportional to its size, the sizes kept),
    as bit rot or a bad copy would leave it. The next launch must skip that checkpoint, naming the
    file ("damaged checkpoint"); one that resumes from it is a silent load;
  - manifest: as `time`, then an edit of the newest resumable checkpoint's manifest.json alone, one
    of: a bit flipped in a file and that file's checksum entry dropped, or rewritten to the new
    bytes' checksum, or the manifest cut back to the sizes-only form of before checksums; or the
    manifest replaced by garbage. Detected and silent as for `corrupt`.
After each kill the run is resumed with --resume auto (a checkpoint: continue from it; none yet:
start over). When the damaged checkpoint was the only one, --resume auto refuses (deleting
nothing): the soak then removes the checkpoints, as a person would, and launches again (a start
over). After the N kills the last launch runs to the end. Then: the final
weights, the final checkpoint's optimiser state (every tensor), trajectory cache and trainer state
(data cursor, step), and every metrics.jsonl row without its timings must equal the reference's.
Results are in docs/measurements.md.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TIME_KEYS = ("time/", "perf/")
# the worker: the trainer, with metrics.jsonl appends that tear and kill when SOAK_TEAR = N
WORKER = """
import json, os, random, signal, sys
from psyrl.core import runlog
sys.path.insert(0, os.environ["SOAK_BENCH"])
from soak_resume import descendants
tear = int(os.environ.get("SOAK_TEAR", "0"))
write, count = runlog.MetricsFile.write, [0]

def torn_write(self, row):
    count[0] += 1
    if count[0] != tear:
        return write(self, row)
    line = (json.dumps(row) + "\\n").encode()
    self._f.flush()
    with open(self.path, "ab") as f:  # part of the row's line, on disk, then the whole job dies
        f.write(line[:random.randrange(1, len(line))])
        f.flush()
        os.fsync(f.fileno())
    # torchrun runs each worker in a session of its own: the agent and every worker, by pid
    root = os.getppid() if "RANK" in os.environ else os.getpid()
    for pid in [*descendants(root), root]:
        if pid != os.getpid():
            os.kill(pid, signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)

runlog.MetricsFile.write = torn_write
trainer = sys.argv.pop(1)
if trainer == "tgrpo":
    from psyrl.cli.train import train_tgrpo as command
else:
    from psyrl.cli.train import train_sft as command
command(prog_name=trainer)
"""


def settings(trainer: str, work: Path, name: str, steps: int) -> list[str]:
    common = [
        f"run.output_dir={json.dumps(str(work))}",
        f"run.name={name}",
        f"run.steps={steps}",
        'data.valid_file=""',
        "log.progress=false",
        "checkpoint.keep_state=2",
    ]
    if trainer == "sft":
        return common + ["checkpoint.every=5", "optim.global_batch=8", "optim.micro_batch=4"]
    return common + [
        f"model.path={work / 'start' / 'hf'}",
        f"data.train_file={work / 'train.jsonl'}",
        "checkpoint.every=2",
        "rollout.prompts=8",
        "rollout.samples=4",
        "optim.global_batch=4",
        "rollout.max_new_tokens=24",
        "sampler.batch=4",
        "optim.micro_batch=4",
        "optim.logprob_micro_batch=4",
        "optim.lr=1e-4",
        "advantage.scope=cache",
        "rollout.temperature=1.0",
        "log.samples_every=0",
    ]


def command(trainer: str, ranks: int, sets: list[str], extra: list[str]) -> list[str]:
    launcher = [sys.executable]
    if ranks > 1:
        launcher += ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(ranks)]
    config = f"configs/{trainer}/tiny.toml"
    return [
        *launcher,
        str(WORKER_PATH),
        trainer,
        "--config",
        config,
        *[a for s in sets for a in ("--set", s)],
        *extra,
    ]


def environment(tear: int = 0) -> dict[str, str]:
    return {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "SOAK_TEAR": str(tear),
        "SOAK_BENCH": str(ROOT / "bench"),
        # the worker lives in --work: psyrl from this checkout, not wherever it is installed
        "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p),
    }


def launch(args: list[str], log: Path, tear: int = 0) -> subprocess.Popen:
    """torchrun and its workers in a process group of their own, output to `log`."""
    with log.open("w") as out:
        return subprocess.Popen(
            args,
            cwd=ROOT,
            env=environment(tear),
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def descendants(root: int) -> list[int]:
    """Every process below `root`, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def kill(process: subprocess.Popen) -> None:
    """SIGKILL to torchrun and every worker at once (torchrun gives each worker a session of its
    own: a process-group kill would miss them)."""
    for pid in [*descendants(process.pid), process.pid]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # already gone
    process.wait()


def start_model(work: Path) -> None:
    """A 2-layer model that knows `<think>…</think><answer>yes|no</answer>` (tests' `start`)."""
    rows = [json.loads(line) for line in (ROOT / "data/demo/train.jsonl").read_text().splitlines()]
    with (work / "train.jsonl").open("w") as f:
        for i, r in enumerate(rows[:64]):
            f.write(
                json.dumps({**r, "answer": "yes" if i % 2 else "no", "reasoning": "it is so"})
                + "\n"
            )
    sets = [
        f"run.output_dir={json.dumps(str(work))}",
        "run.name=start",
        f"data.train_file={work / 'train.jsonl'}",
        'data.valid_file=""',
        "run.steps=80",
        "model.hidden_size=64",
        "model.num_layers=2",
        "model.intermediate_size=128",
        "optim.lr=5e-3",
        "checkpoint.every=0",
        "log.progress=false",
    ]
    done = subprocess.run(
        command("sft", 1, sets, []), cwd=ROOT, env=environment(), capture_output=True, text=True
    )
    if done.returncode:
        sys.exit(done.stdout + done.stderr)


def resumable_step(run: Path) -> int:
    """The step --resume would continue after, 0 when there is no checkpoint to resume."""
    from psyrl.core.checkpoints import find_resumable

    found = find_resumable(run, lambda line: None) if run.exists() else None
    return int(found.name.split("-")[1]) if found else 0


def corrupt(run: Path, rng: random.Random) -> tuple[int, str] | None:
    """Flip 1-8 random bits in the newest resumable checkpoint's files, sizes kept; (its step, the
    files flipped), or None without a checkpoint."""
    from psyrl.core.checkpoints import find_resumable, read_manifest

    found = find_resumable(run, lambda line: None) if run.exists() else None
    if found is None:
        return None
    sizes = {name: size for name, size in read_manifest(found)["files"].items() if size}
    names = list(sizes)
    flipped = set()
    for _ in range(rng.randint(1, 8)):
        name = rng.choices(names, weights=[sizes[n] for n in names])[0]
        flip_bit(found / name, sizes[name], rng)
        flipped.add(name)
    return int(found.name.split("-")[1]), ", ".join(sorted(flipped))


def flip_bit(path: Path, size: int, rng: random.Random) -> None:
    """One random bit of `path` (of `size` bytes) flipped in place."""
    with open(path, "r+b") as f:
        offset = rng.randrange(size)
        f.seek(offset)
        byte = f.read(1)[0]
        f.seek(offset)
        f.write(bytes([byte ^ (1 << rng.randrange(8))]))


EDITS = ("dropped", "rewritten", "sizes only", "garbage")


def edit_manifest(run: Path, rng: random.Random) -> tuple[int, str] | None:
    """One of EDITS to the newest resumable checkpoint's manifest.json (nothing else rewritten but
    the flipped file); (its step, what was done), or None without a checkpoint."""
    from psyrl.core.checkpoints import MANIFEST, file_checksum, find_resumable, read_manifest

    found = find_resumable(run, lambda line: None) if run.exists() else None
    if found is None:
        return None
    manifest, how = read_manifest(found), rng.choice(EDITS)
    sizes = {name: size for name, size in manifest["files"].items() if size}
    name = rng.choices(list(sizes), weights=list(sizes.values()))[0]
    if how != "garbage":
        flip_bit(found / name, sizes[name], rng)
    if how == "dropped":
        del manifest["checksums"][name]
    elif how == "rewritten":
        manifest["checksums"][name]["value"] = file_checksum(found / name)
    elif how == "sizes only":
        manifest = {"files": manifest["files"], "resumable": manifest["resumable"]}
    text = "{garbage" if how == "garbage" else json.dumps(manifest, indent=2)
    (found / MANIFEST).write_text(text)
    return int(found.name.split("-")[1]), f"{how} ({name})" if how != "garbage" else how


def checkpoint_in_write(run: Path) -> int:
    """The step of a checkpoint being written now (its temporary directory exists), or 0."""
    steps = [
        int(d.name.split(".")[1].split("-")[1]) for d in (run / "checkpoints").glob(".step-*.tmp-*")
    ]
    return max(steps, default=0)


def compare(reference: Path, soaked: Path, last: int) -> list[str]:
    """What differs between the two runs' ends (empty: nothing)."""
    import torch
    from safetensors.torch import load_file
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from psyrl.core.runlog import read_metrics

    differences = []
    a, b = (load_file(r / "hf" / "model.safetensors") for r in (reference, soaked))
    differences += [f"weight {k}" for k in a if not torch.equal(a[k], b.get(k, torch.empty(0)))]
    states = []
    for r in (reference, soaked):
        out = r.parent / f"{r.name}-state.pt"
        dcp_to_torch_save(r / "checkpoints" / f"step-{last}" / "state", out)
        states.append(torch.load(out, weights_only=False))

    def flat(tree, prefix=""):
        if isinstance(tree, dict):
            for k, v in tree.items():
                yield from flat(v, f"{prefix}{k}/")
        else:
            yield prefix, tree

    sa, sb = dict(flat(states[0])), dict(flat(states[1]))
    if sa.keys() != sb.keys():
        differences.append("optimiser/model state keys")
    differences += [
        f"state {k}"
        for k in sa
        if k in sb
        and not (torch.equal(sa[k], sb[k]) if isinstance(sa[k], torch.Tensor) else sa[k] == sb[k])
    ]
    for name in ("trajectory_cache.json", "trainer.json"):
        files = [r / "checkpoints" / f"step-{last}" / name for r in (reference, soaked)]
        if files[0].exists() and files[0].read_text() != files[1].read_text():
            differences.append(name)
    rows = [
        [
            {k: v for k, v in row.items() if not k.startswith(TIME_KEYS)}
            for row in read_metrics(r / "metrics.jsonl")
        ]
        for r in (reference, soaked)
    ]
    if rows[0] != rows[1]:
        differences.append(f"metrics rows ({len(rows[0])} vs {len(rows[1])})")
    return differences


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trainer", choices=["tgrpo", "sft"], default="tgrpo")
    parser.add_argument("--kills", type=int, default=30)
    parser.add_argument(
        "--steps", type=int, default=None, help="steps of the run (default: 80 T-GRPO, 150 SFT)"
    )
    parser.add_argument("--ranks", type=int, default=2, help="torchrun ranks (1: one process)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the kill schedule")
    parser.add_argument("--work", type=Path, default=Path("/tmp/psyrl-soak"))
    args = parser.parse_args()
    global WORKER_PATH
    shutil.rmtree(args.work, ignore_errors=True)
    (args.work / "logs").mkdir(parents=True)
    WORKER_PATH = args.work / "worker.py"
    WORKER_PATH.write_text(WORKER)
    steps = args.steps or (80 if args.trainer == "tgrpo" else 150)
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    if args.trainer == "tgrpo":
        start_model(args.work)

    # ------------------------------------------------------------------ the reference run
    reference = args.work / "reference"
    log = args.work / "logs" / "reference.log"
    began = time.perf_counter()
    process = launch(
        command(
            args.trainer, args.ranks, settings(args.trainer, args.work, "reference", steps), []
        ),
        log,
    )
    first_row = None
    while process.poll() is None:
        if first_row is None and (reference / "metrics.jsonl").exists():
            first_row = time.perf_counter() - began
        time.sleep(0.02)
    if process.returncode or first_row is None:
        sys.exit(f"the reference run failed:\n{log.read_text()[-3000:]}")
    total = time.perf_counter() - began
    step_s = (total - first_row) / steps
    print(
        f"reference: {steps} steps in {total:.1f} s (first row after {first_row:.1f} s)", flush=True
    )

    # ------------------------------------------------------------ the soaked run: kill, resume
    soaked = args.work / "soaked"
    sets = settings(args.trainer, args.work, "soaked", steps)
    kinds = {kind: 0 for kind in KINDS}
    corrupted = None  # (step, files) flipped after the last kill
    detected = silent = flips = 0
    # the moments, spread over the whole run: the step each kill aims at, in order
    targets = sorted(rng.randrange(1, steps + 1) for _ in range(args.kills))
    kills = launches = cut = refused = 0
    while True:
        done = resumable_step(soaked)
        extra = ["--resume", "auto"]
        kind = KINDS[kills % len(KINDS)] if kills < args.kills else None
        target = max(targets[kills], done + 1) if kind else 0
        # time: somewhere inside the target step; metrics: that step's row; checkpoint: the first
        # checkpoint write at or after it
        deadline = first_row + (target - done - 1 + rng.random()) * step_s
        tear = target - done if kind == "metrics" else 0
        launches += 1
        log = args.work / "logs" / f"launch-{launches}.log"
        process = launch(command(args.trainer, args.ranks, sets, extra), log, tear)
        began, killed = time.perf_counter(), False
        while process.poll() is None:
            if kind in ("time", "corrupt", "manifest") and time.perf_counter() - began >= deadline:
                kill(process)
                killed = True
            elif kind == "checkpoint" and checkpoint_in_write(soaked) >= target:
                time.sleep(rng.uniform(0, 0.3))
                kill(process)
                killed = True
                # the write was cut (its temporary directory is left), or had just ended
                cut += checkpoint_in_write(soaked) >= target
            time.sleep(0.005)
        killed = killed or (kind == "metrics" and process.returncode == -signal.SIGKILL)
        if corrupted:  # did this launch find the flipped bits, or load them?
            said, step = log.read_text(), corrupted[0]
            found = f"step-{step}: damaged checkpoint" in said
            loaded = f"resuming after step {step} " in said
            detected, silent = detected + found, silent + loaded
            if found or loaded:  # else killed before it looked: the next launch will
                corrupted = None
        if killed and kind in ("corrupt", "manifest") and not corrupted:
            corrupted = (corrupt if kind == "corrupt" else edit_manifest)(soaked, rng)
            flips += corrupted is not None
            if corrupted:
                print(f"corrupted step-{corrupted[0]}: {corrupted[1]}", flush=True)
        if killed:
            kills += 1
            kinds[kind] += 1
            print(
                f"kill {kills} ({kind}, aimed at step {target}): resumable after step "
                f"{resumable_step(soaked)}",
                flush=True,
            )
            continue
        if process.returncode and "passes its checks, and nothing was deleted" in log.read_text():
            # every checkpoint damaged: --resume auto refused; removed by hand, the run starts over
            refused += 1
            print(
                f"launch {launches}: refused, no checkpoint passes; checkpoints removed", flush=True
            )
            shutil.rmtree(soaked / "checkpoints")
            continue
        if process.returncode:
            sys.exit(
                f"launch {launches} failed (status {process.returncode}):\n"
                f"{log.read_text()[-3000:]}"
            )
        if kind is not None:  # the run ended before this launch's moment came
            print(f"launch {launches}: the run finished before its {kind} kill", flush=True)
        break

    differences = compare(reference, soaked, steps)
    print(
        f"{args.trainer}: {kills} kills ({kinds['time']} at random times, "
        f"{kinds['checkpoint']} while a checkpoint was written ({cut} cut it short, the "
        f"others came after its rename), {kinds['metrics']} inside "
        f"metrics.jsonl appends, {kinds['corrupt']} at random times followed by flipped bits "
        f"in the newest checkpoint and {kinds['manifest']} followed by an edit of its manifest "
        f"({flips} had a checkpoint to damage): {detected} detected, {silent} silent loads, "
        f"{refused} refusals to resume with every checkpoint damaged), {launches - 1} resumes, "
        f"{len(differences)} differences"
        f"{': ' + ', '.join(differences[:10]) if differences else ''}; "
        f"{time.perf_counter() - t0:.0f} s in all (work: {args.work})",
        flush=True,
    )
    sys.exit(1 if differences or silent else 0)


WORKER_PATH = Path()
KINDS = ("time", "checkpoint", "metrics", "corrupt", "manifest")

if __name__ == "__main__":
    main()
