"""psyrl.rl.rewards: the bilateral reward and its variants, eq. 3-9 and 11-15 (SPEC §2)."""

import math
import typing

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from psyrl.core.config import RewardConfig
from psyrl.rl.rewards import (
    VARIANTS,
    answer_components,
    bilateral_bonus,
    final_rewards,
    format_reward,
    length_ratio,
    length_reward,
    overlong_penalty,
    repetition_penalty,
    reward_metrics,
    short_reward,
)

# SPEC §2 defaults: w 0.5/0.5, delta 0.1, tau 0.75/1.25, L+ 2, S- 0.5, tau_rep 0.5, eps 1e-6
CFG = RewardConfig()
T = lambda *values: torch.tensor(values, dtype=torch.float64)


# ---------------------------------------------------------------- eq. 6: format


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<think>because</think><answer>joy</answer>", 1.0),
        # whitespace around and between
        ("  \n<think> because </think>\n\n<answer> joy </answer>\n ", 1.0),
        ("<think>ünïcödé 思考 😀</think><answer>喜び</answer>", 1.0),
        ("<think>a</think><answer>b</answer><answer>c</answer>", 0.0),  # two answer blocks
        ("<think>a</think><answer></answer>", 0.0),  # empty answer
        ("<think>a</think><answer>  \n </answer>", 0.0),  # whitespace-only answer
        ("<think> </think><answer>b</answer>", 0.0),  # empty think
        ("<think>never closed <answer>b</answer>", 0.0),
        ("<think>a</think><answer><think>b</think></answer>", 0.0),  # tags inside the answer
        ("<think>a</think><answer>x</answer></answer>", 0.0),
        ("<answer>b</answer><think>a</think>", 0.0),  # wrong order
        ("preamble <think>a</think><answer>b</answer>", 0.0),  # text outside the blocks
        ("<think>a</think> and <answer>b</answer>", 0.0),
        ("<think>a</think><answer>b</answer> trailing", 0.0),
        ("<answer>b</answer>", 0.0),  # cot mode needs the think block
        ("", 0.0),
        ("<THINK>a</THINK><ANSWER>b</ANSWER>", 0.0),  # tags are case-sensitive
    ],
)
def test_format_reward_cot(response, expected):
    assert format_reward(response, "cot") == expected


@pytest.mark.parametrize(
    "response, expected",
    [
        ("<answer>joy</answer>", 1.0),
        ("\n<answer> joy </answer>  ", 1.0),
        ("<think>a</think><answer>joy</answer>", 0.0),  # direct mode: no think tags at all
        ("<answer>joy</answer><think>", 0.0),
        ("<answer>a</answer><answer>b</answer>", 0.0),
        ("<answer> </answer>", 0.0),
        ("joy", 0.0),
    ],
)
def test_format_reward_direct(response, expected):
    assert format_reward(response, "direct") == expected


content = st.text(alphabet=st.characters(blacklist_characters="<>"), min_size=0, max_size=20)
space = st.sampled_from(["", " ", "\n", " \n\t "])


@given(space, content, space, content, space)
def test_format_reward_property(ws0, think, ws1, answer, ws2):
    response = f"{ws0}<think>{think}</think>{ws1}<answer>{answer}</answer>{ws2}"
    assert format_reward(response, "cot") == float(bool(think.strip()) and bool(answer.strip()))
    # any extra tag, anywhere, breaks it
    for tag in ("<think>", "</think>", "<answer>", "</answer>"):
        assert format_reward(response + tag, "cot") == 0.0
        assert format_reward(tag + response, "cot") == 0.0


def test_format_reward_unknown_mode():
    with pytest.raises(ValueError, match="cot"):
        format_reward("<answer>x</answer>", "verbose")


# ---------------------------------------------------------------- eq. 9: repetition penalty


def test_repetition_penalty_hand_values():
    # words a b c d a b c d: total4 = 8 - 3 = 5 four-grams abcd bcda cdab dabc abcd, unique 4,
    # repeated 1
    # p = min(0.5, 1 / (5 + 1e-6)) = 0.19999996
    assert repetition_penalty("a b c d a b c d", 0.5, 1e-6) == pytest.approx(
        1 / (5 + 1e-6), abs=1e-15
    )
    # normalisation first (eq. 5): the same words behind punctuation and case
    assert repetition_penalty("A, b. c! d; a B c D", 0.5, 1e-6) == pytest.approx(
        1 / (5 + 1e-6), abs=1e-15
    )
    # a a a a a a: total4 = 3, unique 1, repeated 2: 2/3 capped at tau_rep = 0.5
    assert repetition_penalty("a a a a a a", 0.5, 1e-6) == 0.5
    assert repetition_penalty("a a a a a a", 0.9, 1e-6) == pytest.approx(2 / (3 + 1e-6), abs=1e-15)
    assert repetition_penalty("one two three four five", 0.5, 1e-6) == 0.0  # no repeats
    assert repetition_penalty("a a a", 0.5, 1e-6) == 0.0  # fewer than 4 words
    assert repetition_penalty(None, 0.5, 1e-6) == 0.0  # no think block
    assert repetition_penalty("", 0.5, 1e-6) == 0.0


