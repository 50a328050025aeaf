"""evaluate.py's `--engine openai`: responses from any OpenAI-compatible chat-completions endpoint
(`vllm serve`, TGI, llama.cpp's server, a commercial API), for Table 3's API baselines.

Each item is one POST of `{base_url}/chat/completions` with the chat messages psyrl's prompt builds
(`psyrl.core.prompts.messages`; the server applies its own chat template), the item's seed (`seed`),
`temperature`, `top_p` and `max_tokens`. Requests run on a pool of threads; a 429, a 5xx, a
malformed answer, a refused connection or a timeout is retried with exponential backoff and jitter
(a `Retry-After` header is honoured), any other 4xx fails at once; a 401 or 403 (a wrong key) and
a request that cannot be sent are `fatal`: `complete_all` raises them even where it keeps failures.

The API key is read from an environment variable and only ever sent in the `Authorization` header:
it is never returned, recorded or printed. A key or URL that a request cannot carry (anything but
printable ASCII) is refused when the client is made, and so is a URL holding a user name or password
(it would be printed and recorded with the URL). Error messages mask the key in every form a server
may echo it: as sent, JSON-escaped (`\\/`, `\\u002f`) or percent-encoded. Requests go straight to
the endpoint: the environment's http_proxy/https_proxy are not used, since they would carry the key
through a proxy named for other traffic; `ApiOptions.proxy` names one for this endpoint alone.

The LLM judge (psyrl.signals.judge) sends its rubric through the same client: its `accept` refuses
an answer without a score, and `complete_all`'s `deadline` and `keep_failures` give it a step
timeout and a fallback per response. A refused answer to a temperature-0 request is not asked
again: a server answers the same request the same way, so an unchanged retry only spends time
(a body that is not a chat completion at all, a transport fault, is still retried). Requests
still in flight when `complete_all` ends (a deadline, a failure) have their connections shut, so
their threads end at once instead of waiting out `timeout`.

The standard library only (urllib, threads): `evaluate --help` imports this module and must stay
instant.
"""

from __future__ import annotations

import http.client
import json
import os
import queue
import random
import re
import socket
import threading
import time
import unicodedata
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from weakref import WeakSet

from psyrl.core.errors import PsyrlError

RETRY_WAIT_MAX = 60.0  # seconds: the backoff doubles up to this
RETRY_AFTER_MAX = 300.0  # seconds: a longer Retry-After fails instead of stalling the run
BODY_SHOWN = 200  # characters of an error response shown in the message


class ApiError(PsyrlError):
    """A request that failed for good: the message names the URL, the HTTP status and the start of
    the response body (or the connection error). `fatal`: no other request can fare better (a 401
    or 403, a request that cannot be sent), so the caller stops instead of falling back.
    `refused`: the server answered and `accept` refused the answer; `status`: the last attempt's
    HTTP status (None without one)."""

    def __init__(
        self, message: str, fatal: bool = False, refused: bool = False, status: int | None = None
    ):
        super().__init__(message)
        self.fatal, self.refused, self.status = fatal, refused, status


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
    proxy: str = ""
    """An http(s) proxy URL for this endpoint alone; empty: none (http_proxy and https_proxy in the
    environment are not used)."""

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


class _Refused(_Retryable):
    """An answer that `accept` refused: the model's own answer, not a transport fault."""


def unsendable(text: str) -> str | None:
    """The first character of `text` that an HTTP request line or header cannot carry (anything but
    printable ASCII), as `U+2011 NON-BREAKING HYPHEN at character 7`; None if there is none."""
    for i, c in enumerate(text):
        if not " " < c < "\x7f":
            name = unicodedata.name(c, "")
            return f"U+{ord(c):04X}{' ' + name if name else ''} at character {i + 1}"
    return None


def url_problem(base_url: str) -> str | None:
    """Why --base-url is not usable (None if it is): an http(s) URL with a host, in printable ASCII,
    with no user name or password and no query (the message never shows them: `_url_shown`)."""
    shown = _url_shown(base_url)
    if "@" in base_url:  # before parsing: a password holding "/" moves the "@" into the path
        return (
            "--base-url holds a user name or password (user:password@host): they would be printed "
            "and recorded with the URL; remove them and give the key by its environment variable "
            f"(an @ in the path: write it %40), got {shown!r}"
        )
    try:
        parts = urllib.parse.urlsplit(base_url)
        parts.port  # noqa: B018 -- a port that is not a number raises here, not at the first request
    except ValueError as e:
        return f"--base-url is not a URL ({e}): {shown!r}"
    if parts.query or parts.fragment:  # a query may hold a key: never shown
        return f"--base-url takes no query or fragment (…/chat/completions is appended): {shown}"
    if where := unsendable(base_url):
        return (
            f"--base-url holds {where}: a request cannot be sent to it (percent-encode the path, "
            f"write a host in its xn-- form), got {shown!r}"
        )
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return (
            f"--base-url must be an http(s) URL such as https://api.openai.com/v1 or "
            f"http://127.0.0.1:8000/v1, got {shown!r}"
        )
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


