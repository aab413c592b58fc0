"""The request bodies of /v1/completions and /v1/chat/completions. Before field validation every body is screened
against the parameter table (openai_params.py): unrecognized names and unsupported values are refused naming
the parameter; accepted no-effect ones are dropped. What is left is checked here field by field."""
from __future__ import annotations

import json
from typing import Any, ClassVar, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, model_validator

from forge import constants
from forge.serve.openai_params import CHAT, COMPLETIONS, refusal, screen

MAX_CHOICES = 256        # prompts x n in one request: each is one generation in the broker
MAX_STOPS = 16
# a model's max_prompt_tokens before the router bounds it to its node (bounded_to_node)
UNBOUNDED = 2**31 - 1


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")
    include_usage: Optional[bool] = None
    include_obfuscation: Optional[bool] = None  # OpenAI's padding of stream events: no effect here
    continuous_usage_stats: Optional[bool] = None        # vLLM's

    @model_validator(mode="after")
    def _supported(self):
        if self.continuous_usage_stats:
            raise refusal("continuous_usage_stats", "stream_options.continuous_usage_stats is not "
                                                    "supported by "
                                                    "forge serve: usage comes once, at the end")
        return self


class StructuredOutputs(BaseModel):
    """vLLM's `structured_outputs` (its current name for guided decoding)."""
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    choice: Optional[list[str]] = Field(None, min_length=1)
    json_schema: Optional[Union[dict, str]] = Field(None, alias="json")
    json_object: Optional[bool] = None
    regex: Optional[Any] = None
    grammar: Optional[Any] = None
    structural_tag: Optional[Any] = None
    whitespace_pattern: Optional[Any] = None
    disable_any_whitespace: Optional[bool] = None           # guided JSON is always compact here
    # forge closes declared objects already (docs)
    disable_additional_properties: Optional[bool] = None
    disable_fallback: Optional[bool] = None  # one guide backend: nothing to fall back to

    @model_validator(mode="after")
    def _supported(self):
        for name in ("regex", "grammar", "structural_tag", "whitespace_pattern"):
            if getattr(self, name) is not None:
                raise refusal(name, f"structured_outputs.{name} is not supported by forge serve: "
                                    "guides are "
                                    "choice and JSON Schema")
        given = [n for n in ("choice", "json_schema", "json_object") if getattr(self, n)]
        if len(given) > 1:
            raise refusal(given[1], "structured_outputs: give one of choice, json, json_object")
        return self


class _Common(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    endpoint: ClassVar[str]
    # The most prompt tokens any tier of the node takes (its largest max_input_len): a field that
    # can only hold more is refused from its length alone, before a single item of it is validated.
    # Validating 4M token ids (or 200k messages) one by one took seconds on the server's event loop,
    # /health included (issue 29).
    max_prompt_tokens: ClassVar[int] = UNBOUNDED

    model: str
    max_tokens: Optional[int] = Field(None, gt=0)
    temperature: Optional[float] = Field(None, ge=0, le=2)
    top_p: Optional[float] = Field(None, gt=0, le=1)
    top_k: Optional[int] = Field(None, ge=-1, le=2**31 - 1)
    n: Optional[int] = Field(None, ge=1, le=MAX_CHOICES)
    stream: Optional[bool] = None
    stream_options: Optional[StreamOptions] = None
    stop: Optional[Union[str, list[str]]] = None
    include_stop_str_in_output: Optional[bool] = None
    seed: Optional[int] = Field(None, ge=-2**63, lt=2**64)
    response_format: Optional[dict] = None
    guided_choice: Optional[list[str]] = Field(None, min_length=1)
    guided_json: Optional[Union[dict, str]] = None
    structured_outputs: Optional[StructuredOutputs] = None
    request_id: Optional[str] = Field(None, min_length=1, max_length=128, pattern=r"^[\w.:-]+$")
    deadline_s: Optional[float] = Field(None, gt=0)

    @model_validator(mode="before")
    @classmethod
    def _screen(cls, data: Any) -> Any:
        data = screen(data, cls.endpoint, set(cls.model_fields))
        if isinstance(data, dict):
            cls._bound_sizes(data)
        return data

    @classmethod
    def _bound_sizes(cls, data: dict) -> None:
        """Refuse, from lengths alone, a field no tier could take (before its items are validated)."""
        so = data.get("structured_outputs")
        for name, choice in (
            ("guided_choice", data.get("guided_choice")),
            ("structured_outputs.choice", so.get("choice") if isinstance(so, dict) else None),
        ):
            if isinstance(choice, list) and len(choice) > constants.MAX_GUIDE_CHOICES:
                raise refusal(name, f"{name}: {len(choice):,} options; at most "
                                    f"{constants.MAX_GUIDE_CHOICES:,} "
                                    "are taken")

    @model_validator(mode="after")
    def _coherent(self):
        if self.stream_options is not None and not self.stream:
            raise refusal("stream_options", "The 'stream_options' parameter is only allowed when "
                                            "'stream' is "
                                            "enabled.")
        if isinstance(self.stop, list) and len(self.stop) > MAX_STOPS:
            raise refusal("stop", f"stop: at most {MAX_STOPS} strings, got {len(self.stop)}")
        if self.guided_json is not None:
            self.guided_json = _schema_of(self.guided_json, "guided_json")
        if self.structured_outputs is not None and self.structured_outputs.json_schema is not None:
            self.structured_outputs.json_schema = _schema_of(self.structured_outputs.json_schema,
                                                             "structured_outputs.json")
        return self

    @property
    def stops(self) -> tuple[str, ...]:
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())


