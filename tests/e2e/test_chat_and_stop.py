"""llm.chat and llm.generate(stop=...) through `forge run` and `forge deploy` on the real
transformers engine: the embedded tiny-llama has no chat template (llm.chat is refused in one line,
the record's error row says so); a copy of it with a small template added gets the template's
prompt; stop strings cut the text, the finish reason and the token count."""
import json
import os
import shutil
import subprocess
import sys
import time

import pytest

from tests.forge_cli import fill_in
from tests.reliability._rel import REPO, assert_no_traceback, forge

FN = REPO / "tests" / "e2e" / "fixtures" / "chat_stop.py"
TINY = REPO / "forge" / "embedded" / "tiny-llama"
TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}"
            "{% if add_generation_prompt %}<|assistant|>{% endif %}")
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me about "
                                                                                    "the Queen."}]
AS_PROMPT = "<|system|>Be brief.\n<|user|>Tell me about the Queen.\n<|assistant|>"


def _templated_node(tmp_path):
    """A copy of the tiny model with a chat template, and a contract + node for it (made by `forge
    contract new`)."""
    model = tmp_path / "tiny-chat"
    shutil.copytree(TINY, model)
    cfg = json.loads((model / "tokenizer_config.json").read_text())
    (model / "tokenizer_config.json").write_text(json.dumps({**cfg, "chat_template": TEMPLATE}))
    r = forge(
        "contract",
        "new",
        model,
        "--card",
        "cpu",
        "--memory-gib",
        "0.25",
        "--max-input-len",
        "256",
        "--max-output-len",
        "64",
        "--out",
        tmp_path / "c.yaml",
        "--node-out",
        tmp_path / "node.yaml",
    )
    assert r.returncode == 0, r.stderr
    return fill_in(tmp_path / "node.yaml", memory_gib=8, cpu_cores=2)


def _input(tmp_path):
    rows = [{"try": "chat", "messages": MESSAGES, "as_prompt": AS_PROMPT},
            {"try": "stop", "text": "Alice said"}, {"try": "stop", "text": "The Queen said"}]
    p = tmp_path / "in.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _rows(out):
    return {r["index"]: r for r in map(json.loads, out.read_text().splitlines())}


def _check_stops(rows):
    for i in (1, 2):
        r = rows[i]["result"]
        full, stop, cut, kept = r["full"], r["stop"], r["cut"], r["kept"]
        assert len(stop) == 3 and full["finish_reason"] in ("eos", "length")
        at = full["text"].find(stop)
        assert cut["text"] == full["text"][:at] and cut["finish_reason"] == "stop"
        assert kept["text"] == full["text"][:at + 3] and kept["finish_reason"] == "stop"
        # counted up to the token that completed the match, not the ones the engine went on to make
        assert 1 <= cut["output_tokens"] == kept["output_tokens"] < full["output_tokens"]


@pytest.mark.timeout(400)
def test_chat_is_refused_without_a_template_and_stop_strings_cut(tmp_path):
    out = tmp_path / "out.jsonl"
    r = forge(
        "run",
        FN,
        "--node",
        REPO / "node_descriptions" / "local.yaml",
        "--input",
        _input(tmp_path),
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
        "--concurrency",
        "1",
        timeout=240,
    )
    assert r.returncode == 3, r.stderr       # complete, with the chat record's error row
    rows = _rows(out)
    err = rows[0]["error"]
    assert err["type"] == "RequestRejected"
    assert err["message"].startswith("llm.chat: the model has no chat template (")
    assert (
        "tokenizer_config.json has no chat_template); build the prompt yourself" in err["message"]
    )
    _check_stops(rows)


@pytest.mark.timeout(400)
def test_chat_applies_the_models_template_on_run_and_on_deploy(tmp_path):
    node = _templated_node(tmp_path)
    out = tmp_path / "out.jsonl"
    r = forge(
        "run",
        FN,
        "--node",
        node,
        "--input",
        _input(tmp_path),
        "--output",
        out,
        "--progress",
        "off",
        "--no-report",
        "--concurrency",
        "1",
        timeout=240,
    )
    assert r.returncode == 0, r.stderr
    rows = _rows(out)
    chat = rows[0]["result"]
    # the same prompt: the template's, tokenized by the node
    assert chat["chat"] == chat["plain"], chat
    _check_stops(rows)

    # forge deploy: the provisioned node applies its own template and stop strings
    env = {**os.environ, "FORGE_HOME": str(tmp_path / "home"), "PYTHONUNBUFFERED": "1"}
    ready = tmp_path / "ready"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "forge",
            "provision",
            str(node),
            "--port",
            "0",
            "--ready-file",
            str(ready),
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        t0 = time.monotonic()
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - t0 < 120
            time.sleep(0.1)
        out2 = tmp_path / "deploy.jsonl"
        d = subprocess.run(
            [
                sys.executable,
                "-m",
                "forge",
                "deploy",
                str(FN),
                "--input",
                str(tmp_path / "in.jsonl"),
                "--output",
                str(out2),
                "--progress",
                "off",
                "--no-report",
                "--concurrency",
                "1",
            ],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )
        assert d.returncode == 0, d.stderr
        assert_no_traceback(d.stderr)
        rows2 = _rows(out2)
        assert rows2[0]["result"] == chat
        _check_stops(rows2)
    finally:
        proc.terminate()
        proc.wait(timeout=60)