@given(st.lists(st.sampled_from(["a", "b", "c", "!", "Joy", "d"]), max_size=40), st.floats(0, 2))
def test_repetition_penalty_in_zero_cap(tokens, cap):
    p = repetition_penalty(" ".join(tokens), cap, 1e-6)
    assert 0.0 <= p <= cap


# ----------------------------------------------------------- eq. 7-8, 13-14: length-dependent terms


def test_length_ratio_guards_zero_mean():
    assert length_ratio(T(50, 150), 100.0).tolist() == [0.5, 1.5]
    assert length_ratio(T(0, 0), 0.0).tolist() == [1.0, 1.0]  # no length signal


def test_bilateral_bonus_eq8():
    # L-bar = 100, r-bar_F1 = 0.5, delta 0.1, tau_- 0.75, tau_+ 1.25
    f1 = T(0.8, 0.8, 0.8, 0.4, 0.5, 0.8, 0.8)
    ratio = length_ratio(T(50, 150, 100, 50, 50, 75, 125), 100.0)
    br, short, long = bilateral_bonus(f1, ratio, 0.5, CFG)
    # short & better, long & better, mid length, not better, equal F1 (strict >), exactly tau_-,
    # exactly tau_+
    assert br.tolist() == [0.1, 0.1, 0.0, 0.0, 0.0, 0.0, 0.0]
    assert short.tolist() == [True, False, False, False, False, False, False]
    assert long.tolist() == [False, True, False, False, False, False, False]


def test_length_reward_eq13():
    # r_F1 = 0.5, r-bar_F1 = 0.5: log(1 + 0.5/0.500001) = log(1.999996) = 0.6931452; times L/L-bar
    gain = math.log(1 + 0.5 / (0.5 + 1e-6))
    out = length_reward(T(0.5, 0.5, 0.5, 0.0), T(1.5, 2.0, 2.5, 1.0), 0.5, CFG)
    # L+ = 2 inclusive
    assert out.tolist() == pytest.approx([gain * 1.5, gain * 2.0, 0.0, 0.0], abs=1e-12)


def test_short_reward_eq14_spec_reading_and_literal():
    gain = math.log(1 + 0.5 / (0.5 + 1e-6))
    ratio = T(0.5, 0.4, 2.0)
    # SPEC §2: times L-bar/L where L/L-bar >= S- = 0.5: 0.5 -> x2, 0.4 -> 0, 2.0 -> x0.5
    assert short_reward(T(0.5, 0.5, 0.5), ratio, 0.5, CFG).tolist() == pytest.approx(
        [2 * gain, 0.0, 0.5 * gain]
    )
    literal = RewardConfig(short_reward_literal=True)  # eq. 14 as printed: times L/L-bar
    assert short_reward(T(0.5, 0.5, 0.5), ratio, 0.5, literal).tolist() == pytest.approx(
        [0.5 * gain, 0.0, 2 * gain]
    )


# ---------------------------------------------------------------- eq. 3, 11, 12, 15: final rewards


def test_variants_are_the_config_choices():
    assert tuple(VARIANTS) == typing.get_args(typing.get_type_hints(RewardConfig)["variant"])


def test_final_rewards_every_variant_by_hand():
    # Two samples, L-bar = 100, r-bar_F1 = 0.5.
    # s0: f1 1.0, fmt 1, rep 0.2, L 50  -> ratio 0.5: short & better -> br 0.1
    #     len = log(1 + 1/0.500001) * 0.5 ; short = log(1 + 1/0.500001) * 2
    # s1: f1 0.0, fmt 0, rep 0.0, L 150 -> ratio 1.5: not better -> br 0; len = short = log(1) * . =
    # 0
    comps = {"f1": T(1.0, 0.0), "fmt": T(1.0, 0.0), "rep": T(0.2, 0.0)}
    gain = math.log(1 + 1.0 / (0.5 + 1e-6))
    base0 = 0.5 * 1.0 + 0.5 * 1.0  # eq. 11 = 1.0
    expected = {
        "base": [base0, 0.0],
        "length": [base0 + 0.1 * gain * 0.5, 0.0],  # eq. 12-13
        "short": [base0 + 0.1 * gain * 2.0, 0.0],  # eq. 12, 14 (SPEC reading)
        "length_rp": [base0 + 0.1 * gain * 0.5 - 0.2, 0.0],  # eq. 15
        "bilateral": [base0 + 0.1 - 0.2, 0.0],  # eq. 3
    }
    for variant, values in expected.items():
        final, c = final_rewards(comps, [50, 150], 100.0, 0.5, RewardConfig(variant=variant))
        assert final.tolist() == pytest.approx(values, abs=1e-12), variant
        assert torch.equal(final, c["final"])
        assert c["br"].tolist() == [0.1, 0.0] and c["ratio"].tolist() == [0.5, 1.5]


