"""reward.accuracy beyond the paper's F1, end to end (issue 41): a tiny T-GRPO run trains with the
`semantic` signal (the real all-MiniLM-L6-v2 weights) and with the `judge` (a stub
chat-completions server on 127.0.0.1 that scores by a rule), the signal in r_F1's role in the
samples, the logged reward/f1 and the cache's r-bar (eq. 7), the paper's F1 logged beside it; each
run resumed from a checkpoint equals the uninterrupted one bit for bit, the judge's resumed step
read from its score cache without one request; the judge's API key reaches the server and no file
of the run."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from http_stub import serve_posts
from safetensors.torch import load_file
from test_train_tgrpo import rows_without_timing, run_cli

from psyrl.core.runlog import read_metrics

KEY = "sk-psyrl-e2e-SENTINEL-90d2"
RESUME = ["run.steps=3", "checkpoint.every=1", "checkpoint.keep_state=0", "log.samples_every=1"]


def samples(run, step: int) -> list[dict]:
    lines = (run / "samples" / f"step-{step}.jsonl").read_text().splitlines()
    return [json.loads(line) for line in lines]


def cut_after_step_2(tmp_path):
    """(the whole run in a/, its copy in b/ cut back to the step-2 checkpoint)."""
    whole, cut = tmp_path / "a" / "rl", tmp_path / "b" / "rl"
    shutil.copytree(whole, cut)
    shutil.rmtree(cut / "checkpoints" / "step-3")
    shutil.rmtree(cut / "hf")
    return whole, cut


def resume(start, tmp_path, *extra) -> None:
    result = run_cli(start, tmp_path / "b", *RESUME, *extra, resume=True)
    assert "resuming after step 2" in result.stdout


def assert_same_run(whole, cut):
    a = load_file(whole / "hf" / "model.safetensors")
    b = load_file(cut / "hf" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    cache = "checkpoints/step-3/trajectory_cache.json"
    assert (whole / cache).read_text() == (cut / cache).read_text()
    assert rows_without_timing(whole) == rows_without_timing(cut)


def test_semantic_accuracy_trains_and_resumes_exactly(start, tmp_path):
    run_cli(start, tmp_path / "a", *RESUME, "reward.accuracy=semantic")
    whole, cut = cut_after_step_2(tmp_path)
    resume(start, tmp_path, "reward.accuracy=semantic")
    assert_same_run(whole, cut)
    cache = json.loads((whole / "checkpoints/step-3/trajectory_cache.json").read_text())
    for step, row in enumerate(read_metrics(whole / "metrics.jsonl"), 1):
        rows = samples(whole, step)
        semantic = [s["accuracy/semantic"] for s in rows]
        assert [s["f1"] for s in rows] == semantic  # the signal in r_F1's role (eq. 3, 8)
        assert cache["steps"][step - 1]["f1"] == semantic  # r-bar of eq. 7 averages it
        assert row["reward/accuracy/semantic"] == pytest.approx(row["reward/f1"], abs=1e-12)
        assert 0 <= row["reward/accuracy/f1"] <= 1  # the paper's F1, logged beside
        assert all(0 <= v <= 1 for v in semantic) and len(set(semantic)) > 1


class ScoringStub:
    """A chat-completions server that scores a prediction 0.9 when it holds the gold answer's word,
    else 0.2 (not the F1, so the tests see which one the reward used); it counts requests and keeps
    each request's Authorization header."""

    def __init__(self):
        self.requests, self.headers = 0, set()
        self.server, self.url = serve_posts(self.handle)

    def handle(self, handler, body):
        prompt = body["messages"][-1]["content"]
        token = prompt.rsplit("SCORE[", 1)[1].split("]")[0]
        gold = prompt.split(f"<gold {token}>\n")[1].split("\n")[0].strip().lower()
        prediction = prompt.split(f"<prediction {token}>\n")[1].split(f"\n</prediction {token}>")[0]
        score = 0.9 if gold in prediction.strip().lower().split() else 0.2
        self.requests += 1
        self.headers.add(handler.headers.get("Authorization"))
        data = json.dumps(
            {
                "choices": [
                    {
                        "message": {"role": "assistant", "content": f"SCORE[{token}]: {score}"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"completion_tokens": 3},
            }
        ).encode()
        handler.send_response(200)
        handler.send_header("Content-Type", "application/json")
        handler.send_header("Content-Length", str(len(data)))
        handler.end_headers()
        handler.wfile.write(data)


def test_judge_accuracy_trains_resumes_from_its_cache_and_keeps_the_key_out(
    start, tmp_path, monkeypatch
):
    monkeypatch.setenv("PSYRL_JUDGE_API_KEY", KEY)
    stub = ScoringStub()
    try:
        judge = [
            "reward.accuracy=judge",
            f"judge.base_url={json.dumps(stub.url)}",
            'judge.model="stub-judge"',
            "judge.timeout_s=20",
        ]
        run_cli(start, tmp_path / "a", *RESUME, *judge)
        asked = stub.requests
        whole, cut = cut_after_step_2(tmp_path)
        resume(start, tmp_path, *judge)
        # step 3 sampled the same responses again: every score came from the run's cache
        assert stub.requests == asked and asked > 0
    finally:
        stub.server.shutdown()
    assert_same_run(whole, cut)
    assert stub.headers == {f"Bearer {KEY}"}
    for step, row in enumerate(read_metrics(whole / "metrics.jsonl"), 1):
        rows = samples(whole, step)
        assert all(s["accuracy/judge"] in (0.9, 0.2) for s in rows)
        assert [s["f1"] for s in rows] == [s["accuracy/judge"] for s in rows]
        assert row["reward/judge_fallbacks"] == 0
    for path in [*whole.rglob("*"), *cut.rglob("*")]:
        if path.is_file():
            assert KEY.encode() not in path.read_bytes(), path
