"""The LLM judge (psyrl.signals.judge) against a stub chat-completions server on 127.0.0.1 that
fails on purpose: a hang past the request timeout, 500s then an answer, a body that is not JSON,
scores out of range (1.7, -0.2), no score line, prose after it, and a 401 echoing the key. Each
pair's prediction names what the stub does with it (its first word). Checked: the scores, how many
requests each pair took, the F1 fallbacks (value and count), `on_failure = "stop"`'s message (the
URL, not the key), the step timeout, the cache (read back, never asked twice, fallbacks not
kept, keyed by the rubric too), and that the key reaches the server and nothing else."""

from __future__ import annotations

import json
import re
import shutil
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
from http_stub import serve_posts

from psyrl.core.config import JudgeConfig
from psyrl.rl.accuracy import Pair, token_f1
from psyrl.signals.judge import (
    JudgeError,
    JudgeSignal,
    content_key,
    item_message,
    parse_score,
    read_rubric,
)

KEY = "sk-judge-SENTINEL-7c41d9"  # the value no file or message may hold
KEY_ENV = "PSYRL_TEST_JUDGE_KEY"
TIMEOUT = 0.2  # judge.timeout_s; a hang lasts longer
RETRIES = 2  # three attempts in all
GOLD = "very angry"


class Stub:
    """A chat-completions server in a thread. A request's behaviour is the first word of the
    prediction in its prompt (BEHAVIOUR); every request is logged as (that word, attempt,
    Authorization header)."""

    def __init__(self):
        self.log: list[tuple[str, int, str | None]] = []
        self.lock, self.release = threading.Lock(), threading.Event()
        self.server, self.url = serve_posts(self.handle)

    def handle(self, handler, body):
        assert handler.path == "/v1/chat/completions" and body["model"] == "stub-judge"
        assert body["temperature"] == 0.0 and body["max_tokens"] == 64
        prompt = body["messages"][-1]["content"]
        token = re.search(r"SCORE\[([0-9a-f]{16})\]: x$", prompt).group(1)
        word = prompt.split(f"<prediction {token}>\n")[1].split()[0]
        with self.lock:
            attempt = 1 + sum(1 for entry in self.log if entry[0] == word)
            self.log.append((word, attempt, handler.headers.get("Authorization")))
        what = BEHAVIOUR[word](attempt)
        if what == "hang":
            time.sleep(TIMEOUT + 0.3)  # the client has given up
            return None
        if what == "stall":  # past the step timeout, until the test ends
            self.release.wait(30)
            return None
        if what == "500":
            return reply(handler, 500, {"error": "overloaded"})
        if what == "401":  # a debugging proxy echoing the header
            return reply(handler, 401, {"error": f"bad key {handler.headers['Authorization']}"})
        if what == "garbled":
            return reply(handler, 200, b'{"choices": [{"message": ')
        # the BEHAVIOUR table writes "SCORE:"; a judge writes the request's token in it
        return reply(handler, 200, completion(what.replace("SCORE:", f"SCORE[{token}]:")))

    def requests(self) -> Counter:
        return Counter(entry[0] for entry in self.log)

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


# what the stub answers to the attempt-th request about a prediction starting with that word
BEHAVIOUR = {
    "good": lambda attempt: "The same state, agent and direction.\nSCORE: 0.75",
    "exact": lambda attempt: "SCORE: 1",
    "wrong": lambda attempt: "Opposite state.\nSCORE: 0",
    "flaky": lambda attempt: "500" if attempt < 3 else "Close.\nSCORE: 0.25",
    "once": lambda attempt: "SCORE: 1.7" if attempt == 1 else "SCORE: 0.5",
    "hang": lambda attempt: "hang",
    "stall": lambda attempt: "stall",
    "garbled": lambda attempt: "garbled",
    "high": lambda attempt: "Very good.\nSCORE: 1.7",
    "low": lambda attempt: "Very bad.\nSCORE: -0.2",
    "noscore": lambda attempt: "The prediction names the same emotion.",
    "trailing": lambda attempt: "SCORE: 0.5\nI hope this helps.",
    "echo": lambda attempt: "401",
}


def completion(text: str) -> dict:
    return {
        "id": "x",
        "object": "chat.completion",
        "model": "stub-judge",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
    }


