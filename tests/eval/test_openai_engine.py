"""`evaluate.py --engine openai` against a real HTTP server on 127.0.0.1 (a stub in this file that
answers like a chat-completions endpoint and fails on purpose: 429 with Retry-After, 500, malformed
JSON, a hang past the request timeout, a 4xx): every item is scored exactly once, a run killed or
failed half-way resumes by requesting only the items it did not record, the API key is sent but
never written or printed, and bad input is refused with one message."""

import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from http_stub import serve_posts

from psyrl.cli.evaluate import evaluate as evaluate_command
from psyrl.eval.benchmarks import item_seed, resolve_sources, select_items

KEY = "sk-test-4f1c9e0b7a2d"  # the value no file or message may hold
BENCHMARK = "data/demo/mc.jsonl"
IDS = [
    r.id for s in resolve_sources([BENCHMARK], ".") for r in select_items(s.records, 2, "all", 0)
]
SEED_TO_ID = {item_seed(0, i): i for i in IDS}
FIELDS = {
    "id",
    "benchmark",
    "task",
    "index",
    "prompt",
    "response",
    "extracted",
    "f1",
    "format",
    "tokens",
    "finish",
    "mean_logprob",
    "option_f1",
    "choice",
    "correct",
}
# what the stub does with the first attempt of an item, by its seed mod 5; later attempts answer
FIRST_ATTEMPT = {0: "429", 1: "500", 2: "malformed", 3: "hang", 4: "ok"}
TIMEOUT = 0.5  # --request-timeout; a hang lasts longer
RETRY_AFTER = 0.3


class Stub:
    """A chat-completions server in a thread. `plan(seed, attempt, answered)` names what a request
    gets ("ok", "429", "500", "malformed", "hang", "hang_until_released", "400", "401", "500_long");
    every request is logged as (seed, attempt, what, time, Authorization header)."""

    def __init__(self, plan):
        self.plan, self.log, self.answered = plan, [], Counter()
        self.lock, self.release = threading.Lock(), threading.Event()
        self.server, self.url = serve_posts(self.handle)

    def handle(self, handler, body):
        seed = body["seed"]
        with self.lock:
            attempt = 1 + sum(1 for entry in self.log if entry[0] == seed)
            what = self.plan(seed, attempt, sum(self.answered.values()))
            if what == "ok":
                self.answered[seed] += 1
            self.log.append(
                (seed, attempt, what, time.monotonic(), handler.headers.get("Authorization"))
            )
        if what == "ok":
            return reply(handler, 200, completion(body))
        if what == "429":
            return reply(handler, 429, {"error": "slow down"}, {"Retry-After": str(RETRY_AFTER)})
        if what == "500":
            return reply(handler, 500, {"error": "overloaded"})
        if what == "500_long":
            return reply(handler, 500, {"error": "x" * 189 + "AFTER-200" + "y" * 100})
        if what == "400":
            return reply(handler, 400, {"error": {"message": "this model does not exist"}})
        if what == "redirect":  # a misconfigured proxy: the key must not follow it
            return reply(
                handler,
                307,
                {"error": "moved"},
                {"Location": "http://evil.example/v1/chat/completions"},
            )
        if what == "401_long":  # the key straddles the 200-character cut
            return reply(handler, 401, {"error": "x" * 180 + handler.headers["Authorization"]})
        if what == "401":  # echoes the header, as a debugging proxy might
            return reply(handler, 401, {"error": f"bad key {handler.headers['Authorization']}"})
        if what == "malformed":
            return reply(handler, 200, b'{"choices": [{"message": ')
        if what == "hang":
            time.sleep(TIMEOUT + 0.3)  # the client has given up: nothing more is sent
            return
        if what == "hang_until_released":
            self.release.wait(60)
            return
        raise AssertionError(what)

    def attempts(self) -> Counter:
        return Counter(SEED_TO_ID[entry[0]] for entry in self.log)

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


def completion(body: dict) -> dict:
    """A deterministic answer from the prompt: an option of the question when there is one."""
    content = body["messages"][-1]["content"]
    digest = int(hashlib.sha256(content.encode()).hexdigest(), 16)
    words = content.split("Question:")[1].split()
    text = f"<think>the cue {digest % 97}</think><answer>{words[digest % len(words)]}</answer>"
    return {
        "id": "x",
        "object": "chat.completion",
        "model": body["model"],
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {
            "prompt_tokens": 10,
            "completion_tokens": len(text.split()),
            "total_tokens": 10 + len(text.split()),
        },
    }


