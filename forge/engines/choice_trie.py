"""A guided choice as the tokens each choice is in the model's own tokenizer: one canonical token
sequence per choice, held in a trie. Both engines guide a choice with it (transformers:
forge/engines/transformers/guided.py; vLLM: forge/engines/vllm/choice.py), so a choice costs the
same tokens on every card: the tokens the tokenizer gives its text, never a longer spelling of the
same text that a character-level grammar would also accept (vLLM's own `choice` lets a model spell
"electronics" in 11 one-letter tokens and run out of max_tokens before it ends).

Pure Python: no torch, no engine library."""
from __future__ import annotations

from typing import Callable, Optional, Sequence, Union


def encode_choices(choices: Sequence[str], encode: Callable[[str], Sequence[int]],
                   decode: Callable[[list[int]], str]) -> Union["ChoiceTrie", str]:
    """The trie of `choices` as `encode` tokenizes each (special tokens left out), or why they
    cannot guide."""
    if not choices or not all(isinstance(c, str) and c for c in choices):
        return "choice must be a non-empty list of non-empty strings"
    encoded = []
    for c in dict.fromkeys(choices):
        ids = tuple(encode(c))
        if decode(list(ids)) != c:
            return f"choice {c!r} does not survive this tokenizer's encode/decode round trip"
        encoded.append(ids)
    return ChoiceTrie(encoded)


def budget_problem(trie: "ChoiceTrie", max_new_tokens: int) -> Optional[str]:
    """Why `max_new_tokens` cannot hold any choice, or None (the guide then fits every answer in the
    budget)."""
    if trie.need[0] > max_new_tokens:
        return (f"max_tokens {max_new_tokens} cannot hold the shortest choice ({trie.need[0]} "
                "tokens with this "
                f"tokenizer)")
    return None


class ChoiceTrie:
    """Token trie of the choices; `need[n]` = fewest tokens from node n to a complete choice."""

    def __init__(self, encoded: Sequence[tuple[int, ...]]):
        self.children: list[dict[int, int]] = [{}]
        self.terminal: list[bool] = [False]
        for ids in encoded:
            node = 0
            for t in ids:
                nxt = self.children[node].get(t)
                if nxt is None:
                    nxt = len(self.children)
                    self.children[node][t] = nxt
                    self.children.append({})
                    self.terminal.append(False)
                node = nxt
            self.terminal[node] = True
        self.need = [0] * len(self.children)
        # children always have higher ids than their parent
        for n in reversed(range(len(self.children))):
            self.need[n] = (
                0 if self.terminal[n] else 1 + min(self.need[c] for c in self.children[n].values())
            )
        # each choice's tokens, in the choices' order
        self.sequences = [tuple(ids) for ids in encoded]
        self.members = set(self.sequences)


class ChoiceState:
    def __init__(self, trie: ChoiceTrie, eos: Sequence[int]):
        self.trie, self.eos = trie, list(eos)
        self.node, self.seen, self.error = 0, 0, None

    def allowed(self, generated: Sequence[int], left: int) -> list[int]:
        t = self.trie
        for tok in generated[self.seen:]:
            nxt = t.children[self.node].get(tok)
            if nxt is None:
                self.error = f"token {tok} left the choice trie"
                return self.eos
            self.node = nxt
        self.seen = len(generated)
        ok = [tok for tok, c in t.children[self.node].items() if 1 + t.need[c] <= left]
        return ok + self.eos if t.terminal[self.node] or not ok else ok

    def finish(self, tokens: Sequence[int]) -> Optional[str]:
        if tuple(tokens) in self.trie.members:
            return None
        return (
            self.error
            or "the output is not one of the choices (max_tokens ran out before a choice completed)"
        )

