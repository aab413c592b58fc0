"""The official OpenAI client's structured-output helper against a real `forge serve` (a subprocess)
on the embedded tiny node: `client.chat.completions.parse(response_format=PydanticModel)` gets a
parsed object, also when the guide closed the JSON because max_tokens ran out (answered
finish_reason "stop", stop_reason saying so, never "length", which the helper raises
LengthFinishReasonError on)."""
import os
import subprocess
import sys
import time
from typing import Literal

import pytest
from pydantic import BaseModel

from tests.reliability._rel import REPO

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.engine


class Ticket(BaseModel):
    topic: Literal["weather", "travel", "trade", "other"]
    urgent: bool
    summary: str


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("serve")
    ready = tmp / "url"
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "FORGE_HOME": str(tmp / "home"),
        "PYTHONUNBUFFERED": "1",
    }
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "forge",
            "serve",
            "functions/classify.py",
            "--node",
            "local",
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
    t0 = time.monotonic()
    while not (ready.exists() and ready.read_text().strip()):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() - t0 < 120, "forge serve did not come up"
        time.sleep(0.1)
    yield openai.OpenAI(
        base_url=ready.read_text().strip() + "/v1", api_key="unused", max_retries=0, timeout=120
    )
    proc.terminate()
    proc.wait(timeout=60)


MESSAGES = [{"role": "user", "content": "The storm closed the harbour; ships wait. File a ticket."}]


# the tier's default (128), and tight budgets
@pytest.mark.parametrize("max_tokens", [None, 40, 56])
def test_parse_returns_the_model_object_when_the_guide_closed_the_json(served, max_tokens):
    kw = {} if max_tokens is None else {"max_tokens": max_tokens}
    out = served.chat.completions.parse(
        model="tiny-llama-cpu", messages=MESSAGES, response_format=Ticket, temperature=0, **kw
    )
    choice = out.choices[0]
    assert isinstance(choice.message.parsed, Ticket)
    assert choice.finish_reason == "stop"
    assert Ticket.model_validate_json(choice.message.content) == choice.message.parsed
    # the budget ran out: the guide closed it
    if out.usage.completion_tokens == (max_tokens or 128):
        assert choice.model_extra.get("stop_reason") == "guided_output_closed_at_max_tokens"


def test_the_beta_helper_too_and_plain_text_still_says_length(served):
    out = served.beta.chat.completions.parse(
        model="tiny-llama-cpu",
        messages=MESSAGES,
        response_format=Ticket,
        temperature=0,
        max_tokens=40,
    )
    assert isinstance(out.choices[0].message.parsed, Ticket)
    plain = served.chat.completions.create(
        model="tiny-llama-cpu", messages=MESSAGES, max_tokens=4, temperature=0
    )
    # unguided text cut by max_tokens is cut: "length"
    assert plain.choices[0].finish_reason == "length"
