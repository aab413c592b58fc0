"""Input records in (JSONL, Parquet) and output rows out (JSONL, Parquet at the end of a run)."""
from forge.records.bitmap import IndexBitmap
from forge.records.reader import InputError, RecordSource, open_records
from forge.records.writer import OutputWriter, Reconciliation, encode_error, encode_result

__all__ = [
    "IndexBitmap",
    "InputError",
    "OutputWriter",
    "Reconciliation",
    "RecordSource",
    "encode_error",
    "encode_result",
    "open_records",
]
