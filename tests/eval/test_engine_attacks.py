"""Attacks on the chat-completions client (psyrl.eval.openai_engine) and what it must do instead:
a key or URL that cannot be sent is refused when the client is made, credentials in the URL are
refused without being echoed, the key goes through no proxy the environment names, every escaped
or encoded echo of the key is masked, a 401 or 403 stops at once even where failures are kept,
requests abandoned at a deadline end instead of piling up, and a refused answer to a
temperature-0 request is not asked again unchanged. Each against a stub server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
import time
import urllib.parse

import pytest
from click.testing import CliRunner
from http_stub import serve_posts

from psyrl.cli.evaluate import evaluate as evaluate_command
from psyrl.core.config import JudgeConfig
from psyrl.eval.openai_engine import ApiError, ApiOptions, Client, complete_all, url_problem
from psyrl.rl.accuracy import Pair
from psyrl.signals.judge import JudgeError, JudgeSignal

KEY_ENV = "PSYRL_TEST_ENGINE_KEY"
KEY = "sk-test/4f1c+9e0b=7a2d"  # a slash, a plus and an equals sign: each escapes differently


def answer(text: str) -> dict:
    return {
        "choices": [{"message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
        "usage": {"completion_tokens": 3},
    }


def send(handler, status: int, payload) -> None:
    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    handler.wfile.write(data)


class Stub:
    """A server whose every POST gets `respond(handler, body)`; it logs the bodies and the
    Authorization headers."""

    def __init__(self, respond):
        self.respond, self.bodies, self.headers = respond, [], []
        self.lock, self.release = threading.Lock(), threading.Event()
        self.server, self.url = serve_posts(self.handle)

    def handle(self, handler, body):
        with self.lock:
            self.bodies.append(body)
            self.headers.append(handler.headers.get("Authorization"))
        self.respond(self, handler, body)

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def stub():
    servers = []

    def start(respond):
        servers.append(Stub(respond))
        return servers[-1]

    yield start
    for server in servers:
        server.close()


def options(url: str, **changes) -> ApiOptions:
    settings = dict(
        base_url=url,
        model="stub",
        key_env=KEY_ENV,
        concurrency=4,
        timeout=5.0,
        retries=2,
        retry_wait=0.01,
    )
    return ApiOptions(**{**settings, **changes})


def body(temperature: float = 0.0) -> dict:
    return {"model": "stub", "messages": [], "temperature": temperature, "seed": 0}


# ---------------------------------------------------------------------- a key or URL that cannot go
@pytest.mark.parametrize("key", ["sk-abc\u2011def", "sk-\u201cquoted\u201d", "sk-caf\u00e9"])
def test_a_key_an_http_header_cannot_carry_is_refused_when_the_client_is_made(key):
    # U+2011 (a non-breaking hyphen pasted from a web page) made the first request raise
    # UnicodeEncodeError from http.client, past every fallback
    with pytest.raises(ApiError, match=rf"\${KEY_ENV} holds U\+") as raised:
        Client(options("http://127.0.0.1:9/v1"), {KEY_ENV: key})
    assert "not a usable key" in str(raised.value)
    assert key not in str(raised.value) and key[3:6] not in str(raised.value)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:9/v1\u2011", "http://judge\u2011host/v1", "http://127.0.0.1:9/a b"]
)
def test_a_url_that_cannot_be_sent_is_refused(url):
    assert "cannot be sent" in url_problem(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://alice:s3cretPW@127.0.0.1:8000/v1",
        "https://alice:s3cretPW@api.example.com/v1",
        "ftp://alice:s3cretPW@api.example.com/v1",
        "http://s3cretPW@127.0.0.1:8000/v1?x=1",
        "http://alice:s3cret/PW@127.0.0.1:8000/v1",  # a "/" moves the "@" into the path
        "http://alice:s3c@retPW@127.0.0.1:8000/v1",  # two "@"
        "http://alice:s3cretPW@[::1",  # not a URL at all: still not echoed
    ],
)
def test_credentials_in_the_url_are_refused_without_being_echoed(url):
    problem = url_problem(url)
    assert problem is not None and "user name or password" in problem
    assert "s3cretPW" not in problem and "alice" not in problem


def test_a_key_in_the_query_is_refused_without_being_echoed():
    problem = url_problem("https://api.example.com/v1?key=sk-s3cretKEY")
    assert problem is not None and "query" in problem and "s3cretKEY" not in problem


def test_the_judge_refuses_credentials_in_its_url_without_echoing_them(monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    cfg = JudgeConfig(model="m", api_key_env=KEY_ENV)
    cfg.base_url = "http://u:s3cretPW@127.0.0.1:9/v1"  # past the config's own check (below)
    with pytest.raises(JudgeError, match="user name or password") as raised:
        JudgeSignal(cfg)
    assert "s3cretPW" not in str(raised.value)
    with pytest.raises(ValueError, match="holds credentials") as raised:  # the config's check
        JudgeConfig(base_url="http://u:s3cretPW@127.0.0.1:9/v1", model="m")
    assert "s3cretPW" not in str(raised.value)


# ----------------------------------------------------------------------------------------- proxy
def test_the_key_goes_through_no_proxy_the_environment_names(stub, monkeypatch):
    server = stub(lambda self, handler, body: send(handler, 200, answer("hi")))
    proxy = stub(lambda self, handler, body: send(handler, 502, {"error": "proxy"}))
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.setenv(name, proxy.url.removesuffix("/v1"))
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    client = Client(options(server.url), {KEY_ENV: KEY})
    assert client.complete(body()).text == "hi"
    assert proxy.headers == [] and server.headers == [f"Bearer {KEY}"]


def test_the_judges_proxy_is_the_one_its_config_names(stub, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    proxy = stub(lambda self, handler, body: send(handler, 500, {"error": "proxy says no"}))
    cfg = JudgeConfig(
        base_url="http://judge.invalid/v1",
        model="stub",
        api_key_env=KEY_ENV,
        proxy=proxy.url.removesuffix("/v1"),
        retries=0,
        on_failure="f1",
    )
    signal = JudgeSignal(cfg, retry_wait=0.01)
    signal([Pair("proud", "proud")])
    assert proxy.headers == [f"Bearer {KEY}"] and signal.fallbacks == 1


def test_a_named_proxy_is_used_whatever_no_proxy_says(stub, monkeypatch):
    # urllib's ProxyHandler skips the proxy for a host no_proxy lists: the request went direct
    server = stub(lambda self, handler, body: send(handler, 200, answer("direct")))
    proxy = stub(lambda self, handler, body: send(handler, 200, answer("via proxy")))
    monkeypatch.setenv("no_proxy", "127.0.0.1,localhost")
    client = Client(options(server.url, proxy=proxy.url.removesuffix("/v1")), {KEY_ENV: KEY})
    assert client.complete(body()).text == "via proxy"
    assert server.headers == [] and proxy.headers == [f"Bearer {KEY}"]


def test_a_proxy_named_for_the_endpoint_is_used(stub):
    proxy = stub(lambda self, handler, body: send(handler, 200, answer("via proxy")))
    client = Client(
        options("http://judge.invalid/v1", proxy=proxy.url.removesuffix("/v1")), {KEY_ENV: KEY}
    )
    assert client.complete(body()).text == "via proxy"
    assert proxy.headers == [f"Bearer {KEY}"]


# --------------------------------------------------------------------------------------- masking
FORMS = {
    "json slash": KEY.replace("/", "\\/"),
    "json unicode": "".join(f"\\u{ord(c):04x}" for c in KEY),
    "json unicode upper": "".join(f"\\u{ord(c):04X}" for c in KEY),
    "percent": urllib.parse.quote(KEY, safe=""),
    "percent plus": urllib.parse.quote_plus(KEY),
    "percent lower": urllib.parse.quote(KEY, safe="").lower(),
    "percent every byte": "".join(f"%{b:02X}" for b in KEY.encode()),
    "json slash in json": KEY.replace("/", "\\\\\\/"),
}


@pytest.mark.parametrize("form", FORMS)
def test_every_escaped_or_encoded_echo_of_the_key_is_masked(stub, form):
    echoed = FORMS[form]
    assert echoed != KEY

    def respond(self, handler, body):  # the body is written as is: no JSON encoder re-escapes it
        send(handler, 401, f'{{"error": "bad key Bearer {echoed}"}}'.encode())

    server = stub(respond)
    with pytest.raises(ApiError) as raised:
        Client(options(server.url), {KEY_ENV: KEY}).complete(body())
    message = str(raised.value)
    shown = message.replace("\\\\", "\\")  # the body is shown by repr(), which doubles backslashes
    assert "bad key Bearer ***" in shown
    assert echoed not in shown and KEY not in shown and "9e0b" not in shown


# -------------------------------------------------------------------------------- 401/403: fatal
@pytest.mark.parametrize("status", [401, 403])
def test_401_and_403_stop_at_once_even_where_failures_are_kept(stub, status):
    server = stub(lambda self, handler, body: send(handler, status, {"error": "no"}))
    client = Client(options(server.url, concurrency=1), {KEY_ENV: KEY})
    answers = complete_all(client, range(5), lambda job: body(), keep_failures=True)
    with pytest.raises(ApiError, match=f"HTTP {status}") as raised:
        list(answers)
    assert raised.value.fatal
    assert len(server.bodies) == 1  # neither retried nor followed by the other jobs


def test_a_kept_failure_is_not_fatal(stub):
    server = stub(lambda self, handler, body: send(handler, 400, {"error": "bad model"}))
    client = Client(options(server.url, concurrency=1), {KEY_ENV: KEY})
    got = list(complete_all(client, range(3), lambda job: body(), keep_failures=True))
    assert [job for job, _ in got] == [0, 1, 2]
    assert all(isinstance(a, ApiError) and not a.fatal for _, a in got)


def test_the_judge_stops_on_a_401_instead_of_falling_back_to_f1(stub, monkeypatch):
    monkeypatch.setenv(KEY_ENV, KEY)
    server = stub(lambda self, handler, body: send(handler, 401, {"error": "invalid key"}))
    cfg = JudgeConfig(
        base_url=server.url,
        model="stub",
        api_key_env=KEY_ENV,
        timeout_s=5.0,
        retries=2,
        on_failure="f1",
    )
    signal = JudgeSignal(cfg, retry_wait=0.01)
    with pytest.raises(JudgeError, match="HTTP 401") as raised:
        signal([Pair("proud", f"word{i}") for i in range(4)])
    assert KEY not in str(raised.value)


# ----------------------------------------------------------------------- abandoned at a deadline
def request_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "openai-request" and t.is_alive())


def test_requests_abandoned_at_the_deadline_end_instead_of_piling_up(stub):
    server = stub(lambda self, handler, body: self.release.wait(60))  # never answers
    for _ in range(3):  # three judge steps, a client each
        client = Client(options(server.url, timeout=60.0), {KEY_ENV: KEY})
        deadline = time.monotonic() + 0.2
        got = list(complete_all(client, range(4), lambda job: body(), deadline=deadline))
        assert got == []
    # they held 60 s reads; cancelled, they end within moments instead of 4 -> 8 -> 12 threads
    end = time.monotonic() + 3.0
    while request_threads() and time.monotonic() < end:
        time.sleep(0.05)
    assert request_threads() == 0
    assert len(server.bodies) == 12


# ----------------------------------------------------------- a deterministic refusal, not re-asked
def refuse(completion):
    raise ValueError("the last line is not 'SCORE: <number>'")


def test_a_refused_answer_to_a_temperature_0_request_is_not_asked_again(stub):
    server = stub(lambda self, handler, body: send(handler, 200, answer("no score here")))
    client = Client(options(server.url), {KEY_ENV: KEY}, accept=refuse)
    with pytest.raises(ApiError, match="answer refused") as raised:
        client.complete(body(temperature=0.0))
    assert "not asked again" in str(raised.value) and not raised.value.fatal
    assert len(server.bodies) == 1


@pytest.mark.parametrize(
    "temperature, status, refused",
    [(0.0, 200, True), (0.7, 200, True), (0.0, 400, False), (0.0, 503, False)],
)
def test_a_failure_says_whether_the_answer_was_refused_and_its_status(
    stub, temperature, status, refused
):
    # the judge tells failures an answer can cause (a refused reply, a 4xx) from the others by these
    reply = answer("no score here") if status == 200 else {"error": "no"}
    server = stub(lambda self, handler, body: send(handler, status, reply))
    client = Client(options(server.url, retries=1), {KEY_ENV: KEY}, accept=refuse)
    with pytest.raises(ApiError) as raised:
        client.complete(body(temperature=temperature))
    assert raised.value.refused is refused
    assert raised.value.status == (None if status == 200 else status)


def test_a_refused_sampled_answer_is_still_retried(stub):
    server = stub(lambda self, handler, body: send(handler, 200, answer("no score here")))
    client = Client(options(server.url), {KEY_ENV: KEY}, accept=refuse)
    with pytest.raises(ApiError, match="after 3 attempts"):
        client.complete(body(temperature=0.7))
    assert len(server.bodies) == 3 and all(b["temperature"] == 0.7 for b in server.bodies)


def test_a_body_cut_short_at_temperature_0_is_still_retried(stub):
    def respond(self, handler, body):  # a transport fault, not the model's answer
        if len(self.bodies) == 1:
            return send(handler, 200, b'{"choices": [{"message": ')
        return send(handler, 200, answer("SCORE: 1"))

    server = stub(respond)
    client = Client(options(server.url), {KEY_ENV: KEY}, accept=lambda c: c.text)
    assert client.complete(body()) == "SCORE: 1" and len(server.bodies) == 2


def test_evaluate_refuses_a_key_with_a_pasted_hyphen_in_one_message(stub, tmp_path):
    # before: "Error: 'latin-1' codec can't encode character '\u2011'", after writing the output
    server = stub(lambda self, handler, body: send(handler, 200, answer("hi")))
    argv = ["--engine", "openai", "--base-url", server.url, "--api-model", "stub"]
    argv += ["--benchmarks", "data/demo/mc.jsonl", "--limit", "1", "--out", str(tmp_path / "e")]
    argv += ["--no-progress"]
    key = "sk-abc\u2011def-0123"
    result = CliRunner().invoke(evaluate_command, argv, env={"OPENAI_API_KEY": key})
    assert result.exit_code == 1 and "Traceback" not in result.output
    assert "$OPENAI_API_KEY holds U+2011 NON-BREAKING HYPHEN at character 7" in result.output
    assert "0123" not in result.output and server.bodies == []
    assert not (tmp_path / "e").exists()  # refused before the output directory was made
