"""A finished text to stream pieces. (Chat messages become a prompt in the node's submit: forge/requests/
chat_template.py.)"""
from __future__ import annotations

from typing import Iterator, Optional

from forge.functions.api import Generation
from forge.node.interface import TextTokenizer


def stream_pieces(tok: Optional[TextTokenizer], gen: Generation, text: str) -> Iterator[str]:
    """`text` (the output, maybe cut at a stop string) in token-sized pieces: each piece is what one more token
    adds to the decoded prefix, so no piece splits a multi-byte character. Whole where `tok` is None (the card's
    tokenizer is not in this process)."""
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