def key_pattern(key: str) -> str:
    """A regular expression matching `key` as sent and as a server may echo it, each character
    alone: JSON-escaped (`\\/`, `\\u002F`, escaped again inside a JSON string) or percent-encoded
    (`%2F`, `%252F`), hex digits in either case. The key is printable ASCII (the client refuses any
    other)."""
    forms = []
    for c in key:
        digits = "".join(f"[{d}{d.upper()}]" if d.isalpha() else d for d in f"{ord(c):02x}")
        form = rf"\\*{re.escape(c)}|\\+[uU]00{digits}|%(?:25)*{digits}"
        forms.append(f"(?:{form}{'|[+]' if c == ' ' else ''})")
    return "".join(forms)


class _Sockets:
    """The connections a client has open, so that `stop` can shut them: a thread blocked reading an
    answer then ends at once instead of after `timeout`."""

    def __init__(self):
        self._open: WeakSet[socket.socket] = WeakSet()
        self._lock = threading.Lock()
        self._closed = False

    def add(self, sock: socket.socket) -> None:
        with self._lock:
            if not self._closed:
                self._open.add(sock)
                return
        _shut(sock)  # stopped while it connected

    def close(self) -> None:
        with self._lock:
            self._closed, shut = True, list(self._open)
        for sock in shut:
            _shut(sock)


def _shut(sock: socket.socket) -> None:
    try:  # socket.socket's own shutdown: an SSLSocket's would unwrap TLS under a reading thread
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:  # already closed
        pass


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
        if where := unsendable(key):  # http.client would raise UnicodeEncodeError at the first send
            raise ApiError(
                f"${options.key_env} holds {where}: an API key is printable ASCII without "
                "spaces (a hyphen or quote pasted from a formatted page?); not a usable key"
            )
        for url in (options.base_url, options.proxy):
            if url and (problem := url_problem(url)):
                raise ApiError(problem, fatal=True)
        self._key = key or None
        self._mask = re.compile(key_pattern(key)) if key else None
        self._mask_bytes = re.compile(key_pattern(key).encode("ascii")) if key else None
        self._sockets = _Sockets()
        proxies = {"http": options.proxy, "https": options.proxy} if options.proxy else {}
        # no proxy from the environment; a redirect would re-send the key to the host it names
        self._opener = urllib.request.build_opener(
            _NamedProxy(proxies),
            _NoRedirect,
            _TrackedHTTP(self._sockets),
            _TrackedHTTPS(self._sockets),
        )
        self._stop = threading.Event()  # set on the first failure: the other threads give up
        self._rng = random.Random()

    @property
    def has_key(self) -> bool:
        return self._key is not None

    def stop(self) -> None:
        """No new attempt starts, and the connections open now are shut (their threads end)."""
        self._stop.set()
        self._sockets.close()

    def complete(self, body: dict):
        """One item's answer (a Completion, or what `accept` made of it); an ApiError once the
        retries are spent or on a non-retryable status."""
        opts = self.options
        data = json.dumps(body).encode("utf-8")
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        for attempt in range(opts.retries + 1):
            status = None  # this attempt's HTTP status
            if self._stop.is_set():
                raise ApiError(f"{opts.url}: stopped after another request failed")
            request = urllib.request.Request(opts.url, data=data, headers=headers, method="POST")
            try:
                with self._opener.open(request, timeout=opts.timeout) as response:
                    answer = parse_completion(response.read(), self._masked_text)
                return answer if self._accept is None else self._refused_unless(answer)
            except urllib.error.HTTPError as e:  # before URLError: it is one
                status = e.code
                if 300 <= e.code < 400:
                    raise ApiError(
                        f"{opts.url}: HTTP {e.code} redirect to "
                        f"{e.headers.get('Location')!r}: not followed (it would send "
                        "the key there); use the final URL as --base-url"
                    ) from None
                problem = f"HTTP {e.code}: {_shown(self._masked_text(_read(e)))}"
                if e.code != 429 and not 500 <= e.code < 600:
                    # a wrong key or a forbidden model: every other request gets the same
                    fatal = e.code in (401, 403)
                    raise ApiError(
                        self._masked(f"{opts.url}: {problem}"), fatal=fatal, status=e.code
                    ) from None
                failure = _Retryable(problem, retry_after(e.headers.get("Retry-After")))
            except _Refused as e:
                if body.get("temperature") == 0:
                    raise ApiError(
                        self._masked(
                            f"{opts.url}: {e} (a temperature-0 request: not asked again unchanged)"
                        ),
                        refused=True,
                    ) from None
                failure = e
            except _Retryable as e:
                failure = e
            except urllib.error.URLError as e:
                failure = _Retryable(f"no connection ({e.reason})")
            except (http.client.HTTPException, OSError) as e:  # a timeout, a reset connection
                failure = _Retryable(f"{type(e).__name__}: {str(e) or 'no detail'}")
            except (UnicodeError, ValueError) as e:  # what no retry can send
                raise ApiError(
                    self._masked(
                        f"{opts.url}: the request cannot be sent ({type(e).__name__}: {e})"
                    ),
                    fatal=True,
                ) from None
            if failure.retry_after is not None and failure.retry_after > RETRY_AFTER_MAX:
                raise ApiError(
                    self._masked(
                        f"{opts.url}: {failure} with Retry-After {failure.retry_after:g} s "
                        f"(more than {RETRY_AFTER_MAX:g} s: try again later)"
                    )
                )
            if attempt == opts.retries:
                raise ApiError(
                    self._masked(f"{opts.url}: {failure} (after {opts.retries + 1} attempts)"),
                    refused=isinstance(failure, _Refused),
                    status=status,
                )
            if self._stop.wait(backoff(attempt, opts.retry_wait, failure.retry_after, self._rng)):
                raise ApiError(f"{opts.url}: stopped after another request failed")
        raise AssertionError("unreachable")

    def _refused_unless(self, answer: Completion):
        try:
            return self._accept(answer)
        except ValueError as e:
            text = _shown(self._masked_text(answer.text.encode("utf-8")))
            raise _Refused(f"answer refused ({e}): {text}") from None

    def _masked_text(self, payload: bytes) -> bytes:
        """The body with the key masked (in every form of `key_pattern`) before it is cut to
        BODY_SHOWN characters (a cut key would print its prefix)."""
        return self._mask_bytes.sub(b"***", payload) if self._mask_bytes else payload

    def _masked(self, message: str) -> str:
        """An error body may echo the key (a proxy, a debug server): never print it."""
        return self._mask.sub("***", message) if self._mask else message


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
    the others go on; a `fatal` ApiError (a 401 or 403) is raised all the same. `deadline` (a
    time.monotonic() value): once it passes, no request starts and none is awaited; the generator
    ends, the requests still in flight are stopped (their connections shut, so their threads end)
    and not yielded."""
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
            if isinstance(error, ApiError) and keep_failures and not error.fatal:
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


class _NamedProxy(urllib.request.ProxyHandler):
    """The one proxy named for this endpoint, for every request: urllib's ProxyHandler would skip
    it for a host the environment's no_proxy lists (proxy_bypass), sending the request direct."""

    def proxy_open(self, req, proxy, type):
        parts = urllib.parse.urlsplit(proxy)  # url_problem refused credentials in it
        req.set_proxy(parts.netloc, parts.scheme or type)
        if req.type in (parts.scheme, "https"):
            return None  # the HTTP(S) handlers open it through the proxy
        return self.parent.open(req, timeout=req.timeout)


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None  # the 3xx then surfaces as an HTTPError


