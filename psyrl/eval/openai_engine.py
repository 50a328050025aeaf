"""evaluate.py's `--engine openai`: responses from any OpenAI-compatible chat-completions endpoint
(`vllm serve`, TGI, llama.cpp's server, a commercial API), for Table 3's API baselines.

Each item is one POST of `{base_url}/chat/completions` with the chat messages psyrl's prompt builds
(`psyrl.core.prompts.messages`; the server applies its own chat template), the item's seed (`seed`),
`temperature`, `top_p` and `max_tokens`. Requests run on a pool of threads; a 429, a 5xx, a
malformed answer, a refused connection or a timeout is retried with exponential backoff and jitter
(a `Retry-After` header is honoured), any other 4xx fails at once. The API key is read from an
environment variable and only ever sent in the `Authorization` header: it is never returned,
recorded or printed (error messages have it masked). The LLM judge (psyrl.signals.judge) sends its
rubric through the same client: its `accept` retries an answer without a score like a malformed
one, and `complete_all`'s `deadline` and `keep_failures` give it a step timeout and a fallback per
response.

The standard library only (urllib, threads): `evaluate --help` imports this module and must stay
instant.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import random
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from psyrl.core.errors import PsyrlError

RETRY_WAIT_MAX = 60.0  # seconds: the backoff doubles up to this
RETRY_AFTER_MAX = 300.0  # seconds: a longer Retry-After fails instead of stalling the run
BODY_SHOWN = 200  # characters of an error response shown in the message


class ApiError(PsyrlError):
    """A request that failed for good: the message names the URL, the HTTP status and the start of
    the response body (or the connection error)."""


@dataclass(frozen=True)
class ApiOptions:
    """evaluate.py's `--engine openai` options."""

    base_url: str
    """The API root that `/chat/completions` is appended to, e.g. https://api.openai.com/v1."""
    model: str
    """The `model` field of every request (--api-model)."""
    key_env: str
    """The environment variable that holds the API key; unset or empty = no Authorization header."""
    concurrency: int
    """Requests in flight at once."""
    timeout: float
    """Seconds a request may wait for the connection or for each read of its answer."""
    retries: int
    """Further attempts after a retryable failure."""
    retry_wait: float
    """The first backoff in seconds; it doubles per attempt (up to RETRY_WAIT_MAX), with jitter."""

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"


@dataclass(frozen=True)
class Completion:
    """One response, in the fields psyrl scores."""

    text: str
    """choices[0].message.content (a reasoning model's separate reasoning field is not part of
    it)."""
    tokens: int
    """usage.completion_tokens: counted by the server's tokenizer, the stop token included."""
    finish: str
    """choices[0].finish_reason (`stop`, `length`, ...)."""


class _Retryable(Exception):
    def __init__(self, problem: str, retry_after: float | None = None):
        super().__init__(problem)
        self.retry_after = retry_after


def url_problem(base_url: str) -> str | None:
    """Why --base-url is not usable (None if it is): an http(s) URL with a host."""
    parts = urllib.parse.urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return (
            f"--base-url must be an http(s) URL such as https://api.openai.com/v1 or "
            f"http://127.0.0.1:8000/v1, got {base_url!r}"
        )
    if parts.query or parts.fragment:
        return f"--base-url takes no query or fragment (…/chat/completions is appended): {base_url}"
    return None


def request_body(
    model: str, messages: list[dict], temperature: float, top_p: float, max_tokens: int, seed: int
) -> dict:
    """The chat-completions request of one item: only fields of OpenAI's API, so that any compatible
    server takes it (`max_tokens`, the field every one of them knows)."""
    return {
        "model": model,
        "messages": messages,
        "temperature": temperature,
        "top_p": top_p,
        "max_tokens": max_tokens,
        "seed": seed,
        "n": 1,
        "stream": False,
    }


