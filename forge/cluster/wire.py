"""What travels between a job's driver and an engine actor: plain tuples, batched, cheap to serialize.

Request (driver -> engine):  (rid, attempt, prompt ids for that engine's tokenizer, max_new_tokens,
                              priority, RequestOptions or None for the defaults, age in seconds)
Result  (engine -> driver):  (rid, attempt, finish_reason, output ids, text, hidden or None,
                              error or None, input tokens)

(rid, attempt) is a dispatch's identity: the driver accepts a result only for the dispatch it is
waiting on, so an answer from an engine that was given up on (lost, restarted, orphaned) is ignored."""
from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from forge.broker import BrokerRequest
from forge.engines.interface import Guide, Sampling
from forge.runtime.options import RequestOptions

DEFAULT_OPTIONS = RequestOptions()
# Files that decide how text becomes ids; their bytes name the tokenizer across machines.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
                   "vocab.json", "merges.txt", "vocab.txt", "added_tokens.json")


@dataclass(frozen=True)
class WireMeta:
    """A request's payload inside an engine actor: its job session and driver id, plus the options the
    admission runtime reads by name (sampling, guide, want_hidden, deadline_s)."""

    session: str
    rid: str
    sampling: Sampling = Sampling()
    guide: Optional[Guide] = None
    want_hidden: bool = False
    deadline_s: Optional[float] = None


def to_wire(req: BrokerRequest, tokenizer_key: str, now: float) -> tuple:
    opts = req.payload if isinstance(req.payload, RequestOptions) else DEFAULT_OPTIONS
    return (req.request_id, req.attempt, req.prompt_for(tokenizer_key), req.max_new_tokens, req.priority,
            None if opts == DEFAULT_OPTIONS else opts, max(0.0, now - req.enqueued_at))


def from_wire(item: tuple, session: str, tokenizer_key: str, now: float) -> BrokerRequest:
    rid, attempt, prompt, max_new, priority, opts, age = item
    o = opts if opts is not None else DEFAULT_OPTIONS
    meta = WireMeta(session=session, rid=rid, sampling=o.sampling, guide=o.guide, want_hidden=o.want_hidden,
                    deadline_s=o.deadline_s)
    return BrokerRequest(request_id=f"{session}|{rid}|{attempt}", prompts={tokenizer_key: tuple(prompt)},
                         max_new_tokens=int(max_new), payload=meta, priority=int(priority), attempt=int(attempt),
                         enqueued_at=now - float(age))


def tokenizer_identity(contract: Any, tokenizer: Any) -> str:
    """A key equal on every machine whose engine tokenizes the same way: the tokenizer's class plus the
    bytes of its files. Engines sharing it share one tokenization of each prompt (and prefix groups)."""
    h = hashlib.sha256(f"{type(tokenizer).__module__}.{type(tokenizer).__qualname__}".encode())
    art = contract.artifact
    directory: Optional[Path] = contract.resolve(art.tokenizer or art.checkpoint or art.engine_dir)
    if directory is not None and directory.is_dir():
        for name in TOKENIZER_FILES:
            f = directory / name
            if f.is_file():
                h.update(name.encode() + b"\0" + f.read_bytes())
    return f"tok-{h.hexdigest()[:16]}"
