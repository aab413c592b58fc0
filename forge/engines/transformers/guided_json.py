"""The JSON half of guided output (see guided.py): the schema as forge compiles it, the per-request
state over an llguidance matcher, and the force-close that keeps a JSON result complete when
max_tokens runs short.

The guide computes a short completion from where the output stands (closing quotes and brackets
first, then forced keys, then the smallest scalars). While the budget leaves little room beyond it,
each step allows only those of the model's best few tokens after which the JSON can still be closed
in the tokens left, and otherwise follows the plan: the invariant "a completion fits" then holds to
the end. The result is valid JSON, cut short where the budget demanded; if the closer finds no
completion at all, an error, never bad text."""
from __future__ import annotations

from typing import Any, Optional, Sequence

import torch

# with at most this many tokens to spare beyond its closing plan, a JSON guide checks every step
# (one token can lengthen the plan a lot: opening an object with required keys)
LOOKAHEAD_SLACK = 48
# ...which of the model's best few tokens still leave room to close; it samples among those
LOOKAHEAD = 4
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 -_.!?'"
_DATA_KEYS = frozenset({"enum", "const", "default", "examples", "required"})
_MAP_KEYS = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)


def strict_objects(schema: Any) -> Any:
    """A copy of the schema where objects with declared properties and no `additionalProperties` get
    `false`. Every document valid under the result is valid under the original."""
    if isinstance(schema, list):
        return [strict_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {}
    for k, v in schema.items():
        if k in _DATA_KEYS:
            out[k] = v
        elif k in _MAP_KEYS and isinstance(v, dict):
            out[k] = {name: strict_objects(sub) for name, sub in v.items()}
        else:
            out[k] = strict_objects(v)
    if "properties" in out and "additionalProperties" not in out and "patternProperties" not in out:
        out["additionalProperties"] = False
    return out


def in_string_after(text: str, state: tuple[bool, bool]) -> tuple[bool, bool]:
    """(inside a JSON string, after a backslash) once `text` follows a position in that state."""
    inside, escaped = state
    for ch in text:
        if escaped:
            escaped = False
        elif inside and ch == "\\":
            escaped = True
        elif ch == '"':
            inside = not inside
    return inside, escaped


class Closer:
    """What the force-close prefers, per lexical position: inside a string, the quote (then plain
    characters, for a minLength); outside, brackets and braces (then the smallest scalars, a quote,
    separators, letters). Orders are fixed here, never left to the vocabulary's (unordered)
    iteration."""

    def __init__(self, texts: dict[int, str]):
        self.texts = texts
        close = sorted(
            (i for i, t in texts.items() if t and set(t) <= set('"}]')),
            key=lambda i: (-len(texts[i]), i),
        )
        single = {t: i for i, t in sorted(texts.items()) if len(t) == 1}
        pick = lambda chars: [single[c] for c in chars if c in single]    # noqa: E731
        self.in_string = [i for i in close if texts[i].startswith('"')] + pick(_LETTERS)
        self.outside = (
            [i for i in close if '"' not in texts[i]]
            + pick("0123456789tfn")
            + pick('"')
            + [i for i in close if '"' in texts[i] and len(texts[i]) > 1]
            + pick(",:{[")
            + pick(_LETTERS)
        )

    def plan(self, matcher, state: tuple[bool, bool], limit: int) -> Optional[list[int]]:
        """A short token sequence that completes the JSON from the matcher's state, or None if none
        is found within `limit` tokens."""
        m = matcher.deep_copy()
        plan: list[int] = []
        while len(plan) < limit:
            if m.is_accepting():
                return plan
            ff = m.compute_ff_tokens()[: limit - len(plan)]
            if not ff:
                bias = m.compute_logit_bias()
                order = self.in_string if state[0] else self.outside
                ff = [next((t for t in order if t < len(bias) and bias[t]), None)]
                if ff[0] is None:
                    return None
            if not m.consume_tokens(ff):
                return None
            for t in ff:
                state = in_string_after(self.texts.get(t, ""), state)
            plan += ff
        return plan if m.is_accepting() else None


class JsonState:
    def __init__(self, matcher, eos: Sequence[int], closer: Closer, vocab_size: int):
        self.m, self.eos, self.closer, self.vocab = matcher, list(eos), closer, vocab_size
        self.seen, self.error = 0, None
        self.lex = (False, False)  # where the output so far ends: in a string? after a backslash?
        self.plan: Optional[list[int]] = None       # forced completion, from position plan_at
        self.plan_at = 0
        self.check_at = 1 << 30  # tokens left at which the next closing plan is computed
        # (closing plan, tokens left) for this step
        self.lookahead: Optional[tuple[list[int], int]] = None

    def _consume(self, generated: Sequence[int]) -> bool:
        new = list(generated[self.seen:])
        self.seen = len(generated)
        if new and not self.m.consume_tokens(new):
            self.error = f"the grammar rejected a token: {self.m.get_error()}"
            return False
        for t in new:
            self.lex = in_string_after(self.closer.texts.get(t, ""), self.lex)
        return True

    def allowed(self, generated: Sequence[int], left: int):
        if self.error is not None or not self._consume(generated):
            return self.eos
        if self.plan is not None:
            i = len(generated) - self.plan_at
            return [self.plan[i]] if i < len(self.plan) else self.eos
        self.lookahead = None
        if left <= self.check_at and not self.m.is_accepting():
            plan = self.closer.plan(self.m, self.lex, left)
            if plan is not None:
                slack = left - len(plan)
                if slack <= LOOKAHEAD_SLACK:
                    # choose() settles this step once the logits are known
                    self.lookahead = (plan, left)
                # Far from it: check again well before the slack could be used up.
                self.check_at = left - max(1, (slack - LOOKAHEAD_SLACK) // 2)
        bias = torch.frombuffer(bytearray(self.m.compute_logit_bias()), dtype=torch.uint8)
        return bias[: self.vocab].bool()

    def choose(self, scores: torch.Tensor) -> list[int]:
        """Near the end of the budget: those of the model's best-scored allowed tokens after which
        the JSON can still be closed in the tokens left; if none, the closing plan's next token (and
        the plan from then on)."""
        plan, left = self.lookahead
        self.lookahead = None
        top = torch.topk(scores, min(LOOKAHEAD, scores.numel()))
        fits = []
        for score, t in zip(top.values.tolist(), top.indices.tolist()):
            if score == float("-inf"):
                break
            m = self.m.deep_copy()
            if t in self.eos or not m.consume_token(t):
                continue
            if (
                m.is_accepting()
                or self.closer.plan(
                    m, in_string_after(self.closer.texts.get(t, ""), self.lex), left - 1
                )
                is not None
            ):
                fits.append(t)
        if fits:
            return fits
        self.plan, self.plan_at = plan, self.seen
        return [plan[0]]

    def finish(self, tokens: Sequence[int]) -> Optional[str]:
        if self.error is None and self._consume(tokens) and self.m.is_accepting():
            return None
        return (
            self.error
            or "max_tokens ran out before the JSON was complete, and it could not be closed in time"
        )
