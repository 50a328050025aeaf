"""`reward.accuracy = "judge"`: an LLM judge scores each answer against its gold answer, given the
stimulus and the question, following a rubric (issue 41 item 3; the paper's appendix D names
"rewarding accurate emotional appraisal" as the next step beyond token F1).

- Prompt: the rubric file ([judge] rubric; default psyrl/assets/judge/rubric.md) with {stimulus},
  {question}, {gold} and {prediction} filled in, sent as one user message (temperature 0, seed 0).
  It asks about appraisal, agent, direction and the paper's psychological variables. The shipped
  rubric puts the item last, so that its instructions are a prefix that a server's prefix cache
  (vLLM's) shares between all requests.
- Parse: the answer's last non-empty line must be `SCORE: <number>` with the number in [0, 1];
  anything else (no such line, 1.7, -0.2, prose after it) is a malformed answer and is retried.
- Transport: psyrl.eval.openai_engine's client (`concurrency` requests in flight, retries with
  backoff on timeouts, 429s, 5xx and malformed answers, the key masked in every message), a
  per-request timeout (`timeout_s`) and a per-step one (`step_timeout_s`: what is unanswered when
  it passes has failed).
- Failure: `on_failure = "f1"` scores a failed response with the paper's token F1 (eq. 4-5) and
  counts it (`fallbacks`, `fallback_mask`: the trainer's reward/judge_fallbacks); `"stop"` raises
  JudgeError naming the endpoint and the error.
- Cache: a score is keyed by sha256 over (model, rubric text, stimulus, question, gold,
  prediction). The constructor reads every *.jsonl of the run's judge cache; each call appends its
  new scores to rank-{rank}.jsonl (flushed and fsynced: a crash loses at most that call), and a
  cached pair is never asked again, so a resumed run reads what the judge said instead of asking
  it again. Identical pairs in one call are asked once. F1 fallbacks are not cached: a later
  attempt may get the judge's score, so a run resumed over a step that fell back may score it
  differently.
- Secrets: the key is read from the environment variable `api_key_env` names and sent only in the
  Authorization header; cache lines hold the hash and the score, nothing else.

This module imports the API client at once: psyrl.signals.build imports it only when a config names
the judge, so a trainer's import stays free of it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import torch

from psyrl.core.config import JudgeConfig
from psyrl.core.errors import PsyrlError
from psyrl.eval.openai_engine import (
    ApiError,
    ApiOptions,
    Client,
    complete_all,
    request_body,
    url_problem,
)
from psyrl.rl.accuracy import Pair, token_f1

RETRY_WAIT = 1.0  # seconds: the first backoff, doubled per attempt (evaluate's --retry-wait)
FIELDS = ("stimulus", "question", "gold", "prediction")
_PLACEHOLDER = re.compile(r"\{(stimulus|question|gold|prediction)\}")
_SCORE = re.compile(r"SCORE:[ \t]*([+-]?(?:\d+(?:\.\d*)?|\.\d+))")
_KEY = re.compile(r"[0-9a-f]{64}")


class JudgeError(PsyrlError):
    """The judge cannot be used, or did not score a response under `on_failure = "stop"`: the
    message names the endpoint and the error (never the key)."""


def parse_score(text: str) -> float:
    """The score of a judge's answer: its last non-empty line is exactly `SCORE: x`, 0 <= x <= 1.
    ValueError otherwise (the client retries the request)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    match = _SCORE.fullmatch(lines[-1]) if lines else None
    if match is None:
        raise ValueError("the last line is not 'SCORE: <number>'")
    score = float(match.group(1))
    if not 0.0 <= score <= 1.0:
        raise ValueError(f"score {match.group(1)} is outside [0, 1]")
    return score


def read_rubric(path: str) -> str:
    """The rubric's text: `path`, or the shipped one when it is empty. It must hold {gold} and
    {prediction}."""
    if path:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise JudgeError(f"judge.rubric = {path!r}: cannot read it ({e})") from None
    else:
        text = (resources.files("psyrl") / "assets" / "judge" / "rubric.md").read_text("utf-8")
    missing = [f"{{{f}}}" for f in ("gold", "prediction") if f"{{{f}}}" not in text]
    if missing:
        raise JudgeError(f"judge.rubric = {path!r}: it holds no {' or '.join(missing)}")
    return text


def judge_prompt(rubric: str, pair: Pair) -> str:
    """The rubric with the pair's fields in place, in one pass (a field's own text is never
    searched for placeholders)."""
    values = {f: getattr(pair, f).strip() or "(not given)" for f in FIELDS}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], rubric)


def content_key(model: str, rubric: str, pair: Pair) -> str:
    """sha256 over the model, the rubric's text and the pair's four fields: a cached score stands
    for exactly that question to exactly that judge."""
    fields = [model, rubric, pair.stimulus, pair.question, pair.gold, pair.prediction]
    return hashlib.sha256(json.dumps(fields, ensure_ascii=False).encode("utf-8")).hexdigest()


