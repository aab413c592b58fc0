"""Chat messages to a prompt, and a finished text to stream pieces.

A chat prompt uses the tokenizer's own chat template where it has one. The embedded tiny model has none (it is
a plain language model), so forge serve falls back to a simple transcript, stated here and in docs/serve.md:
"<role>: <content>" lines followed by "assistant:"."""
from __future__ import annotations

from typing import Any, Iterator

from forge.functions.api import Generation
from forge.requests.chat_template import text_of as _text_of


def _hf_tokenizer(node: Any):
    tokenizers = getattr(node, "tokenizers", None) or {}
    tok = next(iter(tokenizers.values()), None)
    return getattr(tok, "hf", tok)


def prompt_from_messages(node: Any, messages: list[dict]) -> str:
    msgs = [{"role": "system" if m["role"] == "developer" else m["role"], "content": _text_of(m["content"])}
            for m in messages]
    hf = _hf_tokenizer(node)
    if hf is not None and getattr(hf, "chat_template", None):
        # tokenize=False: the node tokenizes the prompt (once per tokenizer on the node) like any other
        try:
            return hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
        except Exception as e:  # noqa: BLE001 - a template's own refusal (e.g. roles must alternate): the client's
            first = (str(e).splitlines() or [type(e).__name__])[0]
            raise ValueError(f"messages: the model's chat template refused them: {first}") from None
    return "".join(f"{m['role']}: {m['content']}\n" for m in msgs) + "assistant:"


def stream_pieces(node: Any, gen: Generation, text: str) -> Iterator[str]:
    """`text` (the output, maybe cut at a stop string) in token-sized pieces: each piece is what one more token
    adds to the decoded prefix, so no piece splits a multi-byte character."""
    tokenizers = getattr(node, "tokenizers", None) or {}
    tok = next(iter(tokenizers.values()), None)
    ids = list(gen.token_ids)
    if tok is None or not ids:
        if text:
            yield text
        return
    sent = 0
    for i in range(1, len(ids) + 1):
        prefix = tok.decode(ids[:i])
        if prefix.endswith("\ufffd") or len(prefix) <= sent:
            continue
        if not text.startswith(prefix[:len(text)]):
            break                                   # this tokenizer's prefixes are not prefixes: send the rest at once
        end = min(len(prefix), len(text))
        if end > sent:
            yield text[sent:end]
            sent = end
        if sent >= len(text):
            return
    if sent < len(text):
        yield text[sent:]
