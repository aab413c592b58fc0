"""Stop strings applied to a finished generation, as vLLM applies them: the text ends before the
first match (or after it, with include_stop_str_in_output), finish_reason becomes "stop", and the
token count is the tokens up to and including the one that completed the match: only what the answer
stands for, not the tokens the engine went on to generate (it cannot be told to stop: the engine
interface has no stop strings)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Optional

from forge.requests import Generation


@dataclass(frozen=True)
class StopRule:
    strings: tuple[str, ...] = ()
    include: bool = False          # keep the matched string in the text


def apply_stop(gen: Generation, rule: StopRule, tokenizer: Any) -> tuple[Generation, Optional[str]]:
    """(the generation cut at the first stop string, the string matched); unchanged and None without
    a match."""
    hits = [(gen.text.find(s), s) for s in rule.strings if s]
    hits = [(at, s) for at, s in hits if at >= 0]
    if not hits:
        return gen, None
    at, matched = min(hits, key=lambda h: (h[0], -len(h[1])))
    through = at + len(matched)
    tokens = _tokens_through(gen, through, tokenizer)
    cut = replace(gen, text=gen.text[:through if rule.include else at], output_tokens=tokens,
                  finish_reason="stop", token_ids=tuple(gen.token_ids[:tokens]))
    return cut, matched


def _tokens_through(gen: Generation, chars: int, tokenizer: Any) -> int:
    """The fewest leading tokens whose decoded text holds the first `chars` characters of the
    output."""
    ids = list(gen.token_ids)
    if tokenizer is None or not ids:
        return gen.output_tokens
    target = gen.text[:chars]
    lo, hi = 1, len(ids)
    if not tokenizer.decode(ids).startswith(target):
        return gen.output_tokens
    while lo < hi:  # decoded prefixes only grow: binary search for the first that holds it
        mid = (lo + hi) // 2
        if tokenizer.decode(ids[:mid]).startswith(target):
            hi = mid
        else:
            lo = mid + 1
    return lo


class StopHold:
    """Stop strings applied to text that arrives in pieces (Node.stream): `take(piece)` returns what
    may be sent now, and what it returns joins into a prefix of apply_stop's text for the whole.
    Text that could be the start of a stop string is held back until the next piece decides it;
    after a match nothing more is sent."""

    def __init__(self, rule: StopRule):
        self.rule = rule
        self.text = ""                 # everything received
        self.sent = 0                  # characters of it already returned
        self.matched = False
        self._longest = max((len(s) for s in rule.strings), default=0)

    def take(self, piece: str) -> str:
        if self.matched:
            return ""
        self.text += piece
        hits = [at for s in self.rule.strings if s and (at := self.text.find(s)) >= 0]
        if hits:  # apply_stop's cut (the earliest match; the longest there, when included)
            self.matched = True
            safe = len(apply_stop_text(self.text, self.rule))
        else:
            safe = len(self.text) - self._held_back()
        out, self.sent = self.text[self.sent:safe], max(self.sent, safe)
        return out

    def _held_back(self) -> int:
        """Characters at the end of the text that are the start of some stop string."""
        text = self.text
        for n in range(min(self._longest - 1, len(text)), 0, -1):
            tail = text[-n:]
            if any(s.startswith(tail) for s in self.rule.strings if s):
                return n
        return 0


def apply_stop_text(text: str, rule: StopRule) -> str:
    """apply_stop's text alone."""
    hits = [(text.find(s), s) for s in rule.strings if s]
    hits = [(at, s) for at, s in hits if at >= 0]
    if not hits:
        return text
    at, matched = min(hits, key=lambda h: (h[0], -len(h[1])))
    return text[:at + len(matched) if rule.include else at]
