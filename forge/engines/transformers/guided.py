"""Guided output for the transformers engine: a logits processor inside the continuous-batching loop
masks every token a guide does not allow, so a guided result is a member of the choice list / JSON
matching the schema by construction (never by retrying until the text happens to match).

- choice: a token trie over the tokenizer's encoding of each choice. It knows, per node, the fewest
  tokens still needed to complete a choice, so only continuations that fit the request's remaining
  token budget are allowed; a request whose max_new_tokens cannot hold the shortest choice is
  refused up front.
- json_schema: llguidance (a Rust grammar engine) compiles the schema and computes the allowed-token
  mask each step. Output is compact JSON (no free whitespace, which tiny models otherwise repeat
  forever). Objects without `additionalProperties` get `false` (a stricter subset of what the schema
  accepts). Near the end of the budget the guide force-closes the JSON (guided_json.py). If even
  that cannot close it, the result is an error, never unparseable text.

transformers 5.24's manager only builds processors from the generation config, so the factory
inserts this one in front of them (masking first, then temperature / top-k / top-p pick among
allowed tokens) before the loop's buffers exist. It runs Python per step, so it needs the eager
loop: no CUDA graphs, no torch.compile, no async batching (the factory leaves guides off then, and
says why).
"""
from __future__ import annotations

import json
import threading
from collections import OrderedDict
from typing import Any, Optional, Sequence

import torch
from transformers.generation.continuous_batching.cb_logits_processors import (
    ContinuousBatchingLogitsProcessor,
)

from forge.engines.choice_trie import ChoiceState, ChoiceTrie, budget_problem, encode_choices  # noqa: F401 - re-exported
from forge.engines.transformers.guided_json import Closer, JsonState, strict_objects
from forge.engines.interface import Guide

SHORTEST_SEARCH_LIMIT = 1024   # tokens the up-front search for a schema's shortest JSON may take
CACHE_ENTRIES = 256      # compiled choice tries / JSON grammars kept (bounded LRU)


def guide_kind(guide: Guide) -> Optional[str]:
    kinds = [k for k in ("choice", "json_schema", "regex") if getattr(guide, k) is not None]
    return kinds[0] if len(kinds) == 1 else None


class GuideCompiler:
    """Turns a Guide into per-request state; compiled tries and grammars are cached (bounded)."""

    def __init__(self, tokenizer, vocab_size: int, eos: Sequence[int]):
        # tokenizer: the engine's (decode is what callers see); .hf, where present, is the Hugging
        # Face one
        self.tokenizer, self.vocab, self.eos = tokenizer, vocab_size, sorted(eos)
        self.hf = getattr(tokenizer, "hf", tokenizer)
        self._cache: OrderedDict[str, Any] = OrderedDict()
        self._lock = threading.Lock()
        self._ll = self._llguidance_tokenizer()
        self.kinds = frozenset({"choice", "json_schema"} if self._ll is not None else {"choice"})
        self._closer: Optional[Closer] = None      # built on the first JSON guide

    def _llguidance_tokenizer(self):
        try:
            import llguidance
        except ImportError:
            return None
        backend = getattr(self.hf, "backend_tokenizer", None)
        if backend is None:
            return None
        return llguidance.LLTokenizer(backend.to_str(), n_vocab=self.vocab, eos_token=self.eos[0])

    def _texts(self) -> dict[int, str]:
        return {
            i: self.tokenizer.decode([i]) for i in self.hf.get_vocab().values() if i < self.vocab
        }

    def start(self, guide: Guide, max_new_tokens: int):
        """(state, None) or (None, why the guide cannot be honoured)."""
        kind = guide_kind(guide)
        if kind == "choice":
            return self._choice(guide.choice, max_new_tokens)
        if kind == "json_schema" and "json_schema" in self.kinds:
            return self._json(guide.json_schema, max_new_tokens)
        return None, f"guided output of kind {kind or 'mixed'} is not supported here (supported: {sorted(self.kinds)})"

    def _cached(self, key: str, build):
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        value = build()
        with self._lock:
            self._cache[key] = value
            while len(self._cache) > CACHE_ENTRIES:
                self._cache.popitem(last=False)
        return value

    def _choice(self, choices: Sequence[str], max_new_tokens: int):
        if not choices or not all(isinstance(c, str) and c for c in choices):
            return None, "choice must be a non-empty list of non-empty strings"
        trie = self._cached("c:" + json.dumps(list(choices)), lambda: encode_choices(
            choices, lambda c: self.hf.encode(c, add_special_tokens=False), self.tokenizer.decode))
        if isinstance(trie, str):
            return None, trie
        why = budget_problem(trie, max_new_tokens)
        return (None, why) if why else (ChoiceState(trie, self.eos), None)

    def _json(self, schema: Any, max_new_tokens: int):
        import llguidance

        if not isinstance(schema, dict):
            return None, "json_schema must be a JSON object"
        if self._closer is None:
            self._closer = Closer(self._texts())

        def build():
            try:
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    strict_objects(schema),
                    overrides={
                        "whitespace_flexible": False,
                        "item_separator": ",",
                        "key_separator": ":",
                    },
                )
            except ValueError as exc:
                return f"json_schema cannot be compiled: {exc}"
            why = llguidance.LLMatcher.validate_grammar(grammar, self._ll)
            if why:
                return f"json_schema cannot be compiled: {why}"
            shortest = self._closer.plan(llguidance.LLMatcher(self._ll, grammar), (False, False),
                                         SHORTEST_SEARCH_LIMIT)
            return grammar, (len(shortest) if shortest is not None else None)

        built = self._cached("j:" + json.dumps(schema, sort_keys=True), build)
        if isinstance(built, str):
            return None, built
        grammar, shortest = built
        if shortest is not None and shortest > max_new_tokens:
            return None, (f"max_tokens {max_new_tokens} cannot hold the shortest JSON this schema "
                          "allows "
                          f"({shortest} tokens with this tokenizer)")
        matcher = llguidance.LLMatcher(self._ll, grammar)
        if matcher.is_error():
            return None, f"json_schema cannot be compiled: {matcher.get_error()}"
        return JsonState(matcher, self.eos, self._closer, self.vocab), None