def parse_completion(payload: bytes, mask: Callable[[bytes], bytes] = lambda b: b) -> Completion:
    """The fields of a chat-completions answer; a _Retryable if it is not one (a proxy's error page,
    a body cut short), showing the body through `mask`."""
    try:
        answer = json.loads(payload)
        choice = answer["choices"][0]
        text, finish = choice["message"]["content"], choice.get("finish_reason")
        tokens = answer["usage"]["completion_tokens"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise _Retryable(
            f"not a chat completion ({type(e).__name__}: {e}): {_shown(mask(payload))}"
        ) from None
    if not isinstance(tokens, int) or not isinstance(text, (str, type(None))):
        raise _Retryable(
            f"not a chat completion (usage.completion_tokens {tokens!r}): {_shown(mask(payload))}"
        )
    return Completion(text or "", tokens, finish or "unknown")


def retry_after(value: str | None) -> float | None:
    """A Retry-After header's seconds (the HTTP-date form is not used by these APIs: ignored)."""
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None


def backoff(attempt: int, first: float, after: float | None, rng: random.Random) -> float:
    """Seconds before attempt `attempt + 1`: first * 2**attempt (at most RETRY_WAIT_MAX), between
    half and all of it (jitter: many threads do not retry in step), and at least Retry-After."""
    wait_s = min(RETRY_WAIT_MAX, first * 2**attempt)
    wait_s = wait_s / 2 + rng.random() * wait_s / 2
    return max(wait_s, after or 0.0)


class Client:
    """POSTs chat completions to one endpoint, with the retry rule above."""

    def __init__(
        self,
        options: ApiOptions,
        environ=os.environ,
        accept: Callable[[Completion], object] | None = None,
    ):
        """`accept` turns each answer into what `complete` returns; a ValueError it raises (an
        answer the caller cannot use) is retried like a malformed answer. None: the Completion."""
        self.options = options
        self._accept = accept
        key = (environ.get(options.key_env) or "").strip()  # a CRLF .env file leaves a \r
        if any(ord(c) < 32 or ord(c) == 127 for c in key):
            raise ApiError(f"${options.key_env} holds control characters: not a usable key")
        self._key = key or None
        # a redirect would re-send the Authorization header to the host it names: refused
        self._opener = urllib.request.build_opener(_NoRedirect)
        self._stop = threading.Event()  # set on the first failure: the other threads give up
        self._rng = random.Random()

    @property
    def has_key(self) -> bool:
        return self._key is not None

    def stop(self) -> None:
        self._stop.set()

    def complete(self, body: dict):
        """One item's answer (a Completion, or what `accept` made of it); an ApiError once the
        retries are spent or on a non-retryable status."""
        opts = self.options
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        for attempt in range(opts.retries + 1):
            if self._stop.is_set():
                raise ApiError(f"{opts.url}: stopped after another request failed")
            request = urllib.request.Request(opts.url, data=data, headers=headers, method="POST")
            try:
                with self._opener.open(request, timeout=opts.timeout) as response:
                    answer = parse_completion(response.read(), self._masked_text)
                return answer if self._accept is None else self._refused_unless(answer)
            except urllib.error.HTTPError as e:  # before URLError: it is one
                if 300 <= e.code < 400:
                    raise ApiError(
                        f"{opts.url}: HTTP {e.code} redirect to "
                        f"{e.headers.get('Location')!r}: not followed (it would send "
                        "the key there); use the final URL as --base-url"
                    ) from None
                problem = f"HTTP {e.code}: {_shown(self._masked_text(_read(e)))}"
                if e.code != 429 and not 500 <= e.code < 600:
                    raise ApiError(self._masked(f"{opts.url}: {problem}")) from None
                failure = _Retryable(problem, retry_after(e.headers.get("Retry-After")))
            except _Retryable as e:
                failure = e
            except urllib.error.URLError as e:
                failure = _Retryable(f"no connection ({e.reason})")
            except (http.client.HTTPException, OSError) as e:  # a timeout, a reset connection
                failure = _Retryable(f"{type(e).__name__}: {str(e) or 'no detail'}")
            if failure.retry_after is not None and failure.retry_after > RETRY_AFTER_MAX:
                raise ApiError(
                    self._masked(
                        f"{opts.url}: {failure} with Retry-After {failure.retry_after:g} s "
                        f"(more than {RETRY_AFTER_MAX:g} s: try again later)"
                    )
                )
            if attempt == opts.retries:
                raise ApiError(
                    self._masked(f"{opts.url}: {failure} (after {opts.retries + 1} attempts)")
                )
            if self._stop.wait(backoff(attempt, opts.retry_wait, failure.retry_after, self._rng)):
                raise ApiError(f"{opts.url}: stopped after another request failed")
        raise AssertionError("unreachable")

    def _refused_unless(self, answer: Completion):
        try:
            return self._accept(answer)
        except ValueError as e:
            text = _shown(self._masked_text(answer.text.encode("utf-8")))
            raise _Retryable(f"answer refused ({e}): {text}") from None

    def _masked_text(self, payload: bytes) -> bytes:
        """The body with the key masked before it is cut to BODY_SHOWN characters (a cut key would
        print its prefix)."""
        return payload.replace(self._key.encode(), b"***") if self._key else payload

    def _masked(self, message: str) -> str:
        """An error body may echo the key (a proxy, a debug server): never print it."""
        return message.replace(self._key, "***") if self._key else message


def complete_all(
    client: Client,
    jobs: Iterable,
    body_of: Callable[[object], dict],
    stopping: Callable[[], bool] = lambda: False,
    *,
    deadline: float | None = None,
    keep_failures: bool = False,
) -> Iterator[tuple[object, Completion]]:
    """(job, completion) in the order they finish, `client.options.concurrency` requests in flight
    (a thread each). The caller records each as it comes (a crash loses only the requests in
    flight). When `stopping()` turns true no new request starts; those in flight finish and are
    yielded. The first failure stops the others and is raised at once, after the answers that had
    already arrived: the threads are daemons, so one still waiting on a hung server does not hold
    the message or the exit back.

    `keep_failures`: a request that failed for good is yielded as (job, its ApiError) instead, and
    the others go on. `deadline` (a time.monotonic() value): once it passes, no request starts and
    none is awaited; the generator ends, the requests still in flight are stopped and not
    yielded."""
    jobs, finished = iter(jobs), queue.SimpleQueue()
    running = 0

    def late() -> bool:
        return deadline is not None and time.monotonic() >= deadline

    def work(job) -> None:
        try:
            finished.put((job, client.complete(body_of(job)), None))
        except BaseException as e:  # handed to the caller's thread
            finished.put((job, None, e))

    def submit() -> None:
        nonlocal running
        while running < client.options.concurrency and not stopping() and not late():
            job = next(jobs, None)
            if job is None:
                return
            threading.Thread(target=work, args=(job,), name="openai-request", daemon=True).start()
            running += 1

    try:
        submit()
        while running:
            try:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                job, answer, error = finished.get(timeout=wait)
            except queue.Empty:
                return  # the deadline passed: the finally stops those in flight
            running -= 1
            if isinstance(error, ApiError) and keep_failures:
                answer, error = error, None
            if error is not None:
                client.stop()  # the threads still retrying give up
                while not finished.empty():  # answers that came meanwhile are still kept
                    job, answer, other = finished.get()
                    if other is None:
                        yield job, answer
                raise error
            yield job, answer
            submit()
    finally:
        client.stop()


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # the 3xx then surfaces as an HTTPError


def _read(error: urllib.error.HTTPError) -> bytes:
    try:
        return error.read()
    except (OSError, http.client.HTTPException):
        return b""


def _shown(payload: bytes) -> str:
    text = payload.decode("utf-8", errors="replace")
    return repr(text[:BODY_SHOWN]) + ("…" if len(text) > BODY_SHOWN else "")
