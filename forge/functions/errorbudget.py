"""`--max-errors`: stop a job early when its function is clearly broken.

A count (`--max-errors 50`: stop once more than 50 records failed in this run) or a share
(`--max-errors 5%`: stop once more than 5% of the records this run started failed, counted only
after MAX_ERRORS_MIN_SAMPLE of them settled, so the first few records cannot stop a run by bad
luck). The runner asks whenever a record settles, success or failure (the failures may all settle
before the sample fills). The stop is like a second Ctrl-C: records not started and those in flight
stay in the ledger, the exit code says incomplete, and the same command resumes."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from forge import constants
from forge.errors import UsageError

_SHARE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


@dataclass(frozen=True)
class MaxErrors:
    text: str                           # as given, for messages
    count: Optional[int] = None
    share: Optional[float] = None       # 0 < share <= 1
    min_sample: int = constants.MAX_ERRORS_MIN_SAMPLE

    @classmethod
    def parse(cls, text: str) -> "MaxErrors":
        t = str(text).strip()
        if t.isdigit():
            return cls(text=t, count=int(t))
        m = _SHARE.match(t)
        if m and 0 < float(m.group(1)) <= 100:
            return cls(text=t, share=float(m.group(1)) / 100)
        raise UsageError(f"--max-errors {text!r}: give a count of records (e.g. 50) or a share of "
                         "them "
                         "(e.g. 5%, more than 0 and at most 100)")

    def exceeded(self, failed: int, settled: int, started: int) -> bool:
        """`failed` error rows this run, of `settled` records done or failed, of `started` ones
        (those in flight too): past the limit? A share is taken of the records started, not settled:
        a failure usually returns at once while a success waits for its generation, so early on the
        settled ones are mostly failures."""
        if self.count is not None:
            return failed > self.count
        return settled >= self.min_sample and failed > self.share * max(started, settled)

    def describe(self, failed: int, started: int) -> str:
        return (f"{failed:,} of the {started:,} records started in this run failed (more than "
                f"--max-errors {self.text})")
