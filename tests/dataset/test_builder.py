"""`psyrl build` end to end: a scripted sampler (canned good, malformed and leaky generations) so
that every kept and dropped path runs with known counts, resume after an interruption, and plumbing
runs on a tiny random model."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from psyrl.cli.build import build_group
from psyrl.cli.main import main
from psyrl.core.config import ModelConfig
from psyrl.core.errors import Preempted
from psyrl.core.records import DataError, StimuliRecord, load_stimuliqa, sft_target, write_jsonl
from psyrl.dataset import prompts
from psyrl.dataset.builder import build_comparison, build_qa
from psyrl.dataset.catalogue import load_catalogue
from psyrl.dataset.generation_log import Sampling, prompt_sha
from psyrl.dataset.labelled import load_labelled
from psyrl.dataset.reasoning import build_reasoning
from psyrl.dataset.run import BuildError, BuildRun
from psyrl.dataset.topics import build_topics
from psyrl.runtime.distributed import ONE_PROCESS
from psyrl.runtime.model import load_model, load_tokenizer
from psyrl.runtime.sampler import Completion

CATALOGUE, TABLE = "data/build/catalogue.toml", "data/build/stimuli.csv"
TOKENIZER = load_tokenizer(ModelConfig())
SETTINGS = {"model": "scripted", "temperature": 0.7}


class ScriptedSampler:
    """The sampler interface with canned generations: `respond(prompt, j)` -> text or (text,
    finish_reason). Counts the prompts it generates; `fail_after` calls, it raises (an interrupted
    build)."""

    def __init__(self, respond, fail_after=None):
        self.respond, self.fail_after, self.calls, self.prompts = respond, fail_after, 0, 0

    def generate(self, prompt_token_ids, n, temperature, top_p, max_new_tokens, seed):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise RuntimeError("interrupted")
        self.calls += 1
        self.prompts += len(prompt_token_ids)
        groups = []
        for ids in prompt_token_ids:
            prompt = TOKENIZER.decode(ids)
            outputs = [self.respond(prompt, j) for j in range(n)]
            outputs = [o if isinstance(o, tuple) else (o, "stop") for o in outputs]
            groups.append(
                [Completion(tuple(TOKENIZER(t)["input_ids"]), t, f, ()) for t, f in outputs]
            )
        return groups

    def close(self):
        pass


def build_run(out, sampler, samples=1, batch=4, settings=SETTINGS):
    def make():
        if sampler is None:
            raise AssertionError("the model was loaded, though nothing was left to generate")
        return sampler

    return BuildRun(
        ONE_PROCESS,
        TOKENIZER,
        Path(out),
        dict(settings),
        Sampling(samples=samples, batch=batch),
        make,
        progress=False,
    )


# ------------------------------------------------- qa: canned outcomes per variable, 2 samples each
GOOD = (
    "Question: How did the narrator feel when the plans fell through?\n"
    "Answer: Deeply let down\nReason: They had looked forward to the trip for months."
)


def qa_response(prompt, j):
    code = re.search(r"psychological parameter (\w+) \(", prompt)[1]
    value = re.search(rf"\n{code}: ([\d.]+)", prompt)[1]
    return {
        "B_disap": [GOOD, GOOD],  # kept, then an exact duplicate
        "B_anger": [
            "Question: What is the B_anger score here?\nAnswer: 1",
            "**Question:** Why did the narrator raise "
            "their voice?\n**Answer:** The accusation felt unfair\n**Reason:** x",
        ],
        "S_agency": [
            f"Question: Who shaped what happened to the narrator?\nAnswer: Score: {value}",
            f"Question: The narrator rated {value}; who shaped the outcome?\nAnswer: The narrator "
            "alone",
        ],
        "C_dpol": [
            "I think the narrator is disappointed.",
            "Question: <Insert question here>\nAnswer: <Insert answer here>",
        ],
        "W_belong": [
            "Question: Did the narrator feel at home among friends?\nAnswer: At home among friends",
            ("Question: How did the narrator", "length"),
        ],
        "N_redem": [
            "Question: What is a redemption sequence in psychology?\nAnswer: A bad event turning "
            "good",
            "Question: What did the narrator's loss turn into?\nAnswer: A new purpose in life",
        ],
        "J_div": [
            "Question: How does the narrator describe the mix of cultures around them?\nAnswer: As "
            "a strength",
            "Question: How does the narrator describe the mix of cultures around them "
            "today?\nAnswer: Warmly",
        ],
    }[code][j]


QA_DROPPED = {
    "duplicate": 9,
    "variable_code": 9,
    "answer_is_value": 8,
    "value_in_question": 8,
    "no_question": 3,
    "template_echo": 3,
    "answer_in_question": 8,
    "truncated": 8,
    "ungrounded": 3,
    "near_duplicate": 4,
}


def test_qa_build_keeps_and_drops_with_known_counts(tmp_path):
    report = build_qa(
        build_run(tmp_path, ScriptedSampler(qa_response), samples=2),
        CATALOGUE,
        TABLE,
        n_train=2,
        n_test=1,
    )
    assert report["generations"] == 88 and report["kept"] == 25 and report["dropped"] == QA_DROPPED
    assert {code: b["kept"] for code, b in report["by_variable"].items()} == {
        "B_disap": 9,
        "B_anger": 9,
        "S_agency": 0,
        "C_dpol": 0,
        "W_belong": 0,
        "N_redem": 3,
        "J_div": 4,
    }
    assert {d: (b["generations"], b["kept"]) for d, b in report["by_dimension"].items()} == {
        "emotional reactions": (42, 18),
        "narrative transformation": (22, 3),
        "collective psychology": (24, 4),
    }
    assert report["split"]["excluded"] == {"S_agency": 0, "C_dpol": 0, "W_belong": 0}
    train, test = load_stimuliqa(tmp_path / "train.jsonl"), load_stimuliqa(tmp_path / "test.jsonl")
    assert (len(train), len(test)) == (8, 4) and not {r.id for r in train} & {r.id for r in test}
    first = load_stimuliqa(tmp_path / "qa.jsonl")[0]
    stimuli = {s.id: s.text for s in load_labelled(TABLE, load_catalogue(CATALOGUE))}
    # the generator's Reason: line is kept (data.think_from = "reason" makes it SFT's think text)
    assert first == StimuliRecord(
        "ex01:B_disap#0",
        stimuli["ex01"],
        "How did the narrator feel when the plans fell through?",
        "Deeply let down",
        "B_disap",
        "emotional reactions",
        "specific emotions",
        reason="They had looked forward to the trip for months.",
    )
    assert json.loads((tmp_path / "qa.jsonl").read_text().splitlines()[0])["reason"] == (
        "They had looked forward to the trip for months."
    )
    # a generation without a Reason: line has no reason key at all (files as before)
    assert "reason" not in json.loads((tmp_path / "train.jsonl").read_text().splitlines()[-1])
    anger = [r for r in train + test if r.variable == "B_anger"][0]
    assert anger.question == "Why did the narrator raise their voice?" and anger.id.endswith("#1")
    dropped = [json.loads(line) for line in (tmp_path / "dropped.jsonl").read_text().splitlines()]
    assert dropped[0] == {
        "id": "ex01:B_disap#1",
        "variable": "B_disap",
        "reason": "duplicate",
        "question": first.question,
        "answer": "Deeply let down",
        "text": GOOD,
    }
    markdown = (tmp_path / "report.md").read_text()
    assert "| B_anger | emotional reactions | 18 | 9 |" in markdown
    assert "excluded with fewer than 3 kept" in markdown


def test_qa_resumes_after_an_interruption_without_regenerating(tmp_path):
    whole = tmp_path / "whole"
    build_qa(
        build_run(whole, ScriptedSampler(qa_response), samples=2),
        CATALOGUE,
        TABLE,
        n_train=2,
        n_test=1,
    )
    out = tmp_path / "resumed"
    # 44 prompts in rounds of 4: 2 rounds done
    with pytest.raises(RuntimeError, match="interrupted"):
        build_qa(
            build_run(out, ScriptedSampler(qa_response, fail_after=2), samples=2), CATALOGUE, TABLE
        )
    assert len((out / "generations.jsonl").read_text().splitlines()) == 8
    with (out / "generations.jsonl").open("a") as f:
        f.write('{"key": "ex0')  # a torn last line, as a crash mid-write leaves it
    again = ScriptedSampler(qa_response)
    build_qa(build_run(out, again, samples=2), CATALOGUE, TABLE, n_train=2, n_test=1)
    assert again.prompts == 36
    for name in ("qa.jsonl", "dropped.jsonl", "train.jsonl", "test.jsonl", "report.json"):
        assert (out / name).read_text() == (whole / name).read_text().replace(str(whole), str(out))
    # finished: a third run loads no model; an edited stimulus is generated again, alone
    build_qa(build_run(out, None, samples=2), CATALOGUE, TABLE, n_train=2, n_test=1)
    table = tmp_path / "t.csv"
    table.write_text(Path(TABLE).read_text().replace("at fifty", "at fifty-one"))
    edited = ScriptedSampler(qa_response)
    build_qa(build_run(out, edited, samples=2), CATALOGUE, table, n_train=2, n_test=1)
    assert edited.prompts == 3  # ex03 is coded on N_redem, S_agency and W_belong


def test_a_sigterm_stops_the_build_after_its_round_and_it_resumes(tmp_path):
    import os
    import signal

    class Signalling(ScriptedSampler):  # a real SIGTERM while the second round generates
        def generate(self, *args, **kwargs):
            if self.calls == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            return super().generate(*args, **kwargs)

    with pytest.raises(Preempted, match=r"preempted by SIGTERM after 8 of 44 prompts, all in "):
        build_qa(build_run(tmp_path, Signalling(qa_response), samples=2), CATALOGUE, TABLE)
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # given back
    assert len((tmp_path / "generations.jsonl").read_text().splitlines()) == 8
    again = ScriptedSampler(qa_response)
    build_qa(build_run(tmp_path, again, samples=2), CATALOGUE, TABLE)
    assert again.prompts == 36


def test_a_build_directory_refuses_other_settings_and_commands(tmp_path):
    build_qa(build_run(tmp_path, ScriptedSampler(qa_response)), CATALOGUE, TABLE)
    with pytest.raises(
        BuildError, match=r"generations made differently \(temperature: 0.7 -> 1.0\)"
    ):
        build_qa(
            build_run(tmp_path, None, settings={**SETTINGS, "temperature": 1.0}), CATALOGUE, TABLE
        )
    with pytest.raises(BuildError, match="holds a `psyrl build qa` run"):
        build_topics(build_run(tmp_path, None), CATALOGUE)
    fresh = ScriptedSampler(qa_response)
    build_qa(
        build_run(tmp_path, fresh, settings={**SETTINGS, "temperature": 1.0}),
        CATALOGUE,
        TABLE,
        overwrite=True,
    )
    assert fresh.prompts == 44
    # a start that failed before generating anything leaves no settings to keep
    failed = build_run(tmp_path / "failed", None)
    failed.make_sampler = lambda: (_ for _ in ()).throw(OSError("out of GPU memory"))
    with pytest.raises(OSError, match="out of GPU memory"):
        build_qa(failed, CATALOGUE, TABLE)
    build_qa(
        build_run(
            tmp_path / "failed",
            ScriptedSampler(qa_response),
            settings={**SETTINGS, "model": "other"},
        ),
        CATALOGUE,
        TABLE,
    )
    bad_topics = tmp_path / "topics.jsonl"
    bad_topics.write_text(
        '{"variable": "B_disap", "topic": "x"}\n["B_disap", "y"]\n'
        '{"variable": "Nope", "topic": "z"}\n'
    )
    with pytest.raises(
        DataError,
        match=r"topics.jsonl:2: expected a JSON object[^\n]*\n.*topics.jsonl:3: variable "
        r"'Nope' is not in the catalogue",
    ):
        build_comparison(build_run(tmp_path / "c", None), CATALOGUE, bad_topics)


# ---------------------------------------------------------------- topics, comparison, reasoning
def topics_response(prompt, j):
    if "a broken promise" not in prompt:
        return "- a new topic"
    lines = [
        "Here are related topics:",
        "1. A Broken Promise.",
        "2. **a lost wallet**",
        "3. a rainy wedding day",
        "4. " + "a very long line that is a sentence about many different topics at once"
        if j == 0
        else "- a lost wallet",
        "- a forgotten birthday",
    ]
    return "\n".join(lines)


def test_topics_expand_dedupe_and_cap(tmp_path):
    report = build_topics(
        build_run(tmp_path, ScriptedSampler(topics_response), samples=2), CATALOGUE, max_topics=7
    )
    rows = [json.loads(line) for line in (tmp_path / "topics.jsonl").read_text().splitlines()]
    disap = [(r["topic"], r["origin"]) for r in rows if r["variable"] == "B_disap"]
    seeds = load_catalogue(CATALOGUE)["B_disap"].topics
    assert disap == [(t, "seed") for t in seeds] + [
        (t, "generated") for t in ("a lost wallet", "a rainy wedding day")
    ]
    assert report["by_variable"]["B_disap"]["dropped"] == {
        "duplicate": 5,
        "header": 2,
        "over_cap": 2,
        "too_long": 1,
    }
    assert report["topics"]["J_div"] == {"seeds": 3, "generated": 1, "topics": 4}
    assert report["by_variable"]["J_div"]["dropped"] == {"duplicate": 1}


def comparison_response(prompt, j):
    topic = re.search(r"Generate a Stimuli based on \((.*?)\)", prompt)[1]
    code = re.search(r"psychological parameter (\w+) \(", prompt)[1]
    if code == "C_dpol":
        return f"Question: Why was I upset about {topic}?\nAnswer: Trust was broken"
    return (
        f"Sure.\n**Stimuli:** Last year I lived through {topic}, and I still think about it.\n"
        f"Question: What stayed with me after {topic}?\nAnswer: A lasting feeling\nReason: x"
    )


def test_comparison_sets_take_the_generated_stimulus(tmp_path):
    topics = tmp_path / "topics.jsonl"
    write_jsonl(
        topics,
        [{"variable": "B_disap", "topic": t} for t in ("a lost match", "a late train")]
        + [{"variable": "C_dpol", "topic": "a closed library"}],
    )
    report = build_comparison(
        build_run(tmp_path / "out", ScriptedSampler(comparison_response)),
        CATALOGUE,
        topics,
        n_train=1,
        n_test=1,
    )
    assert (report["kept"], report["dropped"]) == (2, {"no_stimulus": 1})
    train = load_stimuliqa(tmp_path / "out" / "train.jsonl")
    assert [(r.id, r.variable) for r in train] == [
        (f"B_disap:{prompt_sha('a lost match')[:10]}", "B_disap")
    ]
    assert load_stimuliqa(tmp_path / "out" / "qa.jsonl")[1].stimuli == (
        "Last year I lived through a late train, and I still think about it."
    )
    assert report["split"]["excluded"] == {"C_dpol": 0}
    # a topic added in the middle is the only prompt generated again (jobs are keyed by their topic)
    write_jsonl(
        topics,
        [{"variable": "B_disap", "topic": t} for t in ("a lost match", "a new one", "a late train")]
        + [{"variable": "C_dpol", "topic": "a closed library"}],
    )
    added = ScriptedSampler(comparison_response)
    build_comparison(build_run(tmp_path / "out", added), CATALOGUE, topics, n_train=1, n_test=1)
    assert added.prompts == 1
    # without --topics: the catalogue's seed topics, 24 of them
    seeded = ScriptedSampler(comparison_response)
    build_comparison(build_run(tmp_path / "seeds", seeded), CATALOGUE)
    assert seeded.prompts == 24


def test_comparison_dialogue_one_turn_and_two_turn_send_these_messages(tmp_path):
    topics = tmp_path / "topics.jsonl"
    write_jsonl(topics, [{"variable": "B_disap", "topic": "a lost match"}])
    dataset, comparison = prompts.comparison_turns(
        load_catalogue(CATALOGUE)["B_disap"], "a lost match"
    )
    assert dataset.startswith(
        "You are an AI assistant that generates one question\u2013answer "
        "pair based on a short Stimuli. The question should assess the "
        "human-labeled psychological parameter B_disap (disappointment "
    )
    assert comparison == (
        "Generate a Stimuli based on (a lost match), then generate the Q&A pair for psychological "
        "parameter B_disap (disappointment measured against what the narrator expected) in the "
        "same format as above."
    )
    reply = "Understood. Please share the Stimuli."  # the generator's turn-1 reply (scripted)

    class Recording(ScriptedSampler):  # the chat each prompt renders, and n per call
        def generate(self, prompt_token_ids, n, *args):
            self.sent = getattr(self, "sent", []) + [
                (TOKENIZER.decode(ids), n) for ids in prompt_token_ids
            ]
            return super().generate(prompt_token_ids, n, *args)

    def respond(prompt, j):
        return comparison_response(prompt, j) if "Generate a Stimuli" in prompt else reply

    def chat(*turns):
        messages = [
            {"role": ("user", "assistant")[i % 2], "content": t} for i, t in enumerate(turns)
        ]
        return TOKENIZER.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)

    # one-turn (the default): both prompts in one user turn, the dataset prompt first
    one = Recording(respond)
    build_comparison(build_run(tmp_path / "one", one, samples=2), CATALOGUE, topics)
    assert one.sent == [(chat(f"{dataset}\n\n{comparison}"), 2)]
    # two-turn: the dataset prompt alone, one reply; then the dialogue with the comparison prompt
    two = Recording(respond)
    report = build_comparison(
        build_run(tmp_path / "two", two, samples=2),
        CATALOGUE,
        topics,
        dialogue="two-turn",
        n_train=1,
        n_test=0,
    )
    assert two.sent == [(chat(dataset), 1), (chat(dataset, reply, comparison), 2)]
    key = f"B_disap:{prompt_sha('a lost match')[:10]}"
    logged = [json.loads(line) for line in (tmp_path / "two" / "generations.jsonl").open()]
    assert [(row["key"], len(row["outputs"])) for row in logged] == [(f"{key}/turn-1", 1), (key, 2)]
    # the pairs come from turn 2 only, with the stimulus and the Reason: line it wrote
    assert (
        report["generations"] == 2
        and json.loads((tmp_path / "two" / "build.json").read_text())["inputs"]["dialogue"]
        == "two-turn"
    )
    first = load_stimuliqa(tmp_path / "two" / "qa.jsonl")[0]
    assert (first.id, first.reason) == (f"{key}#0", "x")
    assert first.stimuli == "Last year I lived through a lost match, and I still think about it."
    # finished: a second run re-reports from the log, loading no model
    build_comparison(
        build_run(tmp_path / "two", None, samples=2),
        CATALOGUE,
        topics,
        dialogue="two-turn",
        n_train=1,
        n_test=0,
    )


REASONING = {
    0: "Short and plain.",
    1: "The answer is joy 1.",
    2: "<answer>joy 2</answer>",
    3: "One two three four five six words.",
    4: "Tiny.",
    5: ("cut", "length"),
    6: "<think>Brief thought.</think>",
}


def test_reasoning_keeps_short_and_long_until_the_quotas(tmp_path):
    records = [
        StimuliRecord(
            f"r{i:02d}",
            f"Story number {i}.",
            "How did I feel?",
            f"joy {i}",
            "B_disap",
            "emotional reactions",
            "specific emotions",
            "old",
        )
        for i in range(20)
    ]
    write_jsonl(tmp_path / "data.jsonl", records)

    def respond(prompt, j):
        i = int(re.search(r"Story number (\d+)", prompt)[1])
        return REASONING.get(i % 7, "A long rationale that goes on for well over five words.")

    sampler = ScriptedSampler(respond)
    report = build_reasoning(
        build_run(tmp_path / "out", sampler),
        tmp_path / "data.jsonl",
        n_short=3,
        n_long=2,
        short_words=5,
    )
    kept = load_stimuliqa(tmp_path / "out" / "reasoning.jsonl")
    assert (report["short"], report["long"]) == (3, 2) and len(kept) == 5
    assert report["records_visited"] == sampler.prompts < 20  # stopped once both quotas were met
    assert all(r.reasoning not in ("old", "") for r in kept)
    assert {r.reasoning for r in kept} <= {
        "Short and plain.",
        "Tiny.",
        "Brief thought.",
        "One two three four five six words.",
        "A long rationale that goes on for well over five words.",
    }
    assert (
        sft_target(kept[0], "cot")
        == f"<think>{kept[0].reasoning}</think><answer>{kept[0].answer}</answer>"
    )
    dropped = report["dropped"]
    assert set(dropped) <= {
        "states_answer",
        "answer_tag",
        "truncated",
        "surplus_short",
        "surplus_long",
    }
    assert report["kept"] + sum(dropped.values()) == report["generations"] == sampler.prompts


# --------------------------------------------------------- the command line, on a tiny random model
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    out = tmp_path_factory.mktemp("model") / "hf"
    cfg = ModelConfig(
        hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1, intermediate_size=64
    )
    load_model(cfg, TOKENIZER, seed=0).save_pretrained(out)
    TOKENIZER.save_pretrained(out)
    return out


def test_cli_refuses_bad_input_before_loading_a_model(tmp_path):
    bad = tmp_path / "c.toml"
    bad.write_text(Path(CATALOGUE).read_text().replace("range = [0, 2]", "range = [2, 0]", 1))
    result = CliRunner().invoke(
        main,
        [
            "build",
            "qa",
            "--catalogue",
            str(bad),
            "--table",
            TABLE,
            "--model",
            str(tmp_path / "no-model"),
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 1 and "no such model directory" in result.output
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text("{}")
    result = CliRunner().invoke(
        main,
        [
            "build",
            "qa",
            "--catalogue",
            str(bad),
            "--table",
            TABLE,
            "--model",
            str(tmp_path / "m"),
            "--tokenizer",
            "tiny",
            "--out",
            str(tmp_path / "out"),
        ],
    )
    line = Path(CATALOGUE).read_text().splitlines().index("range = [0, 2]") + 1
    assert result.exit_code == 1
    assert f"{bad}:{line}: variable 3: range must be [lowest, highest]" in result.output
    assert not (tmp_path / "out").exists()
    result = CliRunner().invoke(
        main,
        [
            "build",
            "qa",
            "--catalogue",
            CATALOGUE,
            "--table",
            TABLE,
            "--model",
            "m",
            "--out",
            "o",
            "--top-p",
            "0",
        ],
    )
    assert result.exit_code == 2 and "--top-p must be in (0, 1]" in result.output
    result = CliRunner().invoke(
        main,
        [
            "build",
            "qa",
            "--catalogue",
            CATALOGUE,
            "--table",
            TABLE,
            "--model",
            "m",
            "--out",
            "o",
            "--temperature",
            "-1",
            "--max-new-tokens",
            "0",
            "--samples",
            "0",
            "--batch",
            "0",
            "--tensor-parallel",
            "0",
            "--gpu-memory-utilization",
            "1.5",
            # any seed goes: run.seed's >= 0 is not the tools'
            "--seed",
            "-1",
        ],
    )
    assert (
        result.exit_code == 2
        and (
            "--temperature must be >= 0; --max-new-tokens must be >= 1; --samples must be "
            ">= 1; --batch must be >= 1; --tensor-parallel must be >= 1; "
            "--gpu-memory-utilization must be in (0, 1]"
        )
        in result.output
    )


def test_generation_options_are_the_config_keys_with_the_builders_defaults():
    options = {p.name: p for p in build_group.commands["topics"].params}
    defaults = {
        name: options[name].default
        for name in (
            "temperature",
            "top_p",
            "max_new_tokens",
            "samples",
            "seed",
            "batch",
            "dtype",
            "engine",
            "progress",
        )
    }
    assert defaults == {
        "temperature": 0.7,
        "top_p": 0.95,
        "max_new_tokens": 1024,
        "samples": 4,
        "seed": 0,
        "batch": 16,
        "dtype": "auto",
        "engine": "torch",
        "progress": True,
    }
    assert {p.name: p.default for p in build_group.commands["qa"].params}["max_new_tokens"] == 512
    # the help is the option's own, written beside the config key it stands for
    assert options["tensor_parallel"].help == (
        "vllm: ranks that hold one engine together (consecutive ranks; A.3: 2 on 4 GPUs). Must "
        "divide the ranks."
    )
    assert options["dtype"].help.startswith(
        "Compute dtype (A.3/A.4: bf16). bfloat16: autocast with torch"
    )
    # the tools add auto
    assert tuple(options["dtype"].type.choices) == ("auto", "float32", "bfloat16")
    assert options["temperature"].help == "Sampling temperature. 0 = greedy."


@pytest.mark.slow
def test_cli_plumbing_on_a_tiny_model_one_process_and_two_ranks(tiny_model, tmp_path):
    args = [
        "build",
        "qa",
        "--catalogue",
        CATALOGUE,
        "--table",
        TABLE,
        "--model",
        str(tiny_model),
        "--max-new-tokens",
        "12",
        "--samples",
        "2",
        "--train",
        "1",
        "--test",
        "1",
        "--no-progress",
    ]
    one = subprocess.run(
        [sys.executable, "-m", "psyrl", *args, "--out", str(tmp_path / "one")],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert one.returncode == 0 and "88 generations" in one.stdout, one.stderr
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            "-m",
            "psyrl",
            *args,
            "--out",
            str(tmp_path / "two"),
            "--batch",
            "3",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    # rank 0 reports
    assert two.returncode == 0 and two.stdout.count("88 generations") == 1, two.stderr
    rows = lambda d: sorted((d / "generations.jsonl").read_text().splitlines())
    # seeds per prompt: ranks and batch change nothing
    assert rows(tmp_path / "one") == rows(tmp_path / "two")
    report = json.loads((tmp_path / "one" / "report.json").read_text())
    assert report["generations"] == 88 and report["kept"] + sum(report["dropped"].values()) == 88
    reasoning = subprocess.run(
        [
            sys.executable,
            "-m",
            "psyrl",
            "build",
            "reasoning",
            "--data",
            "data/demo/test.jsonl",
            "--model",
            str(tiny_model),
            "--max-new-tokens",
            "6",
            "--short",
            "1",
            "--long",
            "1",
            "--out",
            str(tmp_path / "r"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert reasoning.returncode == 0, reasoning.stderr
    assert "records visited (seeded order)" in reasoning.stdout
    # what the builder keeps, evaluate.py takes as it is (the scripted build: the tiny model keeps
    # nothing)
    build_qa(
        build_run(tmp_path / "scripted", ScriptedSampler(qa_response)),
        CATALOGUE,
        TABLE,
        n_train=1,
        n_test=1,
    )
    evaluated = subprocess.run(
        [
            sys.executable,
            "evaluate.py",
            "--model",
            str(tiny_model),
            "--benchmarks",
            str(tmp_path / "scripted" / "test.jsonl"),
            "--max-new-tokens",
            "4",
            "--out",
            str(tmp_path / "eval"),
            "--no-progress",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert evaluated.returncode == 0, evaluated.stderr
    results = json.loads((tmp_path / "eval" / "results.json").read_text())["results"]
    assert [(b["count"], sorted(b["tasks"])) for b in results.values()] == [
        # sample 0 only: B_disap and J_div kept, 1 test pair each
        (2, ["national theme", "specific emotions"])
    ]


def test_cli_dialogue_option_takes_one_turn_or_two_turn():
    result = CliRunner().invoke(
        main,
        [
            "build",
            "comparison",
            "--catalogue",
            CATALOGUE,
            "--model",
            "m",
            "--out",
            "o",
            "--dialogue",
            "three-turn",
        ],
    )
    assert result.exit_code == 2
    assert "'three-turn' is not one of 'one-turn', 'two-turn'" in result.output
    help_text = " ".join(CliRunner().invoke(main, ["build", "comparison", "--help"]).output.split())
    assert "--dialogue [one-turn|two-turn]" in help_text and "[default: one-turn]" in help_text
