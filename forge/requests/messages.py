"""Chat messages as a request carries them (llm.chat, the control endpoint's `messages`, forge
serve's chat completions): `Chat`, checked once where the messages come in. The node makes them a
prompt with the model's template (chat_template.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from forge import constants
from forge.errors import RequestRejected


@dataclass(frozen=True)
class Chat:
    """A prompt given as chat messages; made with Chat.of, which checks them (once, at the edge they
    came in by)."""

    messages: tuple[dict, ...]
    # a model without a template gets the plain transcript (forge serve)
    transcript_fallback: bool = False

    @classmethod
    def of(cls, messages: Any, *, transcript_fallback: bool = False) -> "Chat":
        return cls(tuple(normalize(messages)), transcript_fallback)


def text_of(content: Any) -> str:
    """A message's content: a string, or OpenAI-style text parts [{"type": "text", "text": ...}]."""
    if isinstance(content, str):
        return content
    if not isinstance(content, (list, tuple)):
        raise ValueError("content must be a string or a list of text parts, got "
                         f"{type(content).__name__}")
    parts = []
    for part in content:
        if (
            not isinstance(part, dict)
            or part.get("type") != "text"
            or not isinstance(part.get("text"), str)
        ):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ValueError(f"message content parts must be text parts; got type {kind!r}")
        parts.append(part["text"])
    return "".join(parts)


def normalize(messages: Any) -> list[dict]:
    """[{"role", "content": str}] from what a caller gave, or RequestRejected naming the first bad
    message."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise RequestRejected("messages must be a non-empty list of {'role': ..., 'content': ...} "
                              "dicts")
    if len(messages) > constants.MAX_CHAT_MESSAGES:
        raise RequestRejected(f"messages: {len(messages)} messages; at most "
                              f"{constants.MAX_CHAT_MESSAGES} are taken")
    out = []
    for i, m in enumerate(messages):
        if (
            not isinstance(m, dict)
            or not isinstance(m.get("role"), str)
            or not m["role"]
            or "content" not in m
        ):
            raise RequestRejected(f"messages[{i}] must be a dict with a non-empty string 'role' "
                                  "and a 'content'")
        try:
            content = text_of(m["content"])
        except ValueError as e:
            raise RequestRejected(f"messages[{i}]: {e}") from None
        role = "system" if m["role"] == "developer" else m["role"]
        out.append({"role": role, "content": content})
    return out
