"""Every request parameter of OpenAI's completions and chat APIs (and vLLM's extra ones) against
`forge serve` on the tiny model, over real HTTP, mostly through the `openai` client: each supported
one does what OpenAI and vLLM do, each refused one answers 400 "not supported" naming it in OpenAI's
error shape, and docs/serve.md carries the table the code enforces."""
from __future__ import annotations

import json

import httpx
import jsonschema
import pytest

from forge.serve.openai_models import ChatRequest, CompletionRequest
from forge.serve.openai_params import CHAT, COMPLETIONS, PARAMS, markdown_table, params_of
from tests.serve.conftest import REPO, wait_settled

pytestmark = pytest.mark.engine
openai = pytest.importorskip("openai")
MODEL = "tiny-llama-cpu"
MSGS = [{"role": "user", "content": "Who is the Queen?"}]

BAD = {  # a value each refused parameter does not accept
    "presence_penalty": 0.5,
    "frequency_penalty": -1,
    "logit_bias": {"50": 10},
    "suffix": "The end.",
    "best_of": 3,
    "top_logprobs": 2,
    "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "auto",
    "functions": [{"name": "f"}],
    "function_call": "auto",
    "audio": {"voice": "alloy", "format": "wav"},
    "modalities": ["text", "audio"],
    "prediction": {"type": "content", "content": "x"},
    "reasoning_effort": "low",
    "verbosity": "low",
    "web_search_options": {},
    "store": True,
    "service_tier": "flex",
    "guided_regex": "a+",
    "guided_grammar": "root ::= 'a'",
    "structural_tag": "{}",
    "guided_decoding_backend": "xgrammar",
    "guided_whitespace_pattern": " ",
    "use_beam_search": True,
    "length_penalty": 0.5,
    "min_p": 0.1,
    "repetition_penalty": 1.2,
    "min_tokens": 3,
    "ignore_eos": True,
    "stop_token_ids": [2],
    "bad_words": ["x"],
    "allowed_token_ids": [1, 2],
    "skip_special_tokens": False,
    "spaces_between_special_tokens": False,
    "truncate_prompt_tokens": 10,
    "prompt_logprobs": 1,
    "return_tokens_as_token_ids": True,
    "return_token_ids": True,
    "logits_processors": ["x"],
    "priority": 5,
    "cache_salt": "s",
    "kv_transfer_params": {"a": 1},
    "vllm_xargs": {"a": 1},
    "prompt_embeds": "abc",
    "add_generation_prompt": False,
    "continue_final_message": True,
    "chat_template": "{{ x }}",
    "chat_template_kwargs": {"a": 1},
    "documents": [{"a": "b"}],
    "mm_processor_kwargs": {"a": 1},
}
BAD_BY_ENDPOINT = {
    (COMPLETIONS, "logprobs"): 0,
    (CHAT, "logprobs"): True,
    (COMPLETIONS, "add_special_tokens"): False,
    (CHAT, "add_special_tokens"): True,
    (CHAT, "echo"): True,
}
NO_EFFECT = {
    "user": "user-1",
    "metadata": {"k": "v"},
    "parallel_tool_calls": True,
    "prompt_cache_key": "k",
    "safety_identifier": "s",
}


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(
        base_url=served.url + "/v1", api_key="unused-on-loopback", max_retries=0, timeout=60
    )


def body(endpoint: str, **extra) -> dict:
    base = {"model": MODEL, "max_tokens": 1, "temperature": 0}
    base.update({"prompt": "Alice"} if endpoint == COMPLETIONS else {"messages": MSGS})
    return {**base, **extra}


def post(served, endpoint: str, payload: dict) -> httpx.Response:
    return httpx.post(
        served.url + ("/v1/completions" if endpoint == COMPLETIONS else "/v1/chat/completions"),
        json=payload,
        timeout=60,
    )


def test_docs_carry_the_table_the_code_enforces():
    assert markdown_table() in (REPO / "docs" / "serve.md").read_text()
    for endpoint, model in ((COMPLETIONS, CompletionRequest), (CHAT, ChatRequest)):
        supported = {p.name for p in params_of(endpoint).values() if p.status == "supported"}
        # a field so it can be checked against n; refused
        fields = set(model.model_fields) - {"best_of"}
        assert supported == fields, (endpoint, supported ^ fields)


