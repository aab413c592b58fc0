"""`forge run --openai-batch` end to end: the real `python -m forge` on the embedded node (the tiny
model through the transformers backend), a real kill -9 in the middle, and the resumed run's output
checked line by line."""
from __future__ import annotations

import base64
import json
import struct
import subprocess
import time
from pathlib import Path

import pytest

from forge.constants import EXIT_ERROR_ROWS, EXIT_FAILED, EXIT_OK
from tests.forge_cli import forge, forge_argv, forge_env

pytestmark = pytest.mark.slow

MODEL = "tiny-llama-cpu"          # the embedded node's tier


def chat(cid, text, **extra):
    return {
        "custom_id": cid,
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": {
            "model": MODEL,
            "messages": [{"role": "user", "content": text}],
            "temperature": 0,
            **extra,
        },
    }


def write(path: Path, rows) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def read(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_every_endpoint_answers_in_input_order_in_vllms_row_shape(tmp_path):
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    rows = [
        chat("chat", "Tell me a story.", max_tokens=6),
        {
            "custom_id": "done",
            "method": "POST",
            "url": "/v1/completions",
            "body": {
                "model": MODEL,
                "prompt": "Alice was",
                "max_tokens": 12,
                "temperature": 0,
                "stop": [" "],
                "echo": True,
            },
        },
        {
            "custom_id": "vec",
            "method": "POST",
            "url": "/v1/embeddings",
            "body": {"model": MODEL, "input": ["hello", "world"], "encoding_format": "base64"},
        },
        chat(
            "json",
            "A number?",
            max_completion_tokens=12,
            response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
        ),
        # longer than any card takes: its own 400
        chat("long", "the Queen said " * 400, max_tokens=4),
    ]
    batch, out = write(tmp_path / "batch.jsonl", rows), tmp_path / "out.jsonl"
    r = forge(
        "run",
        "--openai-batch",
        batch,
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
        timeout=600,
    )
    assert r.returncode == EXIT_ERROR_ROWS, r.stderr
    got = read(out)
    assert [g["custom_id"] for g in got] == ["chat", "done", "vec", "json", "long"]
    for g in got:
        assert set(g) == {"id", "custom_id", "response", "error"}
        assert set(g["response"]) == {"status_code", "request_id", "body"}
    chat_body = got[0]["response"]["body"]
    assert chat_body["object"] == "chat.completion" and chat_body["model"] == MODEL
    assert chat_body["choices"][0]["message"]["role"] == "assistant"
    assert (
        chat_body["usage"]["completion_tokens"] == 6
        and chat_body["choices"][0]["finish_reason"] == "length"
    )
    done = got[1]["response"]["body"]["choices"][0]
    assert done["text"].startswith("Alice was")  # echo
    if done["finish_reason"] == "stop":          # the stop string cut the text, and is named
        assert done["stop_reason"] == " " and " " not in done["text"][len("Alice was") + 1:]
    vectors = got[2]["response"]["body"]["data"]
    assert [v["index"] for v in vectors] == [0, 1]
    width = len(base64.b64decode(vectors[0]["embedding"])) // 4
    assert (
        width > 0
        and len(struct.unpack(f"<{width}f", base64.b64decode(vectors[1]["embedding"]))) == width
    )
    usage = got[2]["response"]["body"]["usage"]  # the node's count of the tokens each input read
    assert usage["prompt_tokens"] >= 2 and usage["total_tokens"] == usage["prompt_tokens"]
    assert isinstance(
        json.loads(got[3]["response"]["body"]["choices"][0]["message"]["content"])["n"], int
    )
    long = got[4]
    assert long["response"]["status_code"] == 400 and long["response"]["body"] is None
    assert long["error"]["error"]["code"] == 400 and "token" in long["error"]["error"]["message"]
    assert "5 rows in input order, 1 of them error rows" in r.stderr


def test_a_model_the_node_does_not_serve_is_refused_before_any_line_runs(tmp_path):
    batch = write(
        tmp_path / "batch.jsonl",
        [
            chat("a", "hi", max_tokens=2),
            {**chat("b", "hi"), "body": {**chat("b", "hi")["body"], "model": "gpt-4o-mini"}},
        ],
    )
    out = tmp_path / "out.jsonl"
    r = forge(
        "run",
        "--openai-batch",
        batch,
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
        timeout=600,
    )
    assert r.returncode == EXIT_FAILED, r.stderr
    assert f"{batch}:2: model 'gpt-4o-mini' is not served by node" in r.stderr
    assert not out.exists() and "Traceback" not in r.stderr


def test_a_kill_9_mid_run_resumes_and_every_line_is_answered_exactly_once(tmp_path):
    n = 240
    batch = write(tmp_path / "batch.jsonl",
                  [chat(f"q{i:03d}", f"Tell me about thing {i}.", max_tokens=48) for i in range(n)])
    out = tmp_path / "out.jsonl"
    rows = tmp_path / "out.jsonl.rows.jsonl"
    argv = forge_argv(
        "run",
        "--openai-batch",
        batch,
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
        "--concurrency",
        "4",
    )
    err = open(tmp_path / "first.err", "w")
    proc = subprocess.Popen(argv, env=forge_env(), stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None:
            if rows.exists() and len(rows.read_bytes().splitlines()) >= 20:
                break
            time.sleep(0.05)
        assert proc.poll() is None, (tmp_path / "first.err").read_text()
        proc.kill()                                        # SIGKILL: no drain, no cleanup
        proc.wait()
    finally:
        err.close()
    assert not out.exists()  # the output is written once every line has its row
    kept = {}
    for raw in rows.read_bytes().splitlines():
        try:
            row = json.loads(raw)
        except ValueError:                                 # a torn last line: cut on resume
            continue
        kept[row["result"]["custom_id"]] = row["result"]["id"]
    assert 20 <= len(kept) < n
    r = forge(
        "run",
        "--openai-batch",
        batch,
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
        timeout=900,
    )
    assert r.returncode == EXIT_OK, r.stderr
    assert "resuming" in r.stderr
    got = read(out)
    # each once, in input order
    assert [g["custom_id"] for g in got] == [f"q{i:03d}" for i in range(n)]
    assert all(g["error"] is None and g["response"]["status_code"] == 200 for g in got)
    # the rows settled before the kill were not answered again: the resumed output keeps their very
    # ids
    assert {g["custom_id"]: g["id"] for g in got if g["custom_id"] in kept} == kept
    assert len({g["id"] for g in got}) == n
    # --restart discards the output at once: a run started over and killed leaves no output of the
    # run before
    with open(tmp_path / "again.err", "w") as again:
        proc = subprocess.Popen(
            [*argv, "--restart"], env=forge_env(), stdout=subprocess.DEVNULL, stderr=again
        )
        deadline = time.monotonic() + 400
        while time.monotonic() < deadline and proc.poll() is None and out.exists():
            time.sleep(0.05)
        proc.kill()
        proc.wait()
    assert not out.exists(), (tmp_path / "again.err").read_text()
