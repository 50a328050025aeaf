"""psyrl.core.generation_options: each checked option's error names the option, and its bound's
words say what the config key's table accepts (the table judges; the words are the option's own)."""

import dataclasses

import pytest

from psyrl.core.generation_options import (
    OPTION_KEYS,
    TOOL_DEFAULTS,
    GenerationOptions,
    option_problems,
)

DEFAULTS = {name: TOOL_DEFAULTS.get(name, spec.default()) for name, spec in OPTION_KEYS.items()}


def options(**values):
    return GenerationOptions(**{**DEFAULTS, **values})


# (option, the last value its bound accepts, the first it refuses)
EDGES = [
    ("temperature", 0.0, -0.01),
    ("top_p", 1.0, 1.01),
    ("top_p", 0.01, 0.0),
    ("max_new_tokens", 1, 0),
    ("samples", 1, 0),
    ("batch", 1, 0),
    ("tensor_parallel", 1, 0),
    ("gpu_memory_utilization", 1.0, 1.01),
    ("gpu_memory_utilization", 0.01, 0.0),
]


@pytest.mark.parametrize("name, accepted, refused", EDGES)
def test_a_bound_refuses_what_its_table_refuses_and_names_the_option(name, accepted, refused):
    assert option_problems(options(**{name: accepted})) == []
    flag = "--" + name.replace("_", "-")
    assert option_problems(options(**{name: refused})) == [
        f"{flag} must be {OPTION_KEYS[name].bound}"
    ]


def test_every_bound_is_tested_and_seed_takes_any_int():
    assert {name for name, spec in OPTION_KEYS.items() if spec.bound} == {n for n, _, _ in EDGES}
    assert option_problems(options(seed=-1)) == []  # run.seed refuses it; the tools do not


def test_the_option_keys_are_the_fields_of_generation_options_in_order():
    assert list(OPTION_KEYS) == [f.name for f in dataclasses.fields(GenerationOptions)]
