"""The trajectory cache (paper §3.2 "Trajectory Cache", eq. 7; SPEC §3).

Keeps the per-sample records (r_F1, length L, final reward) of the last C steps, B_c = B x C prompt
groups, and serves their statistics in two phases per step:
  1. `push_answers(f1, lengths)` then `answer_stats()` -> (L-bar, r-bar_F1), current step included,
     for the length-dependent rewards;
  2. `push_rewards(final)` then `rewards()` -> every cached final reward, the pool of eq. 2's r-bar
     and sigma_r (`psyrl.rl.tgrpo.advantages`).
Older steps keep the final rewards they got at their own step; nothing is recomputed. Free of
torch.distributed: the trainer all-gathers records so every rank pushes the same ones.

`keep` (judge.on_failure = "mask"): a step's responses the judge did not score stay in the cache
(L-bar counts their lengths) but out of r-bar_F1 and of the rewards eq. 2 pools, so a judge score is
never compared with an F1 standing in for one.
"""

from __future__ import annotations

from collections import deque

import torch


class TrajectoryCache:
    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"trajectory cache size must be >= 1, got {size}")
        self.size = size
        self._steps: deque[dict[str, torch.Tensor | None]] = deque(maxlen=size)  # oldest first

    def __len__(self) -> int:
        """Number of steps held (at most `size`)."""
        return len(self._steps)

    def push_answers(self, f1, lengths, keep=None) -> None:
        """Phase 1: open a new step with its samples' r_F1 and lengths (the oldest drops out);
        `keep` [N] bool: False leaves a sample out of r-bar_F1 and `rewards()` (None: the paper)."""
        f1 = torch.as_tensor(f1, dtype=torch.float64).flatten()  # [N]
        lengths = torch.as_tensor(lengths, dtype=torch.float64).flatten()  # [N]
        if f1.numel() != lengths.numel() or f1.numel() == 0:
            raise ValueError(
                f"a step needs as many F1 values as lengths, at least one: {f1.numel()} vs "
                f"{lengths.numel()}"
            )
        if self._steps and self._steps[-1]["reward"] is None:
            raise RuntimeError("push_rewards was not called for the previous step")
        step = {"f1": f1, "length": lengths, "reward": None}
        if keep is not None:  # float64 0/1 like every other field: the checkpoint's JSON reads back
            step["keep"] = torch.as_tensor(keep, dtype=torch.float64).flatten()  # [N]
            if step["keep"].numel() != f1.numel():
                raise ValueError(f"{step['keep'].numel()} keep flags for {f1.numel()} samples")
        self._steps.append(step)

    def answer_stats(self) -> tuple[float, float]:
        """(L-bar, r-bar_F1) of eq. 7 over every cached sample, the current step's included."""
        if not self._steps:
            raise RuntimeError("the trajectory cache is empty: push_answers first")
        lengths = torch.cat([s["length"] for s in self._steps])  # [<= C*N]
        f1 = torch.cat([_kept(s, "f1") for s in self._steps])  # [<= C*N]
        return lengths.mean().item(), f1.mean().item() if f1.numel() else 0.0

    def push_rewards(self, final) -> None:
        """Phase 2: store the current step's final rewards (once; older steps keep theirs)."""
        if not self._steps or self._steps[-1]["reward"] is not None:
            raise RuntimeError("push_rewards must follow push_answers, once per step")
        final = torch.as_tensor(final, dtype=torch.float64).flatten()  # [N]
        if final.numel() != self._steps[-1]["f1"].numel():
            raise ValueError(
                f"{final.numel()} final rewards for a step of {self._steps[-1]['f1'].numel()} "
                "samples"
            )
        self._steps[-1]["reward"] = final

    def rewards(self) -> torch.Tensor:
        """Every cached final reward, oldest step first: the pool of eq. 2's mean and std."""
        if not self._steps or self._steps[-1]["reward"] is None:
            raise RuntimeError("rewards() needs push_rewards for the current step")
        return torch.cat([_kept(s, "reward") for s in self._steps])  # [<= C*N]

    def state_dict(self) -> dict:
        """JSON-serialisable state (floats round-trip exactly through JSON), for checkpoints."""
        steps = [
            {k: (None if v is None else v.tolist()) for k, v in s.items()} for s in self._steps
        ]
        return {"size": self.size, "steps": steps}

    def load_state_dict(self, state: dict) -> None:
        if state["size"] != self.size:
            raise ValueError(
                f"checkpoint cache size {state['size']} differs from the configured {self.size}"
            )
        self._steps.clear()
        for s in state["steps"]:
            self._steps.append(
                {
                    k: (None if v is None else torch.tensor(v, dtype=torch.float64))
                    for k, v in s.items()
                }
            )


def _kept(step: dict, key: str) -> torch.Tensor:
    """A step's values of `key` without the samples `keep` leaves out."""
    return step[key][step["keep"].bool()] if "keep" in step else step[key]
