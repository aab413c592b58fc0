"""Every request parameter of OpenAI's completions and chat completions APIs, and vLLM's extra ones,
with what forge serve does with it: `supported` (a field of the request models in openai_api.py),
`no effect` (accepted in the values listed, which change nothing here), or `refused` (only its
default value is accepted; anything else is a 400 "not supported" naming the parameter). A name in
none of these is refused as unrecognized, as OpenAI does. docs/serve.md carries this table;
tests/serve/test_openai_params.py checks the two agree."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

from pydantic_core import PydanticCustomError

BOTH, COMPLETIONS, CHAT = "both", "completions", "chat"


def _none(v: Any) -> bool:
    return v is None


def _falsy(v: Any) -> bool:
    return v is None or v is False


def _empty(v: Any) -> bool:
    return v is None or v == [] or v == {} or v == ""


def _is(*numbers: float) -> Callable[[Any], bool]:
    return lambda v: (
        v is None or (isinstance(v, (int, float)) and not isinstance(v, bool) and v in numbers)
    )


def _any(v: Any) -> bool:
    return True


@dataclass(frozen=True)
class Param:
    name: str
    where: str                    # BOTH | COMPLETIONS | CHAT
    status: str                   # "supported" | "no effect" | "refused"
    origin: str                   # "OpenAI" | "vLLM" | "forge"
    note: str
    accepts: Callable[[Any], bool] = _none  # for "no effect" / "refused": the values let through


PARAMS: tuple[Param, ...] = (
    # --- OpenAI, both endpoints
    Param(
        "model", BOTH, "supported", "OpenAI", "must name one of the node's tiers (GET /v1/models)"
    ),
    Param(
        "max_tokens",
        BOTH,
        "supported",
        "OpenAI",
        "default 16 for completions; for chat, the tier's max_output_len",
    ),
    Param("temperature", BOTH, "supported", "OpenAI", "0 to 2, default 1"),
    Param("top_p", BOTH, "supported", "OpenAI", "(0, 1]"),
    Param("n", BOTH, "supported", "OpenAI", "choices per prompt; prompts x n at most 256"),
    Param("stream", BOTH, "supported", "OpenAI", "server-sent events (see Streaming)"),
    Param(
        "stream_options",
        BOTH,
        "supported",
        "OpenAI",
        "`include_usage`; refused without "
        "`stream: true`, as "
        "OpenAI does; `include_obfuscation` has no effect; vLLM's `continuous_usage_stats: true` "
        "is refused",
    ),
    Param(
        "stop",
        BOTH,
        "supported",
        "OpenAI",
        "a string or up to 16; the text is cut before the "
        "first match "
        "and `completion_tokens` counts the tokens up to the one that completed it",
    ),
    Param("seed", BOTH, "supported", "OpenAI", "per-request sampling seed (see Sampling)"),
    Param(
        "response_format",
        BOTH,
        "supported",
        "OpenAI",
        "`text`, `json_object`, `json_schema` (guided)",
    ),
    Param(
        "user", BOTH, "no effect", "OpenAI", "an end-user id for OpenAI's abuse monitoring", _any
    ),
    Param(
        "presence_penalty",
        BOTH,
        "refused",
        "OpenAI",
        "no penalties in the engine interface",
        _is(0),
    ),
    Param(
        "frequency_penalty",
        BOTH,
        "refused",
        "OpenAI",
        "no penalties in the engine interface",
        _is(0),
    ),
    Param("logit_bias", BOTH, "refused", "OpenAI", "no logit bias in the engine interface", _empty),
    # --- OpenAI, completions only
    Param(
        "prompt",
        COMPLETIONS,
        "supported",
        "OpenAI",
        "a string, a list of strings, token ids, "
        "or a list of "
        "token-id lists: one choice per prompt (x n), `index` = prompt x n + i, usage summed",
    ),
    Param("echo", COMPLETIONS, "supported", "OpenAI", "the prompt's text before the completion"),
    Param(
        "best_of",
        COMPLETIONS,
        "refused",
        "OpenAI",
        "no server-side ranking (no logprobs); 1 or n is accepted",
    ),
    Param(
        "logprobs",
        COMPLETIONS,
        "refused",
        "OpenAI",
        "the engines return no log-probabilities (0 too)",
        _none,
    ),
    Param("suffix", COMPLETIONS, "refused", "OpenAI", "no insertion mode", _empty),
    # --- OpenAI, chat only
    Param(
        "messages",
        CHAT,
        "supported",
        "OpenAI",
        "roles system, developer, user, assistant; text "
        "content (a "
        "string or text parts); `name` has no effect; tool and image parts are refused",
    ),
    Param("max_completion_tokens", CHAT, "supported", "OpenAI", "as max_tokens (wins over it)"),
    Param("logprobs", CHAT, "refused", "OpenAI", "the engines return no log-probabilities", _falsy),
    Param(
        "top_logprobs", CHAT, "refused", "OpenAI", "the engines return no log-probabilities", _is(0)
    ),
    Param("tools", CHAT, "refused", "OpenAI", "no tool calling", _empty),
    Param(
        "tool_choice",
        CHAT,
        "refused",
        "OpenAI",
        "no tool calling; `none` is accepted",
        lambda v: v is None or v == "none",
    ),
    Param("parallel_tool_calls", CHAT, "no effect", "OpenAI", "no tool calling", _any),
    Param("functions", CHAT, "refused", "OpenAI", "deprecated tool calling", _empty),
    Param(
        "function_call",
        CHAT,
        "refused",
        "OpenAI",
        "deprecated tool calling; `none` is accepted",
        lambda v: v is None or v == "none",
    ),
    Param("audio", CHAT, "refused", "OpenAI", "text only", _none),
    Param(
        "modalities",
        CHAT,
        "refused",
        "OpenAI",
        "text only: `[\"text\"]` is accepted",
        lambda v: v is None or v == ["text"],
    ),
    Param("prediction", CHAT, "refused", "OpenAI", "no predicted outputs", _none),
    Param("reasoning_effort", CHAT, "refused", "OpenAI", "no reasoning models", _none),
    Param("verbosity", CHAT, "refused", "OpenAI", "no verbosity control", _none),
    Param("web_search_options", CHAT, "refused", "OpenAI", "no web search", _none),
    Param("store", CHAT, "refused", "OpenAI", "nothing is stored: `false` is accepted", _falsy),
    Param("metadata", CHAT, "no effect", "OpenAI", "kept by OpenAI with stored completions", _any),
    Param(
        "service_tier",
        CHAT,
        "refused",
        "OpenAI",
        "one tier: `auto` and `default` are accepted",
        lambda v: v in (None, "auto", "default"),
    ),
    Param(
        "prompt_cache_key",
        CHAT,
        "no effect",
        "OpenAI",
        "prefix reuse is automatic (the broker's prefix grouping)",
        _any,
    ),
    Param(
        "safety_identifier",
        CHAT,
        "no effect",
        "OpenAI",
        "an end-user id for OpenAI's abuse monitoring",
        _any,
    ),
    # --- vLLM's extra parameters
    Param("top_k", BOTH, "supported", "vLLM", "0 or -1: off"),
    Param(
        "structured_outputs",
        BOTH,
        "supported",
        "vLLM",
        "`choice`, `json` (a schema or its "
        "text), "
        "`json_object`; `regex`, `grammar`, `structural_tag`, `whitespace_pattern` are refused; "
        "`disable_any_whitespace`, `disable_additional_properties`, `disable_fallback` have no "
        "effect",
    ),
    Param("guided_choice", BOTH, "supported", "vLLM", "older name of structured_outputs.choice"),
    Param("guided_json", BOTH, "supported", "vLLM", "older name of structured_outputs.json"),
    Param("include_stop_str_in_output", BOTH, "supported", "vLLM", "keep the matched stop string"),
    Param("request_id", BOTH, "supported", "vLLM", "used in the response's `id`"),
    Param("guided_regex", BOTH, "refused", "vLLM", "guides are choice and JSON Schema", _none),
    Param("guided_grammar", BOTH, "refused", "vLLM", "guides are choice and JSON Schema", _none),
    Param("structural_tag", BOTH, "refused", "vLLM", "guides are choice and JSON Schema", _none),
    Param(
        "guided_decoding_backend", BOTH, "refused", "vLLM", "one guide backend per engine", _none
    ),
    Param("guided_whitespace_pattern", BOTH, "refused", "vLLM", "guided JSON is compact", _none),
    Param("use_beam_search", BOTH, "refused", "vLLM", "no beam search", _falsy),
    Param("length_penalty", BOTH, "refused", "vLLM", "no beam search", _is(1)),
    Param("min_p", BOTH, "refused", "vLLM", "not in the engine interface", _is(0)),
    Param("repetition_penalty", BOTH, "refused", "vLLM", "not in the engine interface", _is(1)),
    Param("min_tokens", BOTH, "refused", "vLLM", "not in the engine interface", _is(0)),
    Param("ignore_eos", BOTH, "refused", "vLLM", "not in the engine interface", _falsy),
    Param("stop_token_ids", BOTH, "refused", "vLLM", "stop strings only", _empty),
    Param("bad_words", BOTH, "refused", "vLLM", "not in the engine interface", _empty),
    Param("allowed_token_ids", BOTH, "refused", "vLLM", "not in the engine interface", _empty),
    Param(
        "skip_special_tokens",
        BOTH,
        "refused",
        "vLLM",
        "special tokens are always skipped: `true` is accepted",
        lambda v: v is None or v is True,
    ),
    Param(
        "spaces_between_special_tokens",
        BOTH,
        "refused",
        "vLLM",
        "the tokenizer's own decoding: `true` is accepted",
        lambda v: v is None or v is True,
    ),
    Param("truncate_prompt_tokens", BOTH, "refused", "vLLM", "prompts are never truncated", _none),
    Param("prompt_logprobs", BOTH, "refused", "vLLM", "no log-probabilities", _none),
    Param("return_tokens_as_token_ids", BOTH, "refused", "vLLM", "no log-probabilities", _falsy),
    Param("return_token_ids", BOTH, "refused", "vLLM", "token ids are not returned", _falsy),
    Param("logits_processors", BOTH, "refused", "vLLM", "no custom processors", _empty),
    Param(
        "priority",
        BOTH,
        "refused",
        "vLLM",
        "online requests all have one priority, above bulk jobs",
        _is(0),
    ),
    Param("cache_salt", BOTH, "refused", "vLLM", "no prefix-cache isolation", _none),
    Param("kv_transfer_params", BOTH, "refused", "vLLM", "no disaggregated serving", _none),
    Param("vllm_xargs", BOTH, "refused", "vLLM", "no extension arguments", _empty),
    Param(
        "add_special_tokens",
        COMPLETIONS,
        "refused",
        "vLLM",
        "prompts are tokenized the tokenizer's way: `true` is accepted",
        lambda v: v is None or v is True,
    ),
    Param("prompt_embeds", COMPLETIONS, "refused", "vLLM", "no embedding inputs", _none),
    Param(
        "add_special_tokens",
        CHAT,
        "refused",
        "vLLM",
        "the chat template adds them: `false` is accepted",
        _falsy,
    ),
    Param("echo", CHAT, "refused", "vLLM", "no echo in chat", _falsy),
    Param(
        "add_generation_prompt",
        CHAT,
        "refused",
        "vLLM",
        "always added: `true` is accepted",
        lambda v: v is None or v is True,
    ),
    Param("continue_final_message", CHAT, "refused", "vLLM", "not supported", _falsy),
    Param("chat_template", CHAT, "refused", "vLLM", "the tokenizer's own template", _none),
    Param("chat_template_kwargs", CHAT, "refused", "vLLM", "the tokenizer's own template", _empty),
    Param("documents", CHAT, "refused", "vLLM", "no retrieval documents", _empty),
    Param("mm_processor_kwargs", CHAT, "refused", "vLLM", "text only", _empty),
    # --- forge's own
    Param(
        "deadline_s", BOTH, "supported", "forge", "seconds this request may take (see Deadlines)"
    ),
)


def params_of(endpoint: str) -> dict[str, Param]:
    return {p.name: p for p in PARAMS if p.where in (BOTH, endpoint)}


def refusal(param: str, message: str) -> PydanticCustomError:
    """A validation error that the error handler reports as `message`, naming `param`."""
    return PydanticCustomError("forge_refused", "{message}", {"message": message, "param": param})


def screen(body: Any, endpoint: str, fields: set[str]) -> Any:
    """The body with accepted no-effect and default-valued parameters removed; a 400 for the first
    parameter that is unrecognized or not supported in the value given."""
    if not isinstance(body, dict):
        return body
    table = params_of(endpoint)
    out = {}
    for key, value in body.items():
        if key in fields:
            out[key] = value
            continue
        p: Optional[Param] = table.get(key)
        if p is None:
            raise refusal(key, f"Unrecognized request argument supplied: {key}")
        if not p.accepts(value):
            raise refusal(key, f"{key} is not supported by forge serve: {p.note}")
    return out


def markdown_table() -> str:
    """The table docs/serve.md carries (a test checks it is there, unchanged)."""
    where = {BOTH: "both", COMPLETIONS: "completions", CHAT: "chat"}
    rows = [
        "| parameter | endpoint | from | forge serve | what it does here |",
        "| --- | --- | --- | --- | --- |",
    ]
    for p in PARAMS:
        rows.append(f"| `{p.name}` | {where[p.where]} | {p.origin} | {p.status} | {p.note} |")
    return "\n".join(rows)