CASES = [(e, p) for p in PARAMS if p.status != "supported"
         for e in ((COMPLETIONS, CHAT) if p.where == "both" else (p.where,))]


@pytest.mark.parametrize("endpoint, p", CASES, ids=[f"{e}-{p.name}" for e, p in CASES])
def test_each_parameter_not_supported_is_refused_by_name(served, endpoint, p):
    ok = post(served, endpoint, body(endpoint, **{p.name: NO_EFFECT.get(p.name)}))
    assert ok.status_code == 200, ok.text  # its default (or a no-effect value) is fine
    bad = BAD_BY_ENDPOINT.get((endpoint, p.name), BAD.get(p.name))
    if p.status == "no effect":
        assert p.name in NO_EFFECT
        return
    assert bad is not None, f"no refused value listed for {p.name}"
    r = post(served, endpoint, body(endpoint, **{p.name: bad}))
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert (
        err["param"] == p.name and err["type"] == "invalid_request_error" and err["code"] == 400
    ), err
    assert err["message"].startswith(f"{p.name} is not supported by forge serve: "), err


def test_numbers_beyond_what_an_engine_holds_are_refused(served):
    for name, value in (("top_k", 2**31), ("seed", 2**64), ("n", 257), ("temperature", 2.5)):
        r = post(served, COMPLETIONS, body(COMPLETIONS, **{name: value}))
        assert r.status_code == 400 and r.json()["error"]["param"] == name, r.text


def test_unrecognized_arguments_are_refused_as_openai_does(client):
    with pytest.raises(openai.BadRequestError, match="Unrecognized request argument supplied: "
                                                     "frobnicate") as e:
        client.completions.create(
            model=MODEL, prompt="x", max_tokens=1, extra_body={"frobnicate": 1}
        )
    assert e.value.body["param"] == "frobnicate"


def test_tools_and_stream_options_refused_like_openai(client):
    with pytest.raises(openai.BadRequestError, match="tools is not supported by forge serve") as e:
        client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2, tools=[
            {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}])
    assert e.value.body["param"] == "tools"
    with pytest.raises(openai.BadRequestError, match="only allowed when 'stream' is enabled") as e:
        client.completions.create(
            model=MODEL, prompt="x", max_tokens=2, stream_options={"include_usage": True}
        )
    assert e.value.body["param"] == "stream_options"


def test_models_retrieve(client):
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.models.retrieve("gpt-4")


def test_a_list_of_prompts_gets_one_choice_per_prompt_and_n(client):
    prompts = ["Alice was", "The Queen said", "The Mock Turtle"]
    single = [
        client.completions.create(model=MODEL, prompt=p, max_tokens=6, temperature=0)
        for p in prompts
    ]
    many = client.completions.create(model=MODEL, prompt=prompts, max_tokens=6, temperature=0, n=2)
    assert [c.index for c in many.choices] == list(range(6))
    assert [c.text for c in many.choices] == [s.choices[0].text for s in single for _ in range(2)]
    assert many.usage.prompt_tokens == sum(s.usage.prompt_tokens for s in single)  # once per prompt
    assert many.usage.completion_tokens == 2 * sum(s.usage.completion_tokens for s in single)
    ids = client.completions.create(
        model=MODEL, prompt=[[1, 450, 700], [1, 300]], max_tokens=3, temperature=0
    )
    assert [c.index for c in ids.choices] == [0, 1] and ids.usage.prompt_tokens == 5
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompts[:2],
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    for j in range(2):
        assert (
            "".join(c.choices[0].text for c in chunks if c.choices and c.choices[0].index == j)
            == single[j].choices[0].text
        )
    assert chunks[-1].usage.completion_tokens == sum(s.usage.completion_tokens for s in single[:2])


