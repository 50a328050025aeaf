"""The trackers' wrapper (`psyrl.run.trackers`) and `log.report_to`: what reaches a tracker, and
that a tracker which fails is one warning, never a stopped run. The trackers' own files are read
back in tests/test_train_tgrpo.py."""

import sys

import pytest

from psyrl.core.config import ConfigError, dump_config, load_config
from psyrl.run.trackers import TrackedRun, Trackers, scalars


def tracked(tmp_path, sent=-1) -> TrackedRun:
    return TrackedRun(tmp_path, "r", "psyrl", {"run": {"seed": 0}}, "[run]\nseed = 0\n", 1, sent)


def test_report_to_is_an_array_of_known_trackers(tmp_path):
    cfg = load_config(None, ['log.report_to=["wandb", "tensorboard"]'])
    assert cfg.log.report_to == ["wandb", "tensorboard"]
    assert load_config(None).log.report_to == []
    path = tmp_path / "c.toml"
    path.write_text(dump_config(cfg))
    assert load_config(str(path)).log.report_to == ["wandb", "tensorboard"]  # dump round-trips
    with pytest.raises(
        ConfigError,
        match=r"unknown tracker\(s\) \['mlflow'\]; expected any of "
        r"\['tensorboard', 'wandb', 'trackio'\]",
    ):
        load_config(None, ['log.report_to=["tensorboard", "mlflow"]'])
    with pytest.raises(ConfigError, match="an array of strings, got string 'wandb'"):
        load_config(None, ["log.report_to=wandb"])
    with pytest.raises(ConfigError, match="named twice"):
        load_config(None, ['log.report_to=["wandb", "wandb"]'])
    path.write_text('[log]\nreport_to = ["tensorboard", 3]\n')
    with pytest.raises(
        ConfigError,
        match=r"c.toml:2: \[log\] report_to: expected an array of "
        r"strings, got array",
    ):
        load_config(str(path))


def test_scalars_are_the_finite_numbers_of_a_row():
    row = {
        "step": 3,
        "steps": 10,
        "loss": 0.5,
        "nan": float("nan"),
        "flag": True,
        "name": "x",
        "none": None,
    }
    assert scalars(row) == {"steps": 10.0, "loss": 0.5}


def test_a_missing_library_is_one_warning_naming_its_extra(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    trackers = Trackers(["wandb"], tracked(tmp_path))
    trackers.log({"step": 1, "loss": 1.0})
    trackers.close()
    err = capsys.readouterr().err
    assert err.count("warning: tracker wandb is off") == 1
    assert 'pip install "psyrl[wandb]"' in err and "metrics.jsonl has every row" in err


def test_a_tracker_that_fails_is_dropped_after_one_warning(tmp_path, capsys):
    pytest.importorskip("tensorboard", reason="pip install 'psyrl[tensorboard]'")
    (tmp_path / "tensorboard").write_text("a file where the event directory goes")
    trackers = Trackers(["tensorboard"], tracked(tmp_path))  # fails to start
    trackers.log({"step": 1, "loss": 1.0})
    assert trackers.live == {}
    assert capsys.readouterr().err.count("warning: tracker tensorboard is off") == 1

    (tmp_path / "tensorboard").unlink()
    trackers = Trackers(["tensorboard"], tracked(tmp_path))

    class Full:  # a tracker whose library raises on every call, as on a full disk
        rewinds = True

        def log(self, step, values):
            raise OSError(28, "No space left on device")

    trackers.live["wandb"] = Full()
    for step in (1, 2, 3):
        trackers.log({"step": step, "loss": 1.0})
    trackers.close()
    err = capsys.readouterr().err
    assert err.count("warning: tracker wandb is off") == 1 and "No space left" in err
    assert "tensorboard" not in err  # the other tracker got every row
