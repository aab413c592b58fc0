"""Chat messages to a prompt with the model's own chat template (llm.chat, the node's /v1/generate
`messages`, forge serve's /v1/chat/completions): one path, applied by the node that holds the
model's tokenizer (forge/node/linked.py's submit), whatever edge the messages came in by.

The template is the tokenizer's (tokenizer_config.json's `chat_template`), rendered by forge's
bounded renderer (chat_template_render.py): in a worker thread, never on the node's event loop,
within a time and a size limit. A model without a template is refused, never given a made-up
transcript: a function asking for chat wants the model's format. (`forge serve`'s OpenAI chat
endpoint asks for a transcript instead, `Chat.transcript_fallback`, stated in docs/serve.md:
"<role>: <content>" lines followed by "assistant:".)"""
from __future__ import annotations

from typing import Any, Optional, Sequence

from forge.errors import RequestRejected
from forge.requests.chat_template_render import render_template
from forge.requests.messages import Chat


def transcript(messages: Sequence[dict]) -> str:
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


def template_tokenizer(tokenizers: Sequence[Any]) -> Optional[Any]:
    """The tokenizer whose chat template applies on this node (None where there is none); a node
    whose cards run different templates is refused: a conversation has one format."""
    with_template = [t for t in tokenizers if getattr(t, "chat_template", None)]
    if len({t.chat_template for t in with_template}) > 1:
        raise RequestRejected("llm.chat: the node's cards run models with different chat "
                              "templates; give each "
                              "model its own node, or build the prompt yourself and call "
                              "llm.generate")
    return with_template[0] if with_template else None


def apply_template(tokenizers: Sequence[Any], chat: Chat, *, limit_chars: int) -> str:
    """The prompt text for `chat`, with the generation prompt added. Blocking (it may load the full
    tokenizer and renders the template): the node calls it in a worker thread. RequestRejected in
    one line when the model has no chat template, or its template refuses the messages, runs past
    its time or makes more than `limit_chars`."""
    tok = template_tokenizer(tokenizers) if tokenizers else None
    if tok is None and chat.transcript_fallback:
        return transcript(chat.messages)
    if not tokenizers:
        raise RequestRejected("llm.chat: this node keeps no copy of its models' tokenizers here (a "
                              "cluster node), so "
                              "it cannot apply a chat template; build the prompt yourself and call "
                              "llm.generate")
    source = next((getattr(t, "source", "") for t in tokenizers if getattr(t, "source", "")), "")
    if tok is None:
        where = f" ({source}/tokenizer_config.json has no chat_template)" if source else ""
        raise RequestRejected(f"llm.chat: the model has no chat template{where}; build the prompt "
                              "yourself and call "
                              "llm.generate")
    hf = getattr(tok, "hf", tok)
    special = getattr(hf, "special_tokens_map", None) or {}
    where = (
        f"{source}/tokenizer_config.json's chat_template" if source else "the model's chat template"
    )
    return render_template(
        tok.chat_template, list(chat.messages), special, limit_chars=limit_chars, where=where
    )
