"""What can go wrong reading a ledger, as one line naming the file: another run's ledger (LedgerMismatch), or a file
that cannot be the ledger it was (LedgerDamaged) — never an internal error."""
from __future__ import annotations

import sqlite3

from forge.errors import ForgeError


class LedgerMismatch(ForgeError):
    """The ledger belongs to another run (function or input changed)."""


class LedgerDamaged(ForgeError):
    """The ledger file cannot be read as the ledger it was (flipped bytes, a torn copy): `why` says what SQLite or
    the decoder found. open_run rebuilds it from a complete output, or says what to do."""

    def __init__(self, shown: str, why: str) -> None:
        self.why = why
        super().__init__(f"{shown}: the ledger is damaged ({why})")


_DAMAGE = (sqlite3.DatabaseError, UnicodeDecodeError, ValueError, TypeError, KeyError)


def is_damage(e: BaseException) -> bool:
    """Content that cannot be what forge wrote. An OperationalError is the file system's (a folder that takes no
    -wal file, a lock, a full disk), not the file's, unless it is text SQLite could not decode."""
    if isinstance(e, sqlite3.OperationalError):
        return "could not decode" in str(e).lower()
    return isinstance(e, _DAMAGE) and not isinstance(e, ForgeError)


def as_forge_error(shown: str, e: BaseException) -> BaseException:
    """Damage, or any other SQLite failure, as one line naming the ledger (never an internal error)."""
    if is_damage(e):
        return LedgerDamaged(shown, f"{type(e).__name__}: {e}")
    if isinstance(e, sqlite3.Error):
        return ForgeError(f"{shown}: cannot read the ledger: {e}")
    return e


def reads(method):
    """Ledger reads: damage found while reading is a LedgerDamaged naming the file."""
    def wrapper(self, *args, **kwargs):
        try:
            return method(self, *args, **kwargs)
        except Exception as e:
            mapped = as_forge_error(self._shown, e)
            if mapped is not e:
                raise mapped from None
            raise
    wrapper.__name__, wrapper.__doc__ = method.__name__, method.__doc__
    return wrapper
