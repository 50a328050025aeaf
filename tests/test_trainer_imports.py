"""The trainer and the tools are two layers (STYLE.md 16): importing a trainer, in a fresh
interpreter, loads none of the tooling. A trainer may still call a tool lazily (the start-up memory
check imports the planner on a GPU only)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# what a trainer never loads at import: a package, or a module with its submodules
TOOLING = [
    "psyrl.plan",  # `psyrl plan`: the start-up check imports it when it runs
    "psyrl.experiment",  # experiment files and their runner
    "psyrl.report",  # plot, summary, the HTML report
    "psyrl.dataset",  # the StimuliQA builder, data conversion, the demo set
    "psyrl.eval.openai_engine",  # the API baselines' client
    "openai",
    "psyrl.cli",  # the command line, and click with it
    "click",
]


def tooling(loaded: list[str]) -> list[str]:
    """The modules of `loaded` that are tooling, sorted."""
    return sorted(
        name for name in loaded if any(name == t or name.startswith(t + ".") for t in TOOLING)
    )


def test_the_checker_names_tooling_modules_and_only_those():
    loaded = [
        "psyrl.plan",  # the package itself
        "psyrl.plan.planner",
        "psyrl.planning",  # not psyrl.plan: a prefix of a name is not the package
        "psyrl.eval.scoring",  # evaluation's scoring is not the API client
        "psyrl.eval.openai_engine",
        "openai._client",
        "clickhouse",
    ]
    assert tooling(loaded) == [
        "openai._client",
        "psyrl.eval.openai_engine",
        "psyrl.plan",
        "psyrl.plan.planner",
    ]


@pytest.mark.parametrize("trainer", ["psyrl.recipes.tgrpo", "psyrl.recipes.sft"])
def test_importing_a_trainer_loads_no_tooling(trainer):
    code = f"import json, sys, {trainer}; print(json.dumps(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    loaded = json.loads(out.stdout)
    assert trainer in loaded  # the probe saw the import it measures
    found = tooling(loaded)
    assert not found, f"importing {trainer} loads tooling: {', '.join(found)}"
