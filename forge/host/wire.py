"""The host's side of what crosses between a node and an engine host (the records:
forge/host/protocol.py): a WireRequest read as the host's HostRequest (its RequestKey made here,
once), a finished request built as a WireResult; and the tokenizer identity engines sharing a
tokenization are grouped by. The node's side (a broker request as a WireRequest) is
forge/link/wire.py."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Optional

from forge.engines.interface import RequestKey
from forge.host.protocol import WireRequest, WireResult
from forge.host.request import HostRequest
from forge.requests import DEFAULT_OPTIONS

# Files that decide how text becomes ids; their bytes name the tokenizer across machines.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "added_tokens.json",
)


def from_wire(
    item: WireRequest | tuple, session: str, tokenizer_key: str, now: float
) -> HostRequest:
    """A wire request (or the plain tuple it crosses as, in WireRequest's field order) arriving on
    `session` at `now`, as the host holds it; its key is made here, once. The prompt is in the ids
    of the host's tokenizer (`tokenizer_key`: the link encoded it with that tokenizer)."""
    rid, attempt, prompt, max_new, priority, opts, age = item
    if max_new < 0:
        raise ValueError(f"request {rid}: max_new_tokens must be >= 0, got {max_new}")
    return HostRequest(
        RequestKey(session, rid, int(attempt)),
        tuple(prompt),
        int(max_new),
        int(priority),
        opts or DEFAULT_OPTIONS,
        now - float(age),
    )


def wire_result(key: RequestKey, finish_reason: str, output_ids, text: str, hidden, error,
                input_tokens: int) -> WireResult:
    return WireResult(key.rid, key.attempt, finish_reason, list(output_ids), text,
                      list(hidden) if hidden is not None else None, error, input_tokens)


def tokenizer_identity(contract: Any, tokenizer: Any) -> str:
    """A key equal on every machine whose engine tokenizes the same way: the tokenizer's class plus
    the bytes of its files. Engines sharing it share one tokenization of each prompt (and prefix
    groups)."""
    h = hashlib.sha256(f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}".encode())
    art = contract.artifact
    directory: Optional[Path] = contract.resolve(art.tokenizer or art.checkpoint or art.engine_dir)
    if directory is not None and directory.is_dir():
        for name in TOKENIZER_FILES:
            f = directory / name
            if f.is_file():
                h.update(name.encode() + b"\0" + f.read_bytes())
    return f"tok-{h.hexdigest()[:16]}"