class GuideProcessor(ContinuousBatchingLogitsProcessor):
    """Per-request masks inside the manager's loop. prepare_tensor_args (batch preparation) computes
    each guided row's allowed tokens from the request's own state; __call__ (same step, same thread)
    applies them."""

    supported_kwargs: dict[str, type] = {}
    ignored_kwargs: tuple[str, ...] = ()

    def __init__(self, vocab_size: int):
        self.vocab = vocab_size
        self._lock = threading.Lock()
        # manager id -> (state, prompt length, max_new_tokens)
        self._guided: dict[str, tuple[Any, int, int]] = {}
        self._rows: list[tuple[int, Any, Any]] = []

    def add(self, request_id: str, state, prompt_len: int, max_new_tokens: int) -> None:
        with self._lock:
            self._guided[request_id] = (state, prompt_len, max_new_tokens)

    def remove(self, request_id: str) -> None:
        with self._lock:
            self._guided.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._guided)

    def fill_defaults(self, int32_tensor: torch.Tensor) -> None:
        int32_tensor.fill_(-1)

    def prepare_tensor_args(self, requests_with_new_token: list) -> torch.Tensor:
        rows = []
        if self._guided:
            with self._lock:
                found = [
                    (i, self._guided.get(fr.state.request_id))
                    for i, fr in enumerate(requests_with_new_token)
                ]
            for i, entry in found:
                if entry is None:
                    continue
                state, prompt_len, max_new = entry
                rs = requests_with_new_token[i].state
                # A request the manager re-queued carries its earlier output in initial_tokens.
                generated = rs.initial_tokens[prompt_len:] + rs.generated_tokens
                try:
                    rows.append((i, state.allowed(generated, max_new - len(generated)), state))
                except Exception as exc:  # noqa: BLE001 - a guide's bug must end its request, not the engine loop
                    state.error = f"guide failed: {type(exc).__name__}: {exc}"
                    rows.append((i, state.eos, state))
        self._rows = rows
        return torch.full((len(requests_with_new_token),), -1, dtype=torch.int32)

    def __call__(self, scores: torch.Tensor, tensor_arg: torch.Tensor) -> torch.Tensor:
        rows, self._rows = self._rows, []
        for i, allowed, state in rows:
            if i >= scores.size(0):
                continue
            scores[i] = scores[i].masked_fill(~self._keep(allowed, scores), float("-inf"))
            if getattr(state, "lookahead", None) is not None:
                try:
                    only = state.choose(scores[i].detach().cpu())
                except Exception as exc:  # noqa: BLE001 - as above: end the request, keep the loop
                    state.error, only = f"guide failed: {type(exc).__name__}: {exc}", state.eos
                scores[i] = scores[i].masked_fill(~self._keep(only, scores), float("-inf"))
        return scores

    @staticmethod
    def _keep(allowed, scores: torch.Tensor) -> torch.Tensor:
        keep = torch.zeros(scores.size(-1), dtype=torch.bool, device=scores.device)
        if isinstance(allowed, torch.Tensor):
            n = min(allowed.numel(), keep.numel())
            keep[:n] = allowed[:n].to(scores.device)
        else:
            keep[torch.as_tensor(allowed, dtype=torch.long, device=scores.device)] = True
        return keep


def install(
    manager, tokenizer, vocab_size: int, eos: Sequence[int]
) -> tuple[GuideCompiler, GuideProcessor]:
    """Put a GuideProcessor first in the manager's processors. Must run before the batch processor
    is built (warmup/start), which sizes its argument buffers from `tensors_required`."""
    lp = manager.logit_processor
    proc = GuideProcessor(vocab_size)
    lp.logits_processor.insert(0, proc)
    lp.tensors_required += 1
    lp.do_processing = True
    return GuideCompiler(tokenizer, vocab_size, eos), proc