class JudgeSignal:
    """The judge's score per pair, float64 [N] in [0, 1]. After each call, `fallbacks` counts the
    pairs the judge did not score (scored by F1 instead) and `fallback_mask` marks them [N];
    `asked` counts the distinct pairs sent and `last_error` is the last failure's message."""

    name = "judge"

    def __init__(
        self,
        cfg: JudgeConfig,
        cache_dir: Path | str | None = None,
        rank: int = 0,
        retry_wait: float = RETRY_WAIT,
    ):
        if not cfg.model:
            raise JudgeError('reward.accuracy = "judge" needs judge.model (the model it serves)')
        if problem := url_problem(cfg.base_url):
            raise JudgeError(f"judge.base_url: {problem.removeprefix('--base-url ')}")
        self.cfg = cfg
        self.rubric = read_rubric(cfg.rubric)
        self.options = ApiOptions(
            base_url=cfg.base_url,
            model=cfg.model,
            key_env=cfg.api_key_env,
            concurrency=cfg.concurrency,
            timeout=cfg.timeout_s,
            retries=cfg.retries,
            retry_wait=retry_wait,
        )
        self._client()  # a key with control characters is refused now, not at the first step
        self.cache: dict[str, float] = {}
        self.cache_file: Path | None = None
        if cache_dir is not None:
            self.cache_file = Path(cache_dir) / f"rank-{rank}.jsonl"
            self._read_cache(Path(cache_dir))
        self.fallbacks = 0
        self.fallback_mask = torch.zeros(0, dtype=torch.bool)
        self.asked = 0
        self.last_error: str | None = None

    def key(self, pair: Pair) -> str:
        return content_key(self.cfg.model, self.rubric, pair)

    def __call__(self, pairs: Sequence[Pair]) -> torch.Tensor:
        pairs = list(pairs)
        keys = [self.key(p) for p in pairs]
        todo = {k: p for k, p in zip(keys, pairs) if k not in self.cache}  # identical: asked once
        self.asked, self.last_error = len(todo), None
        if todo:
            self._ask(todo)
        mask = [k not in self.cache for k in keys]
        scores = torch.tensor([self.cache.get(k, 0.0) for k in keys], dtype=torch.float64)  # [N]
        if any(mask):
            fell_back = [p for p, m in zip(pairs, mask) if m]
            scores[torch.tensor(mask)] = token_f1(fell_back)  # the paper's F1 stands in
        self.fallbacks = sum(mask)
        self.fallback_mask = torch.tensor(mask, dtype=torch.bool)  # [N]
        return scores

    # ------------------------------------------------------------------------------------ internals
    def _client(self) -> Client:
        """A client per call: one that `complete_all` has stopped takes no more requests."""
        try:
            return Client(self.options, os.environ, accept=lambda c: parse_score(c.text))
        except ApiError as e:
            raise JudgeError(f"judge.api_key_env: {e}") from None

    def _ask(self, todo: dict[str, Pair]) -> None:
        """Asks the judge about `todo` (key -> pair), putting each score in the cache (memory and
        file) as it arrives; raises JudgeError on the first failure under `on_failure = "stop"`."""
        stop = self.cfg.on_failure == "stop"
        deadline = time.monotonic() + self.cfg.step_timeout_s
        model, rubric, max_tokens = self.cfg.model, self.rubric, self.cfg.max_tokens

        def body(job: tuple[str, Pair]) -> dict:
            messages = [{"role": "user", "content": judge_prompt(rubric, job[1])}]
            return request_body(model, messages, 0.0, 1.0, max_tokens, seed=0)

        failed: set[str] = set()
        if self.cache_file:  # the run directory may have been made afresh since (--overwrite)
            self.cache_file.parent.mkdir(parents=True, exist_ok=True)
        sink = self.cache_file.open("a", encoding="utf-8") if self.cache_file else None
        try:
            answers = complete_all(
                self._client(), todo.items(), body, deadline=deadline, keep_failures=not stop
            )
            for (key, _), score in answers:
                if isinstance(score, ApiError):  # on_failure = "f1": this pair falls back
                    failed.add(key)
                    self.last_error = str(score)
                    continue
                self.cache[key] = score
                if sink is not None:
                    sink.write(json.dumps({"key": key, "score": score}) + "\n")
                    sink.flush()
        except ApiError as e:
            raise JudgeError(f"judge ({self.cfg.model}): {e}") from None
        finally:
            if sink is not None:
                os.fsync(sink.fileno())
                sink.close()
        late = sum(1 for k in todo if k not in self.cache and k not in failed)
        if late:  # complete_all ended at the deadline
            message = (
                f"{self.options.url}: {late} of {len(todo)} requests unanswered after "
                f"judge.step_timeout_s = {self.cfg.step_timeout_s:g} s"
            )
            if stop:
                raise JudgeError(f"judge ({self.cfg.model}): {message}")
            self.last_error = message

    def _read_cache(self, cache_dir: Path) -> None:
        """Every record of cache_dir/*.jsonl (this rank's file first; a key's first score wins).
        The last line of a file cut by a crash is ignored, and cut off this rank's own file."""
        cache_dir.mkdir(parents=True, exist_ok=True)
        own = self.cache_file
        if own.exists():
            data = own.read_bytes()
            if data and not data.endswith(b"\n"):
                with own.open("r+b") as f:
                    f.truncate(data.rfind(b"\n") + 1)
        files = sorted(cache_dir.glob("*.jsonl"), key=lambda p: (p != own, p.name))
        for path in files:
            text = path.read_text(encoding="utf-8", errors="replace")
            lines = text.split("\n")
            for number, line in enumerate(lines, 1):
                if not line:
                    continue
                record = _record(line)
                if record is None:
                    if number == len(lines):  # no newline after it: a write cut short
                        continue
                    raise JudgeError(
                        f"{path}:{number}: not a judge cache record (expected "
                        '{"key": <64 hex digits>, "score": <number in [0, 1]>}); remove the line '
                        "or the file to ask the judge again"
                    )
                self.cache.setdefault(*record)


def _record(line: str) -> tuple[str, float] | None:
    try:
        record = json.loads(line)
        key, score = record["key"], record["score"]
    except (ValueError, KeyError, TypeError):
        return None
    if not (isinstance(key, str) and _KEY.fullmatch(key)):
        return None
    if isinstance(score, bool) or not isinstance(score, (int, float)) or not 0 <= score <= 1:
        return None
    return key, float(score)
