"""Chat messages to a prompt with the model's own chat template (llm.chat, the node's /v1/generate `messages`).

The template is the tokenizer's (tokenizer_config.json's `chat_template`), applied by transformers' full tokenizer,
loaded in the node process on the first chat (NodeTokenizer.hf): the one place the node imports transformers. A
model without a template is refused, never given a made-up transcript: a function asking for chat wants the
model's format. (`forge serve`'s OpenAI chat endpoint falls back to a transcript instead: forge/serve/chat.py.)"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from forge import constants
from forge.errors import RequestRejected


def text_of(content: Any) -> str:
    """A message's content: a string, or OpenAI-style text parts [{"type": "text", "text": ...}]."""
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise ValueError(f"content must be a string or a list of text parts, got {type(content).__name__}")
    parts = []
    for part in content:
        if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"message content parts must be text parts; got type {kind!r}")
        parts.append(part["text"])
    return "".join(parts)


def normalize(messages: Any) -> list[dict]:
    """[{"role", "content": str}] from what a caller gave, or RequestRejected naming the first bad message."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise RequestRejected("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    if len(messages) > constants.MAX_CHAT_MESSAGES:
        raise RequestRejected(f"messages: {len(messages)} messages; at most {constants.MAX_CHAT_MESSAGES} are taken")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not m["role"] or "content" not in m:
            raise RequestRejected(f"messages[{i}] must be a dict with a non-empty string 'role' and a 'content'")
        try:
            content = text_of(m["content"])
        except ValueError as e:
            raise RequestRejected(f"messages[{i}]: {e}") from None
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": content})
    return out


def template_tokenizer(tokenizers: Sequence[Any]) -> Optional[Any]:
    """The tokenizer whose chat template applies on this node (None where there is none); a node whose cards run
    different templates is refused: a conversation has one format."""
    with_template = [t for t in tokenizers if getattr(t, "chat_template", None)]
    if len({t.chat_template for t in with_template}) > 1:
        raise RequestRejected("llm.chat: the node's cards run models with different chat templates; give each "
                              "model its own node, or build the prompt yourself and call llm.generate")
    return with_template[0] if with_template else None


def apply_template(tokenizers: Sequence[Any], messages: Any) -> str:
    """The prompt text for `messages`, with the generation prompt added; RequestRejected in one line when the model
    has no chat template or its template refuses the messages (roles that must alternate, ...)."""
    msgs = normalize(messages)
    if not tokenizers:
        raise RequestRejected("llm.chat: this node keeps no copy of its models' tokenizers here (a cluster node), so "
                              "it cannot apply a chat template; build the prompt yourself and call llm.generate")
    tok = template_tokenizer(tokenizers)
    if tok is None:
        source = next((getattr(t, "source", "") for t in tokenizers if getattr(t, "source", "")), "")
        where = f" ({source}/tokenizer_config.json has no chat_template)" if source else ""
        raise RequestRejected(f"llm.chat: the model has no chat template{where}; build the prompt yourself and call "
                              "llm.generate")
    hf = getattr(tok, "hf", tok)
    try:
        # tokenize=False: the node tokenizes the prompt (once per tokenizer on the node) like any other
        return hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    except Exception as e:  # noqa: BLE001 - the template's own refusal: the caller's messages
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise RequestRejected(f"llm.chat: the model's chat template refused the messages: {first}") from None
