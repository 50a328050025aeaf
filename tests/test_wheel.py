"""The wheel holds the package, all of it and only it: every file git tracks under psyrl/ (the
modules, the presets, the benchmarks and their licences, the tokenizers, the report's CSS and JS)
is in it, so a preset or a command that reads a package file finds it after `pip install psyrl`.
`make test-wheel` installs it and runs the first commands (tests/wheel/smoke.sh)."""

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def source_files() -> list[str]:
    """What a fresh clone holds, with this checkout's uncommitted changes: tracked files and new
    ones git does not ignore (no stale build/ from an earlier build)."""
    git = ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"]
    listed = subprocess.run(git, cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return sorted(p for p in listed.split("\0") if p and (ROOT / p).exists())


@pytest.mark.slow
def test_the_wheel_holds_every_package_file_and_nothing_else(tmp_path):
    files = source_files()
    clone = tmp_path / "clone"
    for p in files:
        (clone / p).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / p, clone / p, follow_symlinks=False)
    build = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps"]
    if importlib.util.find_spec("setuptools"):  # this environment's: no download
        build.append("--no-build-isolation")
    result = subprocess.run(
        [*build, "-w", str(tmp_path), str(clone)], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-3000:]
    (wheel,) = tmp_path.glob("psyrl-*.whl")
    package = {p for p in files if p.startswith("psyrl/")}
    assert any(p.startswith("psyrl/assets/configs/tgrpo/") for p in package)  # the presets
    assert any(p.startswith("psyrl/assets/benchmarks/") for p in package)  # the benchmarks
    with zipfile.ZipFile(wheel) as z:
        shipped = {p for p in z.namelist() if not p.startswith("psyrl-")}  # not the .dist-info
    assert sorted(package - shipped) == []
    assert sorted(shipped - package) == []  # nothing of the checkout beside the package