def test_both_halves_under_reward_hacking_outputs():
    gold = "joy"
    responses = [
        "<think>she smiled</think><answer>joy</answer>",  # honest: f1 1, fmt 1
        # two blocks: last one scores, format 0
        "<think>x</think><answer>sad</answer><answer>joy</answer>",
        "<think>x</think><answer></answer>",  # empty answer
        # think never closed: the tag text goes, "joy joy joy" -> {joy}, format 0
        "<think>joy joy joy",
        "<think>x</think><answer><think>joy</think></answer>",  # tags inside the answer
        "<answer>ＪＯＹ！</answer>",  # fullwidth letters stay a different word
        "<think>" + "the same words again " * 50_000 + "</think><answer>joy</answer>",  # ~1 MB
        "",
        # ~1 MB of unclosed think tags (a lazy regex is quadratic here)
        "<think>" * 150_000 + "joy",
    ]
    parts = answer_components(responses, [gold] * len(responses), "cot", CFG)
    final, c = final_rewards(parts, [10] * len(responses), 10.0, 0.5, CFG)
    assert c["f1"].tolist() == [1.0, 1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    assert c["fmt"].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]
    # 1 MB think: 200,000 words repeating a 4-word cycle: 4 unique 4-grams of 199,997 -> capped at
    # 0.5
    assert c["rep"].tolist() == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.5, 0.0, 0.0]
    # all lengths equal L-bar: no BR; bilateral = 0.5 f1 + 0.5 fmt - rep
    assert final.tolist() == pytest.approx([1.0, 0.5, 0.0, 0.5, 0.5, 0.0, 0.5, 0.0, 0.5])


def test_answer_components_direct_mode():
    c = answer_components(["<answer>a a a a a a</answer>"], ["a"], "direct", CFG)
    assert c["fmt"].tolist() == [1.0] and c["rep"].tolist() == [0.0] and c["f1"].tolist() == [1.0]
    # a think block in direct mode: format 0, and its repetition is penalised like anywhere else
    # (SPEC §2)
    c = answer_components(["<think>a a a a a a</think><answer>a</answer>"], ["a"], "direct", CFG)
    assert c["fmt"].tolist() == [0.0] and c["rep"].tolist() == [0.5]


def test_answer_components_length_mismatch():
    with pytest.raises(ValueError, match="2 responses but 1 gold"):
        answer_components(["a", "b"], ["a"], "cot", CFG)
    with pytest.raises(ValueError, match="3 lengths for 1 responses"):
        final_rewards(answer_components(["a"], ["a"], "cot", CFG), [1, 2, 3], 2.0, 0.5, CFG)


def test_reward_metrics_fractions():
    comps = {"f1": T(1.0, 0.0), "fmt": T(1.0, 0.0), "rep": T(0.2, 0.0)}
    _, c = final_rewards(comps, [50, 150], 100.0, 0.5, CFG)
    m = reward_metrics(c)
    assert m["reward/br_short_fraction"] == 0.5 and m["reward/br_long_fraction"] == 0.0
    assert m["reward/final"] == pytest.approx((0.9 + 0.0) / 2)
    assert m["reward/repetition_penalty"] == pytest.approx(0.1)
    assert m["response/length"] == 100.0


def test_overlong_penalty_hand_values_and_every_variant():
    # L_max 20, buffer 4, penalty 1: lengths 10, 16, 17, 20 -> 0, 0, -1/4, -1 (DAPO's linear ramp)
    cfg = RewardConfig(overlong_buffer=4)
    lengths = torch.tensor([10.0, 16.0, 17.0, 20.0])
    assert overlong_penalty(lengths, 20, cfg).tolist() == [0.0, 0.0, -0.25, -1.0]
    half = RewardConfig(overlong_buffer=4, overlong_penalty=0.5)
    assert overlong_penalty(lengths, 20, half).tolist() == [0.0, 0.0, -0.125, -0.5]
    comps = answer_components(["<think>a</think><answer>b</answer>"] * 4, ["b"] * 4, "cot", CFG)
    for variant in VARIANTS:
        plain, _ = final_rewards(comps, lengths, 15.0, 0.5, RewardConfig(variant=variant), 20)
        shaped, c = final_rewards(
            comps, lengths, 15.0, 0.5, RewardConfig(variant=variant, overlong_buffer=4), 20
        )
        assert torch.equal(shaped, plain + c["overlong"]), variant
        assert (
            "overlong"
            not in final_rewards(comps, lengths, 15.0, 0.5, RewardConfig(variant=variant))[1]
        )
    # the ramp may span the whole budget (verl's bound), not more
    final_rewards(comps, lengths, 15.0, 0.5, cfg, 4)
    with pytest.raises(ValueError, match="needs rollout.max_new_tokens >= it"):
        final_rewards(comps, lengths, 15.0, 0.5, cfg, 3)
