"""`reward.custom`: a plug-in's accuracy replaces r_F1 in the final reward, the cache's r-bar_F1 and
the bilateral bonus; a plug-in computing psyrl's own F1 reproduces the built-in rewards exactly;
every way a plug-in can be wrong is one message naming it (and the sample)."""

import pytest
import torch

from psyrl.core.config import Config, ConfigError, RewardConfig, load_config
from psyrl.core.records import StimuliRecord
from psyrl.rl.rewards import VARIANTS, answer_components, final_rewards
from psyrl.signals.build import Accuracy

RESPONSES = [
    "<think>she lost it</think><answer>Annoyed.</answer>",
    "<think>hm</think><answer>very annoyed</answer>",
    "annoyed",
    "<answer></answer>",
    "<think>a a a a a a a a</think><answer>calm</answer>",
]
GOLDS = ["annoyed"] * len(RESPONSES)
RECORDS = [StimuliRecord(f"s/{i}", "story", "How?", "annoyed") for i in range(len(RESPONSES))]


def plugin(reward: RewardConfig) -> Accuracy:
    """reward.accuracy's signals for a config of this [reward] table."""
    return Accuracy(Config(reward=reward))


def plugin_file(tmp_path, body: str, name="plugin.py") -> str:
    path = tmp_path / name
    path.write_text(body)
    return str(path)


def test_a_plugin_computing_psyrls_f1_reproduces_the_built_in_rewards(tmp_path):
    path = plugin_file(
        tmp_path,
        "from psyrl.core.text import extract_answer, token_f1\n"
        "def f1(responses, golds, records):\n"
        "    return [token_f1(extract_answer(r), g)\n"
        "            for r, g in zip(responses, golds)]\n",
    )
    lengths = [30, 10, 25, 5, 60]
    for variant in VARIANTS:
        built_in = RewardConfig(variant=variant)
        custom = RewardConfig(variant=variant, custom=f"{path}:f1", accuracy="custom")
        a = answer_components(RESPONSES, GOLDS, "cot", built_in)
        b = answer_components(RESPONSES, GOLDS, "cot", custom, plugin(custom), RECORDS)
        assert torch.equal(a["f1"], b["f1"]) and torch.equal(b["accuracy/f1"], a["f1"])
        final_a, parts_a = final_rewards(a, lengths, 26.0, a["f1"].mean().item(), built_in)
        final_b, parts_b = final_rewards(b, lengths, 26.0, b["f1"].mean().item(), custom)
        assert torch.equal(final_a, final_b), variant
        for key in ("br", "len", "short", "rep", "fmt"):
            assert torch.equal(parts_a[key], parts_b[key]), (variant, key)


def test_the_example_exact_match_plugin():
    cfg = RewardConfig(custom="examples/exact_match.py:exact_match", accuracy="custom")
    parts = answer_components(RESPONSES, GOLDS, "cot", cfg, plugin(cfg), RECORDS)
    # "Annoyed." normalises to "annoyed"; "very annoyed" does not match; a bare "annoyed" is its
    # own answer; an empty answer is neither right nor answered; "calm" is answered and wrong
    assert parts["f1"].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
    assert parts["custom/answered"].tolist() == [1.0, 1.0, 1.0, 0.0, 1.0]
    assert parts["accuracy/f1"].tolist() == pytest.approx([1.0, 2 / 3, 1.0, 0.0, 0.0])
    assert torch.equal(parts["accuracy/custom"], parts["f1"])
    # the bilateral bonus follows the plug-in's accuracy, not the F1 (eq. 8, r-bar = 0.4, L-bar =
    # 20): samples 0 (short) and 2 (long) match exactly and get delta; sample 1 is short with F1
    # 2/3 > 0.4 but accuracy 0: no bonus; samples 3 and 4 are long and wrong
    _, c = final_rewards(parts, [5, 5, 30, 30, 30], 20.0, 0.4, cfg)
    assert c["br"].tolist() == [0.1, 0.0, 0.1, 0.0, 0.0]


@pytest.mark.parametrize(
    "body, spec_name, message",
    [
        (None, "f", "no file"),
        ("x = 1\n", "f", "defines no function 'f'"),
        ("import not_a_module_anywhere\n", "f", "importing .* failed: ModuleNotFoundError"),
        ("def f(r, g, x):\n    raise KeyError('oops')\n", "f", "raised KeyError"),
        ("def f(r, g, x):\n    return [1.0]\n", "f", r"score: 1 values for 5 responses"),
        ("def f(r, g, x):\n    return 'abc'\n", "f", "expected one number per response"),
        (
            "def f(r, g, x):\n    return [0, 0, float('nan'), 0, 0]\n",
            "f",
            r"score of sample 2 \(id s/2\) is nan, expected a number in \[0, 1\]",
        ),
        ("def f(r, g, x):\n    return [0, 0, 0, 1.5, 0]\n", "f", r"sample 3 \(id s/3\) is 1.5"),
        (
            "def f(r, g, x):\n    return [0] * 5, {'len': [1, 2]}\n",
            "f",
            "component 'len': 2 values",
        ),
        (
            "def f(r, g, x):\n    return [0] * 5, [1]\n",
            "f",
            "expected \\(scores, \\{name: values\\}\\)",
        ),
    ],
)
def test_a_wrong_plugin_is_one_message_naming_it(tmp_path, body, spec_name, message):
    path = plugin_file(tmp_path, body) if body is not None else str(tmp_path / "missing.py")
    spec = f"{path}:{spec_name}"
    cfg = RewardConfig(custom=spec, accuracy="custom")
    with pytest.raises(ValueError, match=message) as info:
        answer_components(RESPONSES, GOLDS, "cot", cfg, plugin(cfg), RECORDS)
    assert f"reward.custom = {spec!r}" in str(info.value)


@pytest.mark.parametrize("spec", ["plugin.py", "plugin.txt:f", "plugin.py:2f", ":f"])
def test_a_malformed_spec_is_a_config_error(spec):
    expected = r"\[reward\] custom: expected 'path/to/file.py:function'"
    with pytest.raises(ConfigError, match=expected):
        load_config(None, [f'reward.custom="{spec}"'])


def test_a_plugin_no_signal_uses_is_a_config_error():
    with pytest.raises(ConfigError, match='no signal uses it: set reward.accuracy = "custom"'):
        load_config(None, ['reward.custom="examples/exact_match.py:exact_match"'])
    with pytest.raises(ConfigError, match='"custom" accuracy signal needs reward.custom'):
        load_config(None, ["reward.accuracy=custom"])
    cfg = load_config(
        None,
        [
            'reward.custom="examples/exact_match.py:exact_match"',
            'reward.log_accuracy=["custom"]',
        ],
    )
    parts = answer_components(RESPONSES, GOLDS, "cot", cfg.reward, Accuracy(cfg), RECORDS)
    # logged beside the paper's F1, which stays in r_F1's role
    assert torch.equal(parts["f1"], parts["accuracy/f1"])
    assert parts["accuracy/custom"].tolist() == [1.0, 0.0, 1.0, 0.0, 0.0]
