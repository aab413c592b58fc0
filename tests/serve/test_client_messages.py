"""What a client of `forge serve` reads when something is wrong: a field the body lacks that the
function reads is a 400 naming the field and where the function read it, and a JSON body sent
without a JSON content-type (none at all, or curl -d's form type) is read as JSON instead of refused
as "not a dictionary". Real HTTP to a served tiny node."""
import json
import socket

import httpx

BODY = {"model": "tiny-llama-cpu", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _raw_post(url: str, path: str, body: bytes, ctype: bytes | None) -> tuple[int, dict]:
    """A POST exactly as given (httpx would add a content-type of its own)."""
    host, port = url.split("//")[1].split(":")
    head = (
        b"POST "
        + path.encode()
        + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-length: "
        + str(len(body)).encode()
        + b"\r\n"
        + (b"content-type: " + ctype + b"\r\n" if ctype else b"")
        + b"\r\n"
    )
    with socket.create_connection((host, int(port)), timeout=60) as s:
        s.sendall(head + body)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1])


def test_a_field_the_body_lacks_is_the_clients_error_with_where_it_was_read(served):
    # record["text"]: KeyError
    r = httpx.post(served.url + "/v1/functions/classify", json={"id": 1}, timeout=30)
    assert r.status_code == 400
    message = r.json()["error"]["message"]
    assert message.startswith("the record has no field 'text', which classify reads (at ") \
        and "classify.py" in message, message


def test_a_json_body_without_a_json_content_type_is_read_as_json(served):
    body = json.dumps(BODY).encode()
    for ctype in (None, b"application/x-www-form-urlencoded", b"text/plain; charset=utf-8"):
        status, answer = _raw_post(served.url, "/v1/chat/completions", body, ctype)
        assert status == 200, (ctype, answer)
        assert answer["choices"][0]["message"]["role"] == "assistant"
    status, answer = _raw_post(served.url, "/v1/functions/summarize",
                               json.dumps({"id": "a", "text": "Alice sat."}).encode(), None)
    assert status == 200 and answer["id"] == "a", answer
    status, answer = _raw_post(served.url, "/v1/chat/completions", b"{not json", None)
    assert status == 400 and "valid dictionary" not in answer["error"]["message"], answer
