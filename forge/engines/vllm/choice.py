"""A guided choice on vLLM, by forge's own token trie (forge/engines/choice_trie.py) instead of
vLLM's `choice`.

vLLM compiles a `choice` into a character-level grammar: every tokenization of a choice's text is
allowed, so a model may spell "electronics" in many short tokens and reach max_tokens before the
choice ends (issue 49: 1,795 of 3,000 rows cut at max_tokens 8 on the embedded model, none on
transformers). forge's guide allows only the tokens the model's tokenizer gives each choice, and at
each step only a token after which a choice can still end within the request's max_tokens, exactly
as on the transformers card. A request whose max_tokens cannot hold the shortest choice is refused
before it runs.

The guide is a vLLM logits processor (the v1 `LogitsProcessor` interface, per-request state through
`AdapterLogitsProcessor`), registered at engine build (`logits_processors`); a request carries its
choices' token ids in `SamplingParams.extra_args[EXTRA_KEY]` and nothing else of vLLM's structured
outputs. A request without that key costs the processor nothing (vLLM skips it in the batch update;
apply() has no row to mask).

vLLM 0.34 removed that interface (its model runner V2 has another). There the choice goes to vLLM's
own grammar, and the engine refuses, before it runs, a request whose max_tokens could not hold every
spelling the grammar allows: `spelling_bound`, the UTF-8 length of the longest choice (every token
spells at least one byte)."""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Sequence

from forge.engines.choice_trie import ChoiceState, ChoiceTrie

# extra_args: {"forge_choice": {"ids": [[token ids of a choice], ...], "eos": [...]}}
EXTRA_KEY = "forge_choice"
CACHE_ENTRIES = 256            # tries kept (a bulk job sends the same choices with every record)


def extra_args(trie: ChoiceTrie, eos: Sequence[int]) -> dict:
    """What a request carries for the processor: its choices' token ids (plain lists: vLLM checks
    extra_args)."""
    return {EXTRA_KEY: {"ids": [list(ids) for ids in trie.sequences], "eos": list(eos)}}


def spelling_bound(choices: Sequence[str]) -> int:
    """Tokens that always hold a choice however a character-level grammar lets the model spell
    it."""
    return max(len(c.encode("utf-8")) for c in choices)


def processor_class():
    """The vLLM logits processor class (built here so vLLM is imported only in the card worker);
    None where the installed vLLM has no per-request adapter (0.34 and later)."""
    import torch

    try:
        from vllm.v1.sample.logits_processor import AdapterLogitsProcessor
    except ImportError:
        return None

    class ForgeChoiceProcessor(AdapterLogitsProcessor):
        def __init__(self, vllm_config, device, is_pin_memory):
            super().__init__(vllm_config, device, is_pin_memory)
            self._tries: OrderedDict[tuple, ChoiceTrie] = OrderedDict()
            self._lock = threading.Lock()

        def is_argmax_invariant(self) -> bool:
            return False                     # it masks tokens: greedy requests need it too

        def _trie(self, ids: list) -> ChoiceTrie:
            key = tuple(tuple(seq) for seq in ids)
            with self._lock:
                trie = self._tries.get(key)
                if trie is None:
                    trie = self._tries[key] = ChoiceTrie(key)
                    while len(self._tries) > CACHE_ENTRIES:
                        self._tries.popitem(last=False)
                else:
                    self._tries.move_to_end(key)
            return trie

        def new_req_logits_processor(self, params):
            spec = (params.extra_args or {}).get(EXTRA_KEY)
            if spec is None:
                return None
            state, max_tokens = (
                ChoiceState(self._trie(spec["ids"]), spec["eos"]),
                int(params.max_tokens),
            )

            def mask(output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
                allowed = state.allowed(output_ids, max_tokens - len(output_ids))
                index = torch.tensor(allowed, dtype=torch.long, device=logits.device)
                masked = torch.full_like(logits, float("-inf"))
                masked[index] = logits[index]
                return masked

            return mask

    return ForgeChoiceProcessor
