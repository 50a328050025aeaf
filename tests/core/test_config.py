"""psyrl.core.config: TOML tables, defaults, and errors that name the file, the line and the key."""

import dataclasses
from pathlib import Path

import pytest
from click.testing import CliRunner

from psyrl.cli.main import main
from psyrl.core.config import ConfigError, dump_config, load_config
from psyrl.plan.architecture import load_architecture
from psyrl.plan.planner import plan

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(ROOT.glob("configs/**/*.toml"))


def write(tmp_path, text, name="c.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_loads_and_its_resolved_form_reads_back(path, tmp_path):
    config = load_config(path)
    assert load_config(write(tmp_path, dump_config(config))) == config


def test_some_config_ships():
    assert SHIPPED, "configs/ holds no TOML file"


def test_defaults_are_the_spec_values():
    c = load_config(None)
    assert (c.reward.variant, c.reward.w_f1, c.reward.w_fmt, c.reward.delta) == (
        "bilateral",
        0.5,
        0.5,
        0.1,
    )
    assert (
        c.reward.tau_low,
        c.reward.tau_high,
        c.reward.tau_rep,
        c.reward.l_plus,
        c.reward.s_minus,
    ) == (
        0.75,
        1.25,
        0.5,
        2.0,
        0.5,
    )
    assert (c.reward.w_len, c.reward.w_short, c.reward.eps, c.reward.short_reward_literal) == (
        0.1,
        0.1,
        1e-6,
        False,
    )
    assert (c.cache.size, c.advantage.scope, c.advantage.eps) == (4, "cache", 1e-6)
    assert (c.loss.eps_low, c.loss.eps_high, c.loss.dual_clip, c.loss.kl_coef) == (
        0.2,
        0.3,
        3.0,
        1e-2,
    )


@pytest.mark.parametrize("size", ["0.5b", "1.5b", "3b"])
def test_gpu_tgrpo_configs_carry_appendix_a3(size):
    c = load_config(ROOT / "configs" / "tgrpo" / f"qwen2.5-{size}.toml")
    # SPEC §4 batch arithmetic
    assert (c.rollout.prompts, c.rollout.samples, c.optim.global_batch) == (512, 5, 128)
    assert (c.rollout.temperature, c.rollout.valid_temperature, c.rollout.top_p) == (1.0, 0.5, 0.99)
    assert (c.rollout.max_prompt_tokens, c.rollout.max_new_tokens, c.run.steps) == (2048, 2048, 315)
    assert (
        c.optim.lr,
        c.optim.weight_decay,
        c.optim.grad_clip,
        c.optim.warmup_ratio,
        c.optim.schedule,
    ) == (1e-6, 1e-2, 1.0, 0.0, "constant")
    assert (c.optim.micro_batch, c.optim.logprob_micro_batch, c.loss.kl_coef) == (4, 16, 1e-2)
    # A.3 as EasyR1 reads it
    assert (c.model.dtype, c.fsdp.offload, c.fsdp.ref_offload) == ("bfloat16", "phase", True)
    assert c.reward.variant == "bilateral"
    # A.3
    assert (c.sampler.engine, c.sampler.tensor_parallel, c.sampler.sleep) == ("vllm", 2, True)
    assert c.checkpoint.export_dtype == "bfloat16"
    # the engine's memory fraction is computed for 4 x 48 GiB (A6000) beside what the trainer keeps,
    # not copied
    architecture, _ = load_architecture(c.model)
    assert c.sampler.gpu_memory_utilization == plan(c, architecture, 4, 48).suggested_utilization
    assert c.rollout.prompts % c.optim.global_batch == 0 and c.optim.global_batch % 4 == 0  # 4 GPUs


def error(path, overrides=()):
    with pytest.raises(ConfigError) as info:
        load_config(path, overrides)
    return str(info.value)


def test_syntax_error_names_file_and_line(tmp_path):
    path = write(tmp_path, '[run]\nname = "x"\n\n[reward]\nw_f1 = = 0.5\n')
    assert error(path).startswith(f"{path}:5: invalid TOML")


def test_unknown_key_names_line_and_suggests(tmp_path):
    path = write(tmp_path, '[run]\nname = "x"\n\n[reward]\nvariant = "base"\nw_fl = 0.5\n')
    message = error(path)
    assert message.startswith(f"{path}:6: unknown key 'w_fl' in [reward]")
    assert "did you mean 'w_f1'?" in message


def test_unknown_table(tmp_path):
    path = write(tmp_path, "[run]\nseed = 1\n[rewards]\nw_f1 = 0.5\n")
    assert error(path).startswith(f"{path}:3: unknown table [rewards]; did you mean 'reward'?")


def test_wrong_types(tmp_path):
    path = write(tmp_path, '[reward]\nvariant = "base"\n\n[loss]\nkl_coef = "0.01"\n')
    assert error(path) == f"{path}:5: [loss] kl_coef: expected float, got string '0.01'"
    path = write(tmp_path, "[cache]\nsize = 2.5\n")
    assert error(path) == f"{path}:2: [cache] size: expected int, got float 2.5"
    path = write(tmp_path, "[cache]\nsize = true\n")  # TOML bools are not ints
    assert error(path) == f"{path}:2: [cache] size: expected int, got bool True"
    path = write(tmp_path, "[reward]\nshort_reward_literal = 1\n")
    assert error(path) == f"{path}:2: [reward] short_reward_literal: expected bool, got int 1"
    path = write(tmp_path, "[reward]\nw_f1 = 1\n\n[reward.w_fmt]\nx = 1\n")
    assert error(path) == f"{path}:4: [reward] w_fmt: expected float, got table {{'x': 1}}"
    path = write(tmp_path, "reward = 3\n")
    assert error(path) == f"{path}:1: 'reward' must be a table ([reward]), got int"
    path = write(tmp_path, '[advantage]\nscope = "grop"\n')
    assert (
        error(path)
        == f"{path}:2: [advantage] scope: expected one of 'cache', 'batch', 'group', got 'grop'; "
        "did you mean 'group'?"
    )


def test_out_of_range_values(tmp_path):
    path = write(tmp_path, "[run]\nseed = 1\n\n[loss]\n# clip\neps_low = 1.5\n")
    assert error(path) == f"{path}:6: [loss] eps_low: expected 0 <= eps_low < 1, got 1.5"
    path = write(tmp_path, "[cache]\nsize = 0\n")
    assert error(path) == f"{path}:2: [cache] size: expected >= 1, got 0"
    path = write(tmp_path, "[loss]\ndual_clip = 0.5\n")
    assert "dual_clip: expected 0 (off) or > 1" in error(path)


def test_int_is_accepted_for_float(tmp_path):
    path = write(tmp_path, "[reward]\nw_f1 = 1\n")
    assert load_config(path).reward.w_f1 == 1.0 and isinstance(load_config(path).reward.w_f1, float)


def test_overrides_are_type_checked(tmp_path):
    path = write(tmp_path, "[reward]\nw_f1 = 0.5\n")
    c = load_config(
        path, ["reward.w_f1=0.25", "run.name=my-run", "cache.size=2", 'reward.variant="base"']
    )
    assert (c.reward.w_f1, c.run.name, c.cache.size, c.reward.variant) == (
        0.25,
        "my-run",
        2,
        "base",
    )
    assert error(path, ["reward.w_f1=abc"]) == (
        "--set reward.w_f1=abc: [reward] w_f1: expected float, got string 'abc'"
        " (--set values are TOML: 0.5, true, '\"quoted text\"')"
    )
    assert (
        error(path, ["cache.size=-1"]) == "--set cache.size=-1: [cache] size: expected >= 1, got -1"
    )
    assert error(path, ["reward.wf1=1"]).startswith(
        "--set reward.wf1=1: unknown key 'wf1' in [reward]; did you mean 'w_f1'?"
    )
    assert error(path, ["rewrd.w_f1=1"]).startswith(
        "--set rewrd.w_f1=1: unknown table [rewrd]; did you mean 'reward'?"
    )
    assert "expected table.key=value" in error(path, ["w_f1=1"])
    assert "expected table.key=value" in error(path, ["reward.w_f1"])


def test_missing_or_unreadable_file(tmp_path):
    assert error(tmp_path / "nope.toml").startswith(
        f"{tmp_path / 'nope.toml'}: cannot read config file"
    )
    bad = tmp_path / "latin1.toml"
    bad.write_bytes(b'[run]\nname = "caf\xe9"\n')
    assert error(bad).startswith(f"{bad}: cannot read config file")


def test_dump_round_trips_awkward_strings(tmp_path):
    c = load_config(None)
    # TOML forbids raw control characters
    awkward = 'a "quoted" \\ dïr\twith\nnewline, DEL \x7f, NUL \x00 😀'
    c = dataclasses.replace(c, run=dataclasses.replace(c.run, name="näme 😀", output_dir=awkward))
    assert load_config(write(tmp_path, dump_config(c))) == c


def test_line_numbers_for_every_toml_spelling(tmp_path):
    cases = [
        # multi-line string
        ('[run]\nname = """\nsteps = 1\n"""\nsteps = 0\n', 5, "[run] steps: expected >= 1"),
        # quoted header
        ('["reward"]\nw_fmt = 0.5\nw_f1 = -1\n', 3, "[reward] w_f1: expected >= 0"),
        # dotted key
        ("[reward]\nw_f1.value = 0.3\n", 2, "[reward] w_f1: expected float, got table"),
        ('[run]\nname = "a"\n\n[cache]\nsize = 2\n[loss]\nkl_coef = -1\n', 7, "[loss] kl_coef"),
        # inline
        (
            "reward = { w_f1 = 0.3, tau_low = 2.0 }\n",
            1,
            "[reward] tau_low: expected 0 < tau_low <= 1",
        ),
        ("reward.delta = -1\n", 1, "[reward] delta: expected >= 0"),  # top-level dotted key
        ("[[reward]]\nw_f1 = 0.3\n", 1, "'reward' must be a table ([reward]), got array"),
        (
            "steps = 40\n[run]\nname = 'a'\n",
            1,
            "key 'steps' is outside any table; it belongs under [run]",
        ),
        ("colour = 1\n", 1, "unknown key 'colour' outside any table"),
    ]
    for text, line, message in cases:
        path = write(tmp_path, text)
        assert error(path).startswith(f"{path}:{line}: {message}"), (text, error(path))


def test_values_a_run_cannot_use(tmp_path):
    for text, message in [
        ("[reward]\nw_f1 = inf\n", "w_f1: expected a finite float, got inf"),
        ("[loss]\neps_high = nan\n", "eps_high: expected a finite float, got nan"),
        ("[run]\nsteps = 99999999999999999999\n", "steps: expected a 64-bit int"),
        ('[run]\nname = ".."\n', "name: expected a directory name"),
        ('[run]\nname = "a/b"\n', "name: expected a directory name"),
        ('[run]\noutput_dir = ""\n', "output_dir: expected a directory"),
        ("[run]\nseed = -5\n", "seed: expected >= 0"),
    ]:
        assert message in error(write(tmp_path, text)), text


def test_byte_order_mark_and_empty_path(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbf[cache]\nsize = 3\n")
    assert load_config(path).cache.size == 3
    assert error("") == "the config path is empty"


def test_override_blames_the_file_when_the_file_is_wrong(tmp_path):
    path = write(tmp_path, "run = 3\n")
    assert error(path, ["run.name=x"]) == f"{path}:1: 'run' must be a table ([run]), got int"
    assert "invalid TOML value" in error(None, ['run.name="unterminated'])
    assert load_config(None, ["run.name='single quoted'"]).run.name == "single quoted"


def test_tables_check_their_choices_when_built_in_code():
    from psyrl.core.config import RewardConfig
    from psyrl.core.tomlconf import FieldError

    with pytest.raises(FieldError, match="variant: expected one of .* got 'nope'"):
        RewardConfig(variant="nope")


def test_cli_config_show(tmp_path):
    runner = CliRunner()
    result = runner.invoke(
        main,
        [
            "config",
            "show",
            "--config",
            str(write(tmp_path, "[cache]\nsize = 2\n")),
            "--set",
            "loss.kl_coef=0",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "[cache]\nsize = 2\n" in result.output and "kl_coef = 0.0" in result.output
    result = runner.invoke(main, ["config", "show", "--set", "cache.size=x"])
    assert result.exit_code == 1
    assert "--set cache.size=x: [cache] size: expected int" in result.output