def _tracked(connection: type, sockets: _Sockets):
    """`connection` (http.client's HTTP(S)Connection) whose socket joins `sockets` once open."""

    def make(*args, **kwargs):
        conn = connection(*args, **kwargs)
        connect = conn.connect

        def tracked_connect():
            connect()
            sockets.add(conn.sock)

        conn.connect = tracked_connect
        return conn

    return make


class _Tracked:
    """An HTTP(S) handler whose connections join `sockets` once open (`Client.stop` shuts them)."""

    def __init__(self, sockets: _Sockets):
        super().__init__()
        self._sockets = sockets

    def do_open(self, http_class, req, **kwargs):
        return super().do_open(_tracked(http_class, self._sockets), req, **kwargs)


class _TrackedHTTP(_Tracked, urllib.request.HTTPHandler):
    pass


class _TrackedHTTPS(_Tracked, urllib.request.HTTPSHandler):
    pass


def _url_shown(url: str) -> str:
    """`url` as a message may show it: everything between `://` and its last `@` as ***, and a
    query or fragment as ***. "http://u:p/w@h/v1?key=k" -> "http://***@h/v1?***"."""
    scheme, sep, rest = url.partition("://")
    if sep and "@" in rest:
        rest = "***@" + rest.rpartition("@")[2]
    shown = f"{scheme}{sep}{rest}"
    for mark in "?#":
        if mark in shown:
            shown = shown.split(mark, 1)[0] + mark + "***"
    return shown


def _read(error: urllib.error.HTTPError) -> bytes:
    try:
        return error.read()
    except (OSError, http.client.HTTPException):
        return b""


def _shown(payload: bytes) -> str:
    text = payload.decode("utf-8", errors="replace")
    return repr(text[:BODY_SHOWN]) + ("…" if len(text) > BODY_SHOWN else "")