def reply(handler, status: int, payload, headers=None):
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    handler.send_response(status)
    for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


def faults(seed, attempt, answered):
    return FIRST_ATTEMPT[seed % 5] if attempt == 1 else "ok"


def clean(seed, attempt, answered):
    return "ok"


@pytest.fixture
def stub(request):
    servers = []

    def start(plan):
        servers.append(Stub(plan))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def args(url: str, out: Path, *extra) -> list[str]:
    return [
        "--engine",
        "openai",
        "--base-url",
        url,
        "--api-model",
        "stub-model",
        "--benchmarks",
        BENCHMARK,
        "--limit",
        "2",
        "--out",
        str(out),
        "--concurrency",
        "4",
        "--request-timeout",
        str(TIMEOUT),
        "--retry-wait",
        "0.01",
        "--max-new-tokens",
        "32",
        "--no-progress",
        *extra,
    ]


def invoke(*argv, env=None):
    env = {"OPENAI_API_KEY": KEY, **(env or {})}
    return CliRunner().invoke(evaluate_command, list(argv), env=env)


def join_request_threads():
    for thread in threading.enumerate():
        if thread.name == "openai-request":
            thread.join(10)


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]


def assert_no_key_on_disk(root: Path, *printed: str):
    written = [p for p in root.rglob("*") if p.is_file()]
    assert written
    for path in written:
        assert KEY.encode() not in path.read_bytes(), path
    for text in printed:
        assert KEY not in text


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted run on a server that never fails: the predictions every other run must end
    with."""
    server = Stub(clean)
    out = tmp_path_factory.mktemp("reference") / "eval"
    try:
        result = invoke(*args(server.url, out))
    finally:
        server.close()
    assert result.exit_code == 0, result.output
    return rows(out)


def test_every_item_is_scored_once_through_every_fault(stub, tmp_path, reference):
    server = stub(faults)
    result = invoke(*args(server.url, tmp_path / "eval"))
    assert result.exit_code == 0, result.output
    got = rows(tmp_path / "eval")
    assert [r["id"] for r in got] == IDS  # each item once, in item order
    assert all(set(r) == FIELDS and r["finish"] == "stop" for r in got)
    assert got == reference  # the faults left no trace in what was scored
    # each item answered exactly once; a faulted first attempt was retried once, the rest not
    assert server.answered == Counter({item_seed(0, i): 1 for i in IDS})
    assert set(FIRST_ATTEMPT[s % 5] for s in SEED_TO_ID) == set(FIRST_ATTEMPT.values())
    assert server.attempts() == {i: 1 if item_seed(0, i) % 5 == 4 else 2 for i in IDS}
    # a 429's Retry-After is honoured (the backoff alone would be 5-10 ms)
    times = {(s, a): t for s, a, _, t, _ in server.log}
    for seed in (s for s in SEED_TO_ID if s % 5 == 0):
        assert times[seed, 2] - times[seed, 1] >= RETRY_AFTER
    # the key is sent, and lands nowhere
    assert {entry[4] for entry in server.log} == {f"Bearer {KEY}"}
    settings = json.loads((tmp_path / "eval" / "results.json").read_text())["settings"]
    assert settings["api_key_env"] == "OPENAI_API_KEY" and settings["engine"] == "openai"
    assert "engine `openai`" in (tmp_path / "eval" / "results.md").read_text()
    assert_no_key_on_disk(tmp_path, result.output)


def test_a_failed_run_resumes_with_only_the_missing_items(stub, tmp_path, reference):
    # five answers, then a 400 (a non-retryable status): the run stops at once with the message
    server = stub(lambda seed, attempt, answered: "ok" if answered < 5 else "400")
    out = tmp_path / "eval"
    failed = invoke(*args(server.url, out))
    assert failed.exit_code == 1 and "Traceback" not in failed.output
    assert f"{server.url}/chat/completions: HTTP 400: " in failed.output
    assert "this model does not exist" in failed.output
    kept = {r["id"] for r in rows(out)}
    assert len(kept) == 5 and server.answered.total() == 5  # every answer was recorded
    join_request_threads()  # in a process they end with it; here they would talk to the rerun
    server.plan = clean
    before = server.attempts()
    resumed = invoke(*args(server.url, out))
    assert resumed.exit_code == 0, resumed.output
    assert "5 already in" in resumed.output and f"{len(IDS) - 5} to request" in resumed.output
    requested = server.attempts() - before
    assert requested == Counter({i: 1 for i in IDS if i not in kept})
    assert rows(out) == reference
    assert_no_key_on_disk(tmp_path, failed.output, resumed.output)


def test_a_killed_run_resumes_with_only_the_missing_items(stub, tmp_path, reference):
    # three answers, then every request hangs: the process is killed with requests in flight
    server = stub(lambda seed, attempt, answered: "ok" if answered < 3 else "hang_until_released")
    out = tmp_path / "eval"
    command = [sys.executable, "evaluate.py", *args(server.url, out)]
    command[command.index("--request-timeout") + 1] = "60"
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "OPENAI_API_KEY": KEY},
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (
            (out / "predictions.jsonl").is_file()
            and len(rows(out)) == 3
            and sum(1 for e in server.log if e[2] == "hang_until_released") >= 2
        ):
            assert process.poll() is None, process.stdout.read().decode()[-2000:]
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
    finally:
        output = process.communicate(timeout=30)[0].decode()
    assert process.returncode == -signal.SIGKILL
    kept = {r["id"] for r in rows(out)}
    assert len(kept) == 3
    in_flight = {SEED_TO_ID[e[0]] for e in server.log if e[2] == "hang_until_released"}
    assert in_flight and not in_flight & kept
    server.release.set()
    server.plan = clean
    before = server.attempts()
    resumed = invoke(*args(server.url, out))
    assert resumed.exit_code == 0, resumed.output
    # the items in flight when it died are redone; the three recorded ones are not asked again
    assert server.attempts() - before == Counter({i: 1 for i in IDS if i not in kept})
    assert rows(out) == reference
    assert_no_key_on_disk(tmp_path, output, resumed.output)


def test_a_preempted_run_keeps_what_was_in_flight_and_resumes(stub, tmp_path, reference):
    def plan(seed, attempt, answered):
        if answered == 4:  # a scheduler's SIGTERM, delivered while requests are in flight
            os.kill(os.getpid(), signal.SIGTERM)
        return "ok"

    server = stub(plan)
    out = tmp_path / "eval"
    stopped = invoke(*args(server.url, out))
    assert stopped.exit_code == 75, stopped.output  # EXIT_PREEMPTED
    assert "preempted by SIGTERM" in stopped.output
    kept = {r["id"] for r in rows(out)}
    # no new request after the signal, and every answer in flight was recorded
    assert 5 <= len(kept) < len(IDS) and server.answered.total() == len(kept)
    server.plan = clean
    before = server.attempts()
    resumed = invoke(*args(server.url, out))
    assert resumed.exit_code == 0, resumed.output
    assert server.attempts() - before == Counter({i: 1 for i in IDS if i not in kept})
    assert rows(out) == reference


def test_the_last_retry_names_the_url_status_and_body(stub, tmp_path):
    server = stub(lambda seed, attempt, answered: "500_long")
    result = invoke(*args(server.url, tmp_path / "eval", "--retries", "2", "--concurrency", "1"))
    assert result.exit_code == 1 and "Traceback" not in result.output
    message = result.output
    assert f"{server.url}/chat/completions: HTTP 500: " in message
    assert "(after 3 attempts)" in message
    # the body's first 200 characters, then an ellipsis: '{"error": "' is 11 of them
    assert '"error": "' + "x" * 189 + "'…" in message and "AFTER-200" not in message
    assert server.attempts().most_common(1)[0][1] == 3


def test_a_4xx_fails_at_once_and_the_key_it_echoes_is_masked(stub, tmp_path):
    server = stub(lambda seed, attempt, answered: "401")
    result = invoke(*args(server.url, tmp_path / "eval", "--concurrency", "1"))
    assert result.exit_code == 1 and "HTTP 401" in result.output
    assert "bad key Bearer ***" in result.output
    assert len(server.log) == 1  # not retried
    assert_no_key_on_disk(tmp_path, result.output)


def test_no_key_sends_no_header(stub, tmp_path, monkeypatch):
    server = stub(clean)
    monkeypatch.delenv("MY_KEY", raising=False)
    result = invoke(*args(server.url, tmp_path / "eval", "--api-key-env", "MY_KEY"))
    assert result.exit_code == 0, result.output
    assert "no API key from $MY_KEY" in result.output
    assert {entry[4] for entry in server.log} == {None}


def test_a_resume_keeps_the_endpoint_and_model(stub, tmp_path):
    server = stub(clean)
    out = tmp_path / "eval"
    assert invoke(*args(server.url, out)).exit_code == 0
    other = invoke(*[a if a != "stub-model" else "other-model" for a in args(server.url, out)])
    assert other.exit_code == 1 and "model: 'stub-model' -> 'other-model'" in other.output
    moved = invoke(*args(server.url.replace("127.0.0.1", "localhost"), out))
    assert moved.exit_code == 1 and "base_url: " in moved.output


def unused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "changes,env,message",
    [
        ({"--api-model": ""}, {}, "--engine openai needs --api-model NAME"),
        ({"--base-url": "localhost:8000/v1"}, {}, "--base-url must be an http(s) URL"),
        ({"--base-url": "ftp://example.com/v1"}, {}, "--base-url must be an http(s) URL"),
        ({"--model": "runs/x/hf"}, {}, "--model is a local checkpoint"),
        ({"--concurrency": "0"}, {}, "Invalid value for '--concurrency'"),
        ({"--request-timeout": "0"}, {}, "Invalid value for '--request-timeout'"),
        ({}, {"WORLD_SIZE": "2"}, "--engine openai runs in one process (WORLD_SIZE=2)"),
        ({"--api-key-env": KEY}, {}, "takes the NAME of an environment variable"),
    ],
)
def test_bad_options_are_refused_before_anything_is_written(tmp_path, changes, env, message):
    argv = args("http://127.0.0.1:9/v1", tmp_path / "eval")
    for flag, value in changes.items():
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    result = invoke(*argv, env=env)
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []
    assert KEY not in result.output


def test_the_openai_options_need_the_openai_engine(tmp_path):
    result = invoke("--model", str(tmp_path), "--base-url", "http://127.0.0.1:9/v1")
    assert result.exit_code == 2 and "--base-url and --api-model go with --engine openai" in (
        result.output
    )


def test_an_unreachable_server_is_one_message(tmp_path):
    url = f"http://127.0.0.1:{unused_port()}/v1"
    result = invoke(*args(url, tmp_path / "eval", "--retries", "1"))
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert f"{url}/chat/completions: no connection (" in result.output
    assert "(after 2 attempts)" in result.output


def test_a_redirect_is_not_followed_with_the_key(stub, tmp_path):
    server = stub(lambda seed, attempt, answered: "redirect")
    result = invoke(*args(server.url, tmp_path / "eval", "--concurrency", "1"))
    assert result.exit_code == 1 and "HTTP 307 redirect to 'http://evil.example" in result.output
    assert "not followed" in result.output and len(server.log) == 1
    assert_no_key_on_disk(tmp_path, result.output)


def test_a_key_cut_by_the_body_limit_is_masked_before_the_cut(stub, tmp_path):
    # 11 + 180 characters come before "Bearer sk-...": the 200-character cut falls inside the key
    server = stub(lambda seed, attempt, answered: "401_long")
    result = invoke(*args(server.url, tmp_path / "eval", "--concurrency", "1"))
    assert result.exit_code == 1 and "HTTP 401" in result.output
    assert KEY[:6] not in result.output.replace("Bearer ***", "")
    assert_no_key_on_disk(tmp_path, result.output)


def test_a_key_with_a_carriage_return_is_trimmed_and_control_characters_refused(stub, tmp_path):
    server = stub(clean)
    result = invoke(*args(server.url, tmp_path / "a"), env={"OPENAI_API_KEY": KEY + "\r\n"})
    assert result.exit_code == 0, result.output
    assert {entry[4] for entry in server.log} == {f"Bearer {KEY}"}
    bad = invoke(*args(server.url, tmp_path / "b"), env={"OPENAI_API_KEY": KEY[:5] + "\x01" + KEY})
    assert bad.exit_code == 1 and "holds control characters" in bad.output
    assert KEY not in bad.output and KEY[:5] + "\x01" not in bad.output
