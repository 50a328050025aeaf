"""Worker for tests/runtime/test_distributed.py: `train_sft.py`'s command, run as it is (one process
or under torchrun), that also writes the gradient of its first optimiser step, before AdamW reads
it, to the file named by the first argument (rank 0: every parameter's full tensor, float64).

Why: after AdamW the weights cannot be compared element by element across kernels (a gradient
element near zero is divided by sqrt(v) + eps, so its last bits move the weight by up to ~lr); the
gradient itself can, at float32 summation-order tolerance.

    python tests/workers/first_gradient.py OUT.pt --config ... [--set ...]
"""

import os
import sys

import torch
from torch.distributed.tensor import DTensor

import psyrl.recipes.sft as sft
from psyrl.cli.train import train_sft


def main() -> None:
    out = sys.argv.pop(1)
    step = sft.clipped_step
    seen = []

    def first_step_written(model, optimizer, max_norm):
        if not seen:
            grads = {}
            for name, param in model.named_parameters():
                grad = param.grad.full_tensor() if isinstance(param.grad, DTensor) else param.grad
                grads[name] = grad.detach().double()
            if int(os.environ.get("RANK", "0")) == 0:
                torch.save(grads, out)
            seen.append(True)
        return step(model, optimizer, max_norm)

    sft.clipped_step = first_step_written  # the loop looks the name up in its module each step
    train_sft()  # the psyrl command: its loop is the patched module's


if __name__ == "__main__":
    main()
