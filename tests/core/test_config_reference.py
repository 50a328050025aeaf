"""tools/config_reference.py: docs/config.md's reference is the one generated from the config's
field docstrings, and the tool writes it between the markers."""

import dataclasses
import importlib.util
from pathlib import Path

import pytest

from psyrl.core.config import Config, SamplerConfig
from psyrl.core.tomlconf import table_classes

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location(
    "config_reference", ROOT / "tools" / "config_reference.py"
)
tool = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tool)


def test_docs_config_reference_is_generated_from_the_code():
    text = (ROOT / "docs" / "config.md").read_text(encoding="utf-8")
    assert tool.between_markers(text, tool.reference()) == text, "run `make docs` to regenerate it"


def test_field_docs_are_the_docstrings_under_the_fields_on_one_line():
    docs = tool.field_docs(SamplerConfig)
    assert docs["tensor_parallel"] == (
        "vllm: ranks that hold one engine together (consecutive ranks; A.3: 2 on 4 GPUs). Must "
        "divide the ranks."
    )


def test_every_key_has_a_docstring():
    for table, cls in table_classes(Config).items():
        documented = set(tool.field_docs(cls))
        missing = [f.name for f in dataclasses.fields(cls) if f.name not in documented]
        assert not missing, f"[{table}] keys without a docstring under them: {missing}"


def test_the_tool_writes_between_the_markers(tmp_path):
    readme = tmp_path / "README.md"
    readme.write_text(f"# title\n{tool.START}\nstale\n{tool.END}\ntail\n", encoding="utf-8")
    assert tool.main([str(readme)]) == 0
    assert readme.read_text() == f"# title\n{tool.START}\n{tool.reference()}\n{tool.END}\ntail\n"
    no_markers = tmp_path / "OTHER.md"
    no_markers.write_text("# nothing here\n", encoding="utf-8")
    assert tool.main([str(no_markers)]) == 1
    assert no_markers.read_text() == "# nothing here\n"
    with pytest.raises(ValueError, match="markers"):
        tool.between_markers(f"{tool.END} {tool.START}", "x")


def test_config_show_explain_prints_every_keys_meaning_and_reads_back_equal(tmp_path):
    from click.testing import CliRunner

    from psyrl.cli.config import config_group
    from psyrl.core.config import load_config

    args = ["show", "--config", "configs/tgrpo/tiny.toml", "--set", "rollout.filter_groups=true"]
    plain, explained = (
        CliRunner().invoke(config_group, args + extra) for extra in ([], ["--explain"])
    )
    assert plain.exit_code == 0 and explained.exit_code == 0, explained.output
    # the comments are the only difference: the same keys and values, in the same order
    assert [x for x in explained.output.splitlines() if not x.startswith("#")] == (
        plain.output.splitlines()
    )
    lines = explained.output.splitlines()
    keys = [i for i, x in enumerate(lines) if " = " in x and not x.startswith("#")]
    assert all(lines[i - 1].startswith("# ") for i in keys)  # every key has its meaning above it
    assert max(map(len, lines[: keys[-1]])) <= 100
    text = " ".join(x[2:] for x in lines if x.startswith("# "))
    assert "verl/trainer/ppo/v1/replay_buffer.py:295" in text  # the peer's line it follows
    path = tmp_path / "explained.toml"
    path.write_text(explained.output)
    expected = load_config("configs/tgrpo/tiny.toml", ["rollout.filter_groups=true"])
    assert load_config(path) == expected
