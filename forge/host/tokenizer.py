"""The copy of an engine's tokenizer a node process measures and tokenizes with.

A worker process builds its engine's tokenizer with the engine's own library (transformers imports
torch); the node must not have to. A Hugging Face fast tokenizer is its `tokenizers` pipeline
(normalizer, pre-tokenizer, model, post-processor - BOS included) plus Python around it, so the node
gets that pipeline, serialized, and runs it with the `tokenizers` library alone. Tokenizers of other
kinds travel as they are (the instant backend's are light already). The node trusts a copy only
after it encoded the engine's probe texts exactly as the engine did (forge/node/local.py); otherwise
it tokenizes through the worker.

Imports nothing heavy: a node unpickles this module's class."""
from __future__ import annotations

from typing import Any, Optional, Sequence


class NodeTokenizer:
    """A `tokenizers` pipeline with the engine tokenizer's convention: encode adds its special
    tokens (BOS), decode drops special tokens. Chat templates need the full tokenizer, loaded on
    first use (`hf`)."""

    def __init__(
        self,
        pipeline_json: str,
        *,
        eos_token_id: Optional[int],
        chat_template: Optional[str],
        source: str,
    ):
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_str(pipeline_json)
        self.eos_token_id = eos_token_id
        self.chat_template = chat_template
        self.source = source
        self._hf: Any = None

    def encode(self, text: str) -> list[int]:
        return self._tok.encode(text, add_special_tokens=True).ids

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=True)

    @property
    def hf(self) -> Any:
        """What forge/requests/chat_template.py applies a chat template with: this copy when there
        is no template, else the model's full tokenizer (transformers, loaded here once)."""
        if not self.chat_template:
            return self
        if self._hf is None:
            from transformers import AutoTokenizer

            self._hf = AutoTokenizer.from_pretrained(self.source, local_files_only=True)
        return self._hf

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_hf": None}


def for_node(tokenizer: Any) -> Any:
    """What a worker hands its node: a NodeTokenizer for a Hugging Face fast tokenizer, else the
    tokenizer."""
    hf = getattr(tokenizer, "hf", tokenizer)
    backend = getattr(hf, "backend_tokenizer", None)
    if backend is None:
        return tokenizer
    return NodeTokenizer(backend.to_str(), eos_token_id=getattr(tokenizer, "eos_token_id", None),
                         chat_template=getattr(hf, "chat_template", None) or None,
                         source=str(getattr(hf, "name_or_path", "")))
