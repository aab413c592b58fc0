"""Handing a run its rows in tests, through the async API the runner uses."""
from __future__ import annotations

import asyncio


def put_all(run, items, *, attempts=False, between=None) -> None:
    """Hand the run each (index, result) as the runner does (an attempt first if asked); `between()`
    after each."""
    async def go() -> None:
        for i, result in items:
            if attempts:
                await run.aput_attempt(i)
            await run.aput_result(i, result)
            if between is not None:
                between()

    asyncio.run(go())
