"""The run ledger: durable per-record state so a killed run resumes with nothing lost, nothing
written twice and nothing regenerated that was already settled. See docs/ledger.md."""
from forge.ledger.resume import (ResumeReport, Run, default_ledger_path, make_run_key, open_run,
                                 staging_path)
from forge.ledger.damage import LedgerDamaged, LedgerMismatch
from forge.ledger.sqlite import Ledger, LedgerCounts

__all__ = [
    "Ledger",
    "LedgerCounts",
    "LedgerDamaged",
    "LedgerMismatch",
    "ResumeReport",
    "Run",
    "default_ledger_path",
    "make_run_key",
    "open_run",
    "staging_path",
]
