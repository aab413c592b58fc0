"""The whole batch file checked before any engine loads: one line per bad input line, naming file,
line and custom_id; the bodies go through forge serve's OpenAI request models (the same
refusals)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from forge.errors import ForgeError
from forge.openai_batch.lines import (
    SHOWN_PROBLEMS,
    check_file,
    check_line,
    refuse_problems,
    LineRefused,
)


def line(cid, url="/v1/chat/completions", **body):
    body = {"model": "m", **body}
    if url == "/v1/chat/completions":
        body.setdefault("messages", [{"role": "user", "content": "hi"}])
    elif url == "/v1/completions":
        body.setdefault("prompt", "hi")
    else:
        body.setdefault("input", "hi")
    return {"custom_id": cid, "method": "POST", "url": url, "body": body}


def write(tmp: Path, rows) -> Path:
    p = tmp / "batch.jsonl"
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def refusal_of(path: Path) -> list[str]:
    with pytest.raises(ForgeError) as e:
        refuse_problems(check_file(path))
    return str(e.value).splitlines()


def test_a_good_file_passes_and_names_its_models(tmp_path):
    p = write(tmp_path, [line("a", max_tokens=4, temperature=0, stop=["x"], seed=3),
                         line("b", "/v1/completions", model="n", max_tokens=2),
                         line("c", "/v1/embeddings", input=["x", "y"], encoding_format="base64")])
    checked = check_file(p)
    refuse_problems(checked)                     # nothing refused
    assert checked.lines == 3 and checked.models == {"m": 1, "n": 2}


def test_duplicate_custom_ids_are_one_line_each_naming_file_line_and_id(tmp_path):
    p = write(tmp_path, [line("a"), line("b"), line("a"), line("a")])
    lines = refusal_of(p)
    assert lines[0] == f"{p}:3: custom_id 'a': duplicate custom_id (first on line 1)"
    assert lines[1] == f"{p}:4: custom_id 'a': duplicate custom_id (first on line 1)"
    assert lines[-1].startswith(f"{p}: 2 of 4 batch lines refused; nothing ran")


@pytest.mark.parametrize("row, expected", [
    (line("a", n=2), "n=2: a batch line answers one choice"),
    (line("a", stream=True), "stream: a batch line is answered whole"),
    (line("a", logit_bias={"1": 3}), "logit_bias is not supported by forge serve"),
    (line("a", frobnicate=1), "Unrecognized request argument supplied: frobnicate"),
    (line("a", temperature=3), "temperature: Input should be less than or equal to 2"),
    (line("a", response_format={"type": "json_schema", "json_schema": {"name": "x"}}),
     "response_format.json_schema.schema must be a JSON Schema object"),
    (line("a", "/v1/embeddings", dimensions=8), "dimensions is not supported by forge"),
    (line("a", "/v1/completions", prompt=[]), "prompt: give a string, token ids"),
    ({**line("a"), "method": "GET"}, "method 'GET': batch requests are POST"),
    ({**line("a"), "url": "/v1/responses"}, "url '/v1/responses' is not one forge answers"),
    ({**line("a"), "extra": 1}, "unknown field 'extra'"),
])
def test_each_unsupported_line_is_refused_with_its_reason(tmp_path, row, expected):
    p = write(tmp_path, [line("ok"), row])
    first = refusal_of(p)[0]
    assert first.startswith(f"{p}:2: custom_id 'a': ") and expected in first, first


def test_unreadable_lines_and_missing_ids_are_named_by_line(tmp_path):
    p = write(tmp_path, ["not json", {**line("x"), "custom_id": 7}, line("y")])
    lines = refusal_of(p)
    assert lines[0].startswith(f"{p}:1: ") and "not valid JSON" in lines[0]
    assert lines[1] == f"{p}:2: custom_id must be a non-empty string"


def test_many_problems_are_bounded_and_counted(tmp_path):
    p = write(tmp_path, [line("same") for _ in range(SHOWN_PROBLEMS + 11)])
    lines = refusal_of(p)
    assert len(lines) == SHOWN_PROBLEMS + 2
    assert lines[-2] == "... and 10 more line(s) with problems"


def test_an_empty_file_is_refused(tmp_path):
    p = tmp_path / "empty.jsonl"
    p.write_text("")
    assert refusal_of(p) == [f"{p}: no batch lines (an empty file)"]


def test_check_line_gives_the_request_models_of_forge_serve():
    cid, url, req = check_line(line("a", max_completion_tokens=5, stop="!"))
    assert (cid, url, req.max_completion_tokens, req.stops) == (
        "a",
        "/v1/chat/completions",
        5,
        ("!",),
    )
    with pytest.raises(LineRefused) as e:
        check_line(line("a", top_logprobs=2))
    assert e.value.param == "top_logprobs"
