"""The package's import graph, read from the source (every `import` statement, those inside
functions included): imports only go down the stack, click is imported by the command-line package
only, and no chain of imports comes back to where it started. The checker is tested on planted
trees too, so a pass means something."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

import psyrl

# The stack, bottom first: a package may import its own modules and packages on a lower level.
LEVELS = {
    "core": 0,  # config, records, text and F1, prompts, errors: no model code
    "runtime": 1,  # model, torchrun/FSDP2, checkpoints, samplers
    "rl": 2,  # the paper's RL: T-GRPO, rewards, trajectory cache, scoring, update
    "sft": 2,  # SFT examples and loss
    "eval": 2,  # evaluation without a model: benchmarks, scoring, reports
    "plan": 2,  # `psyrl plan`: plans, never runs
    "run": 3,  # what both trainers share: the Run, validation, trackers, sample files, launch
    "dataset": 3,  # the StimuliQA builder, data conversion, the demo set
    "signals": 3,  # accuracy signals beyond the paper's F1: encoder, LLM judge, audit, a run's set
    "report": 4,  # reading runs: plot, summary, HTML report
    "experiment": 4,  # experiment files
    "recipes": 5,  # the loops: SFT, T-GRPO, evaluation
    "cli": 6,  # the command line
}
CLI = "cli"


def modules(root: Path) -> dict[str, Path]:
    """Dotted module name -> file, for every .py file under the package directory `root`."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = [root.name, *path.relative_to(root).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: dict[str, Path]) -> list[tuple[int, str]]:
    """(line, module) of every import in the file: `from a.b import c` is a.b.c when that is a
    module of the package, else a.b."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this module's package
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                child = f"{base}.{alias.name}"
                out.append((node.lineno, child if child in known else base))
    return out


def violations(root: Path) -> list[str]:
    """What breaks the rules in the package at `root`, one line each (`file:line: problem`)."""
    known = modules(root)
    top = root.name
    problems, edges = [], {}
    for name, path in known.items():
        parts = name.split(".")
        mine = parts[1] if len(parts) > 1 and parts[1] in LEVELS else None
        edges[name] = set()
        for line, target in imported(name, path, known):
            where = f"{path}:{line}"
            if target.split(".")[0] == "click" and mine != CLI:
                problems.append(f"{where}: click imported outside {top}/{CLI}/")
            if target != top and not target.startswith(top + "."):
                continue
            if target in known:
                edges[name].add(target)
            theirs = target.split(".")[1] if "." in target else None
            if theirs is None or theirs not in LEVELS or theirs == mine:
                continue  # the package's root (its version) or its own modules
            if mine is None:
                if parts[-1] != "__main__":  # `python -m psyrl` starts the command line
                    problems.append(f"{where}: {name} imports {target}")
            elif LEVELS[theirs] >= LEVELS[mine]:
                problems.append(
                    f"{where}: {mine}/ (level {LEVELS[mine]}) imports {target} "
                    f"({theirs}/, level {LEVELS[theirs]}): imports go down the stack"
                )
    problems += [f"import cycle: {' -> '.join(cycle)}" for cycle in cycles(edges)]
    return problems


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (depth-first search)."""
    found, state, stack = [], {}, []

    def visit(node: str) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                found.append([*stack[stack.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        stack.pop()
        state[node] = "done"

    for node in sorted(edges):
        if node not in state:
            visit(node)
    return found


def test_the_package_imports_only_go_down_and_click_stays_in_the_command_line():
    root = Path(psyrl.__file__).parent
    assert violations(root) == []
    assert set(LEVELS) == {
        p.name for p in root.iterdir() if p.is_dir() and (p / "__init__.py").exists()
    }, "a package of psyrl without a level (or a level without a package)"


def plant(tmp_path: Path, files: dict[str, str]) -> Path:
    root = tmp_path / "psyrl"
    for relative, source in files.items():
        path = root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    for folder in [root, *[p for p in root.rglob("*") if p.is_dir()]]:
        (folder / "__init__.py").touch()
    return root


def test_the_checker_finds_an_upward_import_even_inside_a_function(tmp_path):
    root = plant(
        tmp_path,
        {
            "core/config.py": """
                def load():
                    from psyrl.runtime import model  # lazy, and still upward
            """,
            "runtime/model.py": "from psyrl.core import config\n",
        },
    )
    problems = violations(root)
    assert len(problems) == 2, problems
    assert "core/config.py:3: core/ (level 0) imports psyrl.runtime.model" in problems[0]
    assert problems[1].startswith("import cycle: psyrl.core.config -> psyrl.runtime.model")


def test_the_checker_finds_click_outside_the_command_line_and_a_sideways_import(tmp_path):
    root = plant(
        tmp_path,
        {
            "run/directory.py": "import click\n",
            "dataset/build.py": "from psyrl.run.directory import x\n",
            "cli/main.py": "import click\nfrom psyrl.run import directory\n",
        },
    )
    problems = violations(root)
    assert len(problems) == 2, problems
    assert "dataset/build.py:1: dataset/ (level 3) imports psyrl.run.directory" in problems[0]
    assert "run/directory.py:1: click imported outside psyrl/cli/" in problems[1]


def test_the_checker_finds_a_cycle_inside_one_package(tmp_path):
    root = plant(
        tmp_path,
        {
            "cli/__init__.py": "from psyrl.cli.commands import x\n",
            "cli/commands.py": "def f():\n    from psyrl.cli import main\n",
        },
    )
    assert violations(root) == ["import cycle: psyrl.cli -> psyrl.cli.commands -> psyrl.cli"]


def test_core_and_what_reads_runs_import_no_torch():
    # core is shared ground without model code; psyrl report, summary, plot, select-checkpoint and
    # experiment read files only
    core = [name for name in modules(Path(psyrl.__file__).parent) if name.startswith("psyrl.core.")]
    readers = ", ".join(
        [
            *core,
            "psyrl.report.page",
            "psyrl.report.plot",
            "psyrl.report.summary",
            "psyrl.experiment.runner",
            "psyrl.experiment.tables",
        ]
    )
    code = (
        f"import sys, {readers}; print([m for m in ('torch', 'transformers') if m in sys.modules])"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"
