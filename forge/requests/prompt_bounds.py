"""A text prompt's length is checked before it is tokenized, and a long one is tokenized off the
event loop.

Tokenizing is the one cost a request imposes before the broker can refuse it: a 50 MB prompt took
~45 s and 10 GB of memory on the tiny model's tokenizer, on the loop every client shares. But no
token of a tokenizer decodes to more characters than its longest vocabulary entry, so a prompt of C
characters has at least C / longest tokens. A prompt longer than (the largest max_input_len on the
node) x (that tokenizer's longest entry) cannot fit any card and is refused without tokenizing. (A
tokenizer whose normaliser deletes characters, e.g. one that collapses runs of spaces, could fit
such a prompt: it is refused all the same, and the message says why.) What passes is tokenized in a
worker thread when it is long: the Rust tokenizer releases the GIL."""
from __future__ import annotations

from typing import Any, Iterable

from forge.errors import RequestRejected
from forge.requests.params import plain_token_ids, prompt_problem

OFF_LOOP_CHARS = 16_384          # longer text prompts are tokenized in a worker thread
FALLBACK_TOKEN_CHARS = 64        # for a tokenizer that does not show its vocabulary


def longest_token_chars(tokenizer: Any) -> int:
    """The most characters one token of `tokenizer` can stand for (its longest vocabulary entry)."""
    declared = getattr(tokenizer, "max_token_chars", None)
    if isinstance(declared, int) and declared > 0:
        return declared
    for inner in (getattr(tokenizer, "hf", None), getattr(tokenizer, "_tok", None), tokenizer):
        get_vocab = getattr(inner, "get_vocab", None)
        if callable(get_vocab):
            try:
                vocab = get_vocab()
                return max(1, max((len(k) for k in vocab), default=FALLBACK_TOKEN_CHARS))
            except Exception:  # noqa: BLE001 - a tokenizer that cannot list its vocabulary gets the fallback
                break
    return FALLBACK_TOKEN_CHARS


def prompt_chars_limit(cards: Iterable[tuple[int, Any]]) -> int:
    """The most characters a text prompt may have on a node whose cards are (max_input_len,
    tokenizer) pairs."""
    return max((n * longest_token_chars(tok) for n, tok in cards), default=0)


def checked_prompt(prompt: Any, limit_chars: int, node: str) -> str | tuple[int, ...]:
    """The one check of a request's prompt, at the node's edge (Node.submit): text within the node's
    longest prompt and valid Unicode, or token ids an engine can hold (int32), returned as a tuple.
    RequestRejected otherwise."""
    ids = plain_token_ids(prompt)
    if ids is not None:  # token ids as they usually come: checked and copied in C passes
        return ids
    if isinstance(prompt, str):
        check_text_prompt(prompt, limit_chars, node)
        return prompt
    why = prompt_problem(prompt)
    if why is not None:
        raise RequestRejected(why)
    # ints of another type that pass (numpy ints, ...): plain ints from here on
    return tuple(map(int, prompt))


def check_text_prompt(prompt: str, limit_chars: int, node: str) -> None:
    """Refuse, before tokenizing, a prompt that cannot fit any card or is not valid Unicode text."""
    if limit_chars and len(prompt) > limit_chars:
        raise RequestRejected(f"prompt has {len(prompt):,} characters; no prompt of more than "
                              f"{limit_chars:,} "
                              f"characters fits a card on node {node} (max_input_len x the longest "
                              "token of "
                              f"its tokenizer); refused before tokenizing")
    why = prompt_problem(prompt)        # one wording for every edge that takes a prompt
    if why is not None:
        raise RequestRejected(why)