def test_structured_outputs_and_the_older_guided_names(client):
    schema = {
        "type": "object",
        "properties": {"mood": {"enum": ["happy", "sad"]}},
        "required": ["mood"],
    }
    for extra in (
        {"structured_outputs": {"choice": ["yes", "no"]}},
        {"guided_choice": ["yes", "no"]},
    ):
        c = client.completions.create(
            model=MODEL, prompt="Is it raining?", max_tokens=4, temperature=1.0, extra_body=extra
        )
        assert c.choices[0].text in ("yes", "no")
    for extra in (
        {"structured_outputs": {"json": schema}},
        {"structured_outputs": {"json": json.dumps(schema)}},
        {"guided_json": schema},
        {"guided_json": json.dumps(schema)},
    ):
        chat = client.chat.completions.create(
            model=MODEL, messages=MSGS, max_tokens=20, extra_body=extra
        )
        jsonschema.validate(json.loads(chat.choices[0].message.content), schema)
    chat = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=20,
                                          extra_body={"structured_outputs": {"json_object": True}})
    assert isinstance(json.loads(chat.choices[0].message.content), dict)
    with pytest.raises(openai.BadRequestError, match="structured_outputs.regex is not supported"):
        client.completions.create(
            model=MODEL,
            prompt="x",
            max_tokens=4,
            extra_body={"structured_outputs": {"regex": "a+"}},
        )
    with pytest.raises(openai.BadRequestError, match="give one guide"):
        client.completions.create(
            model=MODEL,
            prompt="x",
            max_tokens=4,
            extra_body={"structured_outputs": {"choice": ["a"]}, "guided_choice": ["b"]},
        )


def test_stop_counts_only_the_tokens_returned(client, served):
    prompt = "Alice was beginning to"
    full = client.completions.create(model=MODEL, prompt=prompt, max_tokens=40, temperature=0)
    text = full.choices[0].text
    stop = next(w for w in (" the", " and", " of", " a") if w in text[3:])
    at = text.index(stop)
    from forge.functions.api import GenerateParams

    gen = served.call(served.node.submit, prompt, GenerateParams(max_tokens=40)).generation
    tok = next(iter(served.node.tokenizers.values()))
    expected = next(
        k
        for k in range(1, len(gen.token_ids) + 1)
        if tok.decode(gen.token_ids[:k]).startswith(text[: at + len(stop)])
    )
    cut = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=40, temperature=0, stop=[stop, "zzz"]
    )
    assert cut.choices[0].text == text[:at] and cut.choices[0].finish_reason == "stop"
    assert cut.usage.completion_tokens == expected < full.usage.completion_tokens
    assert cut.choices[0].model_extra["stop_reason"] == stop
    kept = client.completions.create(
        model=MODEL,
        prompt=prompt,
        max_tokens=40,
        temperature=0,
        stop=stop,
        extra_body={"include_stop_str_in_output": True},
    )
    assert (
        kept.choices[0].text == text[: at + len(stop)] and kept.usage.completion_tokens == expected
    )
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=prompt,
            max_tokens=40,
            temperature=0,
            stop=stop,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == text[:at]
    assert chunks[-1].usage.completion_tokens == expected


def test_seeds_make_sampling_reproducible(client):
    def sample(seed, n=1):
        return [
            c.text
            for c in client.completions.create(
                model=MODEL, prompt="The Queen said", max_tokens=12, temperature=1.2, seed=seed, n=n
            ).choices
        ]

    assert sample(11) == sample(11)
    assert len({sample(s)[0] for s in (1, 2, 3, 4)}) > 1
    three = sample(11, n=3)
    assert three[0] == sample(11)[0] and len(set(three)) > 1  # choice i samples with seed + i


def test_echo_request_id_and_chat_default_length(client, served):
    c = client.completions.create(
        model=MODEL, prompt="Alice was", max_tokens=4, temperature=0, echo=True
    )
    plain = client.completions.create(model=MODEL, prompt="Alice was", max_tokens=4, temperature=0)
    assert c.choices[0].text == "Alice was" + plain.choices[0].text
    r = httpx.post(
        served.url + "/v1/completions", json=body(COMPLETIONS, request_id="job-7.a"), timeout=60
    )
    assert r.json()["id"] == "cmpl-job-7.a"
    chat = client.chat.completions.create(model=MODEL, messages=MSGS, temperature=0)
    # not OpenAI's 16
    assert chat.usage.completion_tokens > 16 or chat.choices[0].finish_reason == "stop"
    assert wait_settled(served.url) == {
        "open_requests": 0,
        "pending": 0,
        "in_flight": 0,
        "kv_reserved": 0,
        "gate_active": 0,
    }