def _schema_of(value: Union[dict, str], param: str) -> dict:
    if isinstance(value, dict):
        return value
    try:
        schema = json.loads(value)
    except ValueError as e:
        raise refusal(
            param, f"{param}: not a JSON Schema object, nor the text of one ({e})"
        ) from None
    except RecursionError:
        raise refusal(
            param, f"{param}: the text is nested too deeply to be a JSON Schema"
        ) from None
    if not isinstance(schema, dict):
        raise refusal(param, f"{param}: a JSON Schema must be an object")
    return schema


Prompt = Union[str, list[str], list[int], list[list[int]]]


class CompletionRequest(_Common):
    endpoint: ClassVar[str] = COMPLETIONS
    prompt: Prompt
    echo: Optional[bool] = None
    best_of: Optional[int] = Field(None, ge=1)

    @classmethod
    def _bound_sizes(cls, data: dict) -> None:
        super()._bound_sizes(data)
        prompt, limit = data.get("prompt"), cls.max_prompt_tokens
        if not isinstance(prompt, list) or not prompt:
            return
        if not isinstance(prompt[0], (list, str)):           # one prompt of token ids
            if len(prompt) > limit:
                raise refusal("prompt", f"prompt: {len(prompt):,} token ids; no model here takes "
                                        "more than "
                                        f"{limit:,} (its max_input_len)")
            return
        if len(prompt) > MAX_CHOICES:
            raise refusal("prompt", f"prompt: {len(prompt):,} prompts is more than {MAX_CHOICES} "
                                    "choices in one "
                                    "request")
        for i, p in enumerate(prompt):
            if isinstance(p, list) and len(p) > limit:
                raise refusal("prompt", f"prompt {i}: {len(p):,} token ids; no model here takes "
                                        "more than "
                                        f"{limit:,} (its max_input_len)")

    @model_validator(mode="after")
    def _prompts(self):
        if self.prompt == [] or (
            isinstance(self.prompt, list) and any(p == [] for p in self.prompt)
        ):
            raise refusal("prompt", "prompt: give a string, token ids, or a non-empty list of them")
        if len(self.prompts) * (self.n or 1) > MAX_CHOICES:
            raise refusal("prompt", f"prompt: {len(self.prompts)} prompts x n={self.n or 1} is "
                                    "more than "
                                    f"{MAX_CHOICES} choices in one request")
        if self.best_of not in (None, 1, self.n or 1):
            raise refusal("best_of", "best_of is not supported by forge serve: no server-side "
                                     "ranking (no "
                                     "logprobs); 1 or n is accepted")
        return self

    @property
    def prompts(self) -> list[Union[str, list[int]]]:
        p = self.prompt
        if isinstance(p, str) or (p and all(isinstance(t, int) for t in p)):
            return [p]
        return list(p)


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")
    role: str
    content: Optional[Union[str, list[dict]]] = None
    name: Optional[str] = None     # no effect: the transcript and chat templates use the role
    refusal: Optional[str] = None  # an earlier assistant turn's refusal: no effect
    tool_calls: Optional[list] = None
    tool_call_id: Optional[str] = None
    function_call: Optional[dict] = None

    @model_validator(mode="after")
    def _text_only(self):
        if self.role not in ("system", "developer", "user", "assistant"):
            raise refusal("role", f"role {self.role!r} is not supported by forge serve: roles are "
                                  "system, "
                                  "developer, user, assistant (no tool calling)")
        for name in ("tool_calls", "tool_call_id", "function_call"):
            if getattr(self, name):
                raise refusal(name, f"{name} is not supported by forge serve: no tool calling")
        for i, part in enumerate(self.content if isinstance(self.content, list) else ()):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise refusal(f"content.{i}.type", f"content parts of type {part.get('type')!r} "
                                                   "are not "
                                                   "supported by forge serve: text parts only")
        if self.content is None:
            raise refusal("content", "content: a message needs text content")
        return self


class ChatRequest(_Common):
    endpoint: ClassVar[str] = CHAT
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Optional[int] = Field(None, gt=0)

    @classmethod
    def _bound_sizes(cls, data: dict) -> None:
        super()._bound_sizes(data)
        messages, limit = data.get("messages"), cls.max_prompt_tokens
        if not isinstance(messages, list):
            return
        parts = len(messages) + sum(len(m["content"]) for m in messages
                                    if isinstance(m, dict) and isinstance(m.get("content"), list))
        if parts > limit:  # every message (every content part) takes a token of the prompt at least
            raise refusal("messages", f"messages: {len(messages):,} messages ({parts:,} with their "
                                      "content parts); "
                                      f"no model here takes a prompt of more than {limit:,} "
                                      "tokens, and each takes "
                                      "one at least")


def bounded_to_node(model: type, max_prompt_tokens: int) -> type:
    """`model` refusing, from their lengths, prompts longer than `max_prompt_tokens` (the node's largest
    max_input_len): the request body a router over that node validates."""
    return type(model.__name__, (model,), {"__module__": model.__module__, "__doc__": model.__doc__,
                                           "max_prompt_tokens": max_prompt_tokens})
