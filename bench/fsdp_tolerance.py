"""How far FSDP2 (± CPU offload) is from one process under this CPU's kernels: the figures behind
tests/runtime/test_distributed.py's tolerances (docs/install.md, "What holds across machines").

Runs the test's three float32 SFT runs (6 steps, 2 gloo ranks for FSDP2), the first gradient
written by tests/workers/first_gradient.py, and prints per run: the first gradient's largest
relative difference per parameter, the losses' largest relative difference, and the weights'
largest element, RMS and count over 1e-5. Another kernel set stands in for another machine:

    ATEN_CPU_CAPABILITY=avx2 python bench/fsdp_tolerance.py --out /tmp/tol-avx2  # in the checkout
"""

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "runtime")]

from test_distributed import VALID, losses, sft, weights  # noqa: E402  (the test's own runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="run directory (kept; reused)")
    out = parser.parse_args().out
    runs = [("one", VALID, 1), ("fsdp", VALID, 2), ("offload", ["fsdp.offload=always"], 2)]
    for name, extra, ranks in runs:
        if not (out / name / "hf").exists():
            gradient = out / f"{name}-first-gradient.pt"
            result = sft(out, f"run.name={name}", *extra, ranks=ranks, gradient_to=gradient)
            if result.returncode:
                sys.exit(f"{name} failed:\n{result.stderr[-3000:]}")
    one, reference = losses(out / "one"), weights(out / "one")
    first = torch.load(out / "one-first-gradient.pt")
    print(f"kernels: {torch.backends.cpu.get_cpu_capability()}")
    for name in ("fsdp", "offload"):
        gradient = torch.load(out / f"{name}-first-gradient.pt")
        grad = max(((gradient[k] - first[k]).norm() / first[k].norm()).item() for k in first)
        loss = max(abs(a - b) / abs(b) for a, b in zip(losses(out / name), one))
        moved = weights(out / name)
        diff = torch.cat([(moved[k] - reference[k]).abs().flatten() for k in reference])
        print(
            f"{name}: first gradient {grad:.2e}, loss {loss:.2e}, weights max {diff.max():.3g} "
            f"rms {diff.pow(2).mean().sqrt():.3g}, {int((diff > 1e-5).sum())} of {diff.numel()} "
            "over 1e-5"
        )


if __name__ == "__main__":
    main()
