"""The synthetic demo set (psyrl/dataset/demo_data.py): deterministic, shipped files == a fresh
generation, clean splits."""

from pathlib import Path

import pytest
from click.testing import CliRunner

from psyrl.cli.data import demo_data_command
from psyrl.core.records import SUBDIMENSIONS, load_benchmark, load_stimuliqa
from psyrl.dataset.demo_data import FILES, generate, load_templates, write

SHIPPED = Path(__file__).resolve().parents[2] / "data" / "demo"


@pytest.fixture(scope="module")
def demo():
    return generate(0)


def _bytes(directory: Path) -> dict[str, bytes]:
    return {name: (directory / name).read_bytes() for name in FILES}


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path, demo):
    write(demo, tmp_path / "a")
    write(generate(0), tmp_path / "b")
    write(generate(1), tmp_path / "c")
    a, b, c = _bytes(tmp_path / "a"), _bytes(tmp_path / "b"), _bytes(tmp_path / "c")
    assert a == b
    for name in ("train.jsonl", "test.jsonl", "mc.jsonl"):
        assert a[name] != c[name], name


def test_shipped_files_equal_a_fresh_generation(tmp_path):
    result = CliRunner().invoke(demo_data_command, ["--out", str(tmp_path), "--seed", "0"])
    assert result.exit_code == 0, result.output
    fresh, shipped = _bytes(tmp_path), _bytes(SHIPPED)
    for name in FILES:
        assert shipped[name] == fresh[name], (
            f"data/demo/{name} drifted: run `psyrl demo-data --out data/demo --seed 0`"
        )


def test_shipped_files_load_and_count():
    train, test = load_stimuliqa(SHIPPED / "train.jsonl"), load_stimuliqa(SHIPPED / "test.jsonl")
    mc = load_benchmark(SHIPPED / "mc.jsonl")
    assert (len(train), len(test), len(mc)) == (720, 360, 360)
    for name in FILES:
        text = (SHIPPED / name).read_text(encoding="utf-8")
        assert text.endswith("\n") and text.isascii(), name
    assert (
        (SHIPPED / "README.md").read_text(encoding="utf-8").startswith("# data/demo: a SYNTHETIC")
    )


def test_splits_do_not_overlap(demo):
    ids = [r.id for r in demo.train] + [r.id for r in demo.test] + [r.id for r in demo.mc]
    texts = (
        [r.stimuli for r in demo.train]
        + [r.stimuli for r in demo.test]
        + [r.context for r in demo.mc]
    )
    assert len(set(ids)) == len(ids)
    assert len(set(texts)) == len(texts)


def test_records_are_complete(demo):
    for r in demo.train + demo.test:
        assert r.reasoning and r.reasoning.strip(), r.id
        assert r.reasoning != r.answer and r.answer.lower() not in r.reasoning.lower(), r.id
        assert SUBDIMENSIONS[r.subdimension] == r.dimension, r.id
        assert 30 <= len(r.stimuli.split()) <= 70, r.id
        assert 1 <= len(r.answer.split()) <= 5, r.id


def test_multiple_choice_items(demo):
    answers = {
        v["code"]: {a["answer"] for a in v["answers"]} for v in load_templates()["variables"]
    }
    for r in demo.mc:
        assert r.benchmark == "demo" and r.task in SUBDIMENSIONS and len(r.options) == 4, r.id
        assert len(set(r.options)) == len(r.options), r.id
        assert r.answer in r.options and r.options[r.answer_index] == r.answer, r.id
        assert set(r.options) <= answers[r.meta["variable"]], r.id
        assert r.meta["dimension"] == SUBDIMENSIONS[r.task], r.id
    assert len({r.answer_index for r in demo.mc}) == 4  # the gold is not always in one position


def test_coverage_and_exclusion(demo):
    records = demo.train + demo.test
    assert {r.subdimension for r in records} == set(SUBDIMENSIONS)
    assert {r.task for r in demo.mc} == set(SUBDIMENSIONS)
    assert demo.excluded == {"C_acol": 10, "C_agov": 10}
    kept = {r.variable for r in records}
    assert len(kept) == 18 and not kept & set(demo.excluded)
    assert not {r.meta["variable"] for r in demo.mc} & set(demo.excluded)
    for variable in kept:
        assert sum(r.variable == variable for r in demo.train) == 40
        assert sum(r.variable == variable for r in demo.test) == 20
        assert sum(r.meta["variable"] == variable for r in demo.mc) == 20
