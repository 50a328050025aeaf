"""The reward plug-in (`reward.custom = "path/to/file.py:function"`): the user's accuracy function,
loaded from its file and each value it returns checked. `rewards.answer_components` puts its
scores in place of r_F1 (docs/config.md, examples/exact_match.py)."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Sequence
from pathlib import Path

import torch


def load_reward_plugin(spec: str) -> Callable:
    """The function of `reward.custom = "path/to/file.py:function"`, imported from that file (the
    user's own code, run as given); ValueError naming the plug-in when it cannot be."""
    path, _, name = spec.rpartition(":")
    if not Path(path).is_file():
        raise ValueError(f"reward.custom = {spec!r}: no file {path}")
    module_spec = importlib.util.spec_from_file_location(
        f"psyrl_reward_plugin_{Path(path).stem}", path
    )
    module = importlib.util.module_from_spec(module_spec)
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:  # the plug-in's own error, whatever it is: one message naming it
        raise ValueError(
            f"reward.custom = {spec!r}: importing {path} failed: {type(e).__name__}: {e}"
        ) from None
    function = getattr(module, name, None)
    if not callable(function):
        raise ValueError(f"reward.custom = {spec!r}: {path} defines no function {name!r}")
    return function


def plugin_scores(
    plugin: Callable,
    spec: str,
    responses: Sequence[str],
    golds: Sequence[str],
    records: Sequence | None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """(accuracy [N], {"custom/<name>": [N]}) from a reward plug-in, every value checked: one finite
    number per response, the accuracy in [0, 1]; ValueError naming the plug-in and the sample
    otherwise."""
    records = list(records) if records is not None else [None] * len(responses)
    try:
        out = plugin(list(responses), list(golds), records)
    except Exception as e:
        raise ValueError(f"reward.custom = {spec!r} raised {type(e).__name__}: {e}") from None
    scores, extras = out if isinstance(out, tuple) and len(out) == 2 else (out, {})
    if not isinstance(extras, dict):
        raise ValueError(
            f"reward.custom = {spec!r}: expected (scores, {{name: values}}), got a "
            f"{type(extras).__name__} beside the scores"
        )

    def values(what: str, given, low=-math.inf, high=math.inf) -> torch.Tensor:
        try:
            floats = [float(v) for v in given]
        except (TypeError, ValueError):
            raise ValueError(
                f"reward.custom = {spec!r}: {what}: expected one number per response, "
                f"got {type(given).__name__}"
            ) from None
        if len(floats) != len(responses):
            raise ValueError(
                f"reward.custom = {spec!r}: {what}: {len(floats)} values for "
                f"{len(responses)} responses"
            )
        for i, v in enumerate(floats):
            if not (math.isfinite(v) and low <= v <= high):
                item = f" (id {records[i].id})" if hasattr(records[i], "id") else ""
                bounds = f" in [{low:g}, {high:g}]" if math.isfinite(low) else " finite"
                raise ValueError(
                    f"reward.custom = {spec!r}: {what} of sample {i}{item} is {v}, "
                    f"expected a number{bounds}"
                )
        return torch.tensor(floats, dtype=torch.float64)

    return values("score", scores, 0.0, 1.0), {
        f"custom/{name}": values(f"component {name!r}", v) for name, v in extras.items()
    }
