"""A complete output stays complete when shards it was made from are deleted afterwards.

A run over a folder (or glob) of shards keeps each shard's identity (name, size, first/last MiB
hash, records) in its ledger. A later start whose shards are only some of those, unchanged, over a
ledger that holds every record written, is the same finished run: it answers "already complete" with
the recorded input's identity and total (no record is read, no index moves). Anything else (a shard
changed or added, an unfinished run) is a changed input, refused as before."""
from __future__ import annotations

import json
import sqlite3
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

# ledger meta key: JSON list of [name, size, sha256 head/tail, records]
SHARD_IDS = "input_shard_ids"
INPUT_KEYS = ("input_size", "input_shards", "input_sha256_head_tail")


@dataclass(frozen=True)
class FinishedShards:
    run_key: dict           # the run key with the recorded input's identity
    total: int              # the records of the shards as recorded
    gone: tuple[str, ...]   # the shards deleted since


def finished_with_shards_gone(ledger_path: Path, run_key: dict,
                              shard_ids: Callable[[], list[list]]) -> Optional[FinishedShards]:
    """The recorded run, when `shard_ids()` (this start's shards) are a strict subset of the ones
    the ledger recorded and every recorded record is written; else None (the ordinary checks then
    decide)."""
    if not ledger_path.is_file():
        return None
    try:
        db = sqlite3.connect(f"file:{ledger_path}?mode=ro", uri=True, timeout=1.0)
    except sqlite3.Error:
        return None
    try:
        meta = dict(
            db.execute(
                "SELECT key, value FROM meta WHERE key IN ('run_key', ?)", (SHARD_IDS,)
            ).fetchall()
        )
        states = dict(db.execute("SELECT state, COUNT(*) FROM records GROUP BY state").fetchall())
        recorded = [tuple(x) for x in json.loads(meta[SHARD_IDS])]
        old_key = json.loads(meta["run_key"])
    except (sqlite3.Error, KeyError, ValueError, TypeError):
        return None
    finally:
        db.close()
    if not isinstance(old_key, dict) or all(old_key.get(k) == run_key.get(k) for k in INPUT_KEYS):
        return None                 # the input as recorded: nothing to decide here
    now = [tuple(x) for x in shard_ids()]
    total = sum(int(x[3]) for x in recorded)
    if not set(now) < set(recorded) or set(states) != {"written"} or states["written"] != total:
        return None
    if any(k not in old_key for k in INPUT_KEYS):
        return None
    gone = tuple(str(x[0]) for x in recorded if x not in set(now))
    return FinishedShards({**run_key, **{k: old_key[k] for k in INPUT_KEYS}}, total, gone)


def record_shards(ledger, shard_ids: list[list]) -> None:
    """Keep the shards' identities in the ledger (once: they are the run's, as first counted)."""
    if ledger.get_meta(SHARD_IDS) is None:
        ledger.set_meta(SHARD_IDS, json.dumps(shard_ids))