def reply(handler, status: int, payload):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def pair(word: str) -> Pair:
    # the prediction's words after the first are "very calm": F1 with "very angry" is
    # 2 * |{very}| / (|{word, very, calm}| + |{very, angry}|) = 2 / 5 = 0.4
    return Pair(GOLD, f"{word} very calm", "Tom's team lost the final.", "How does Tom feel?")


@pytest.fixture
def stub(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    server = Stub()
    yield server
    server.close()


def judge(stub: Stub, cache_dir=None, rank=0, **cfg) -> JudgeSignal:
    settings = dict(
        base_url=stub.url,
        model="stub-judge",
        api_key_env=KEY_ENV,
        max_tokens=64,
        timeout_s=TIMEOUT,
        step_timeout_s=10.0,
        concurrency=4,
        retries=RETRIES,
        on_failure="f1",
    )
    return JudgeSignal(JudgeConfig(**{**settings, **cfg}), cache_dir, rank, retry_wait=0.01)


def files_hold_no_key(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            assert KEY not in path.read_text(encoding="utf-8", errors="replace"), path


# ------------------------------------------------------------------------------------ parse, prompt
T = "00ff00ff00ff00ff"  # a request's token


@pytest.mark.parametrize(
    "text, score",
    [
        (f"SCORE[{T}]: 0.75", 0.75),
        (f"Same state.\nSCORE[{T}]: 1", 1.0),
        (f"reasoning\n\nSCORE[{T}]:0\n\n", 0.0),
        (f"  SCORE[{T}]: .5  ", 0.5),
        (f"SCORE[{T}]: 1.0", 1.0),
    ],
)
def test_a_score_line_is_read(text, score):
    assert parse_score(text, T) == (T, score)
    assert parse_score(text, {T, "1" * 16}) == (T, score)  # one of the call's tokens


@pytest.mark.parametrize(
    "text, problem",
    [
        (f"SCORE[{T}]: 1.7", "outside [0, 1]"),
        (f"SCORE[{T}]: -0.2", "outside [0, 1]"),
        (f"SCORE[{T}]: 0.5\nthanks", "last line"),
        ("The answer is right.", "last line"),
        ("", "last line"),
        ("SCORE: 0.5", "last line"),  # the earlier form, which an answer can write
        ("SCORE[1111111111111111]: 1", "names token 1111111111111111, not the request's"),
        (f"score[{T}]: 0.5", "last line"),  # the form is exact
        (f"**SCORE[{T}]: 0.5**", "last line"),
        (f"SCORE[{T}]: 0.5 out of 1", "last line"),
        (f"SCORE[{T}]: nan", "last line"),
        (f"SCORE[{T}]: 3/4", "last line"),
    ],
)
def test_anything_else_is_refused(text, problem):
    with pytest.raises(ValueError, match=re.escape(problem)):
        parse_score(text, T)


def test_the_item_is_tagged_data_after_the_shipped_rubric():
    rubric = read_rubric("")
    for aspect in ("Appraisal", "Agent", "Direction", "collective psychology", "SCORE[5e0c...]"):
        assert aspect in rubric
    sneaky = Pair("proud", "{gold}", "", "Who is {prediction}?")  # never expanded
    message = item_message(sneaky, T)
    assert f"<gold {T}>\nproud\n</gold {T}>" in message
    assert f"<prediction {T}>\n{{gold}}\n</prediction {T}>" in message
    assert f"<question {T}>\nWho is {{prediction}}?\n</question {T}>" in message
    assert f"<stimulus {T}>\n(not given)\n</stimulus {T}>" in message
    assert message.endswith(f"\nSCORE[{T}]: x")


# ----------------------------------------------------------------------------- faults and fallback
def test_faults_are_retried_then_fall_back_to_f1(stub, tmp_path):
    words = ["good", "exact", "wrong", "flaky"]  # scored, one after retries
    # never scored: a hang or a broken body after every retry (F1 stands in); a refused answer
    # (1.7, -0.2, no score line, prose after it) at once, since the same temperature-0 request
    # gets the same, and scored 0: the answer graded can make the judge reply so
    failing = ["hang", "garbled", "high", "low", "noscore", "trailing", "once"]
    signal = judge(stub, tmp_path / "cache")
    pairs = [pair(w) for w in words + failing]
    scores = signal(pairs)
    assert scores.dtype == torch.float64 and scores.shape == (11,)
    assert scores[:4].tolist() == [0.75, 1.0, 0.0, 0.25]
    assert scores[4:6].tolist() == [0.4] * 2  # the paper's F1 (see pair())
    assert torch.equal(scores[4:6], token_f1(pairs[4:6]))
    assert scores[6:].tolist() == [0.0] * 5
    assert signal.fallbacks == 7 and signal.asked == 11 and signal.refused == 5
    assert signal.fallback_mask.tolist() == [False] * 4 + [True] * 7
    assert signal.refused_mask.tolist() == [False] * 6 + [True] * 5
    attempts = stub.requests()
    assert {w: attempts[w] for w in words} == {
        "good": 1,
        "exact": 1,
        "wrong": 1,
        "flaky": 3,  # two 500s, then the score
    }
    retried = {"hang": RETRIES + 1, "garbled": RETRIES + 1}
    assert {w: attempts[w] for w in failing} == {w: retried.get(w, 1) for w in failing}
    assert signal.last_error.startswith(stub.url + "/chat/completions: ")
    # the key went to the server, in the header, and nowhere else
    assert {entry[2] for entry in stub.log} == {f"Bearer {KEY}"}
    files_hold_no_key(tmp_path)
    records = [
        json.loads(x) for x in (tmp_path / "cache" / "rank-0.jsonl").read_text().splitlines()
    ]
    assert sorted(r["score"] for r in records) == [0.0, 0.25, 0.75, 1.0]  # no fallback kept
    assert all(set(r) == {"key", "score"} for r in records)


def test_on_failure_stop_names_the_endpoint_and_the_error_not_the_key(stub):
    signal = judge(stub, on_failure="stop")
    with pytest.raises(JudgeError) as raised:
        signal([pair("good"), pair("noscore")])
    message = str(raised.value)
    assert f"{stub.url}/chat/completions" in message
    assert (
        "answer refused (the last line is not 'SCORE[<the request's token>]: <number>')" in message
    )
    assert "(a temperature-0 request: not asked again unchanged)" in message
    assert stub.requests()["noscore"] == 1
    with pytest.raises(JudgeError) as raised:  # a 401 that echoes the header: masked, not retried
        signal([pair("echo")])
    assert "HTTP 401" in str(raised.value) and "***" in str(raised.value)
    assert KEY not in str(raised.value)
    assert stub.requests()["echo"] == 1


def test_a_401_echoing_the_key_stops_under_f1_too_without_it(stub):
    # a refused key fails every request alike: no fallback, the run stops (the key masked)
    with pytest.raises(JudgeError) as raised:
        judge(stub)([pair("echo")])
    assert "HTTP 401" in str(raised.value) and "***" in str(raised.value)
    assert KEY not in str(raised.value) and stub.requests()["echo"] == 1


def test_the_step_timeout_ends_the_call_and_the_rest_falls_back(stub):
    signal = judge(stub, timeout_s=30.0, step_timeout_s=0.3)
    t0 = time.monotonic()
    scores = signal([pair("good"), pair("stall"), pair("exact")])
    elapsed = time.monotonic() - t0
    assert 0.3 <= elapsed < 2.0  # not the 30 s request timeout
    assert scores.tolist() == [0.75, 0.4, 1.0] and signal.fallbacks == 1
    assert "1 of 3 requests unanswered after judge.step_timeout_s = 0.3 s" in signal.last_error
    stop = judge(stub, timeout_s=30.0, step_timeout_s=0.3, on_failure="stop")
    with pytest.raises(JudgeError, match="1 of 1 requests unanswered") as raised:
        stop([pair("stall")])
    assert stub.url in str(raised.value)


def test_empty_input(stub):
    signal = judge(stub)
    assert signal([]).shape == (0,) and signal.fallbacks == 0 and stub.log == []


# ------------------------------------------------------------------------------------------ cache
def test_the_cache_answers_a_second_call_and_a_new_signal(stub, tmp_path):
    cache = tmp_path / "judge"
    pairs = [pair("good"), pair("flaky"), pair("noscore"), pair("good")]  # a duplicate
    first = judge(stub, cache)(pairs)
    assert first.tolist() == [0.75, 0.25, 0.0, 0.75]  # a reply without a score line: 0
    assert stub.requests() == {"good": 1, "flaky": 3, "noscore": 1}  # the duplicate asked once
    signal = judge(stub, cache)  # a resumed run: reads rank-0.jsonl
    assert len(signal.cache) == 2
    n = len(stub.log)
    assert signal(pairs[:2]).tolist() == [0.75, 0.25]
    assert len(stub.log) == n and signal.asked == 0  # no request at all
    # a fallback is not cached: the judge is asked again (and may answer this time)
    assert signal(pairs).tolist() == [0.75, 0.25, 0.0, 0.75]
    assert stub.requests()["noscore"] == 2 and signal.asked == 1
    # another rank reads rank 0's file and writes its own
    other = judge(stub, cache, rank=1)
    assert other([pair("good"), pair("exact")]).tolist() == [0.75, 1.0]
    assert stub.requests()["good"] == 1
    assert sorted(p.name for p in cache.iterdir()) == ["rank-0.jsonl", "rank-1.jsonl"]
    assert len((cache / "rank-1.jsonl").read_text().splitlines()) == 1
    files_hold_no_key(tmp_path)


def test_the_cache_key_holds_the_rubric_and_the_model(stub, tmp_path):
    shipped = read_rubric("")
    p = pair("good")
    assert content_key("m", shipped, p) != content_key("m", shipped + " ", p)
    assert content_key("m", shipped, p) != content_key("n", shipped, p)
    for other in (Pair("x", "y z"), Pair("x y", "z")):  # field boundaries count
        assert content_key("m", shipped, Pair("x", "y", "z")) != content_key("m", shipped, other)
    cache = tmp_path / "judge"
    judge(stub, cache)([p])
    rubric = tmp_path / "rubric.md"
    rubric.write_text(shipped.replace("You grade one answer", "You grade an answer"))
    again = judge(stub, cache, rubric=str(rubric))
    assert again([p]).tolist() == [0.75] and again.asked == 1
    assert stub.requests()["good"] == 2  # a new rubric asks again


def test_a_cut_last_line_is_dropped_and_a_bad_line_named(stub, tmp_path):
    cache = tmp_path / "judge"
    judge(stub, cache)([pair("good")])
    own = cache / "rank-0.jsonl"
    with own.open("a") as f:
        f.write('{"key": "ab')  # a crash mid-write
    signal = judge(stub, cache)
    assert len(signal.cache) == 1 and own.read_text().endswith("}\n")  # cut off
    signal([pair("exact")])
    assert [json.loads(x)["score"] for x in own.read_text().splitlines()] == [0.75, 1.0]
    (cache / "rank-3.jsonl").write_text('{"key": "00", "score": 0.5}\n{"key": "ff"}\n')
    with pytest.raises(JudgeError, match=r"rank-3.jsonl:1: not a judge cache record"):
        judge(stub, cache)


# ----------------------------------------------------------------------------------------- config
def test_unusable_settings_are_refused_at_once(stub, tmp_path, monkeypatch):
    with pytest.raises(JudgeError, match="needs judge.model"):
        judge(stub, model="")
    with pytest.raises(JudgeError, match="judge.base_url: must be an http"):
        judge(stub, base_url="localhost:8000/v1")
    rubric = tmp_path / "rubric.md"
    rubric.write_text("Score {prediction} against {gold} please.")  # the earlier form
    with pytest.raises(
        JudgeError, match=r"holds \{gold\}, \{prediction\}; a rubric is the judge's"
    ):
        judge(stub, rubric=str(rubric))
    rubric.write_text(" \n")
    with pytest.raises(JudgeError, match="the file is empty"):
        judge(stub, rubric=str(rubric))
    with pytest.raises(JudgeError, match="cannot read it"):
        judge(stub, rubric=str(tmp_path / "missing.md"))
    monkeypatch.setenv(KEY_ENV, "sk-bad\x07key")
    with pytest.raises(JudgeError, match="control characters") as raised:
        judge(stub)
    assert "sk-bad" not in str(raised.value)


def test_a_cache_directory_removed_since_is_made_again(stub, tmp_path):
    # `--overwrite` deletes the run directory after the signal is built: the next call still keeps
    # its scores
    cache = tmp_path / "run" / "judge_cache"
    signal = judge(stub, cache)
    shutil.rmtree(tmp_path / "run")
    assert signal([pair("good")]).tolist() == [0.75]
    assert (cache / "rank-0.jsonl").read_text().count("\n") == 1
