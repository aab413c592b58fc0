"""Tables that fit the screen: each command builds its whole table (every column, one row per item)
and, where the terminal is narrower than that table, a compact one with the columns that matter most
(multi-line cells, or the rest said below). `--wide` always prints the whole table; so does a pipe
without $COLUMNS (a script reads whole rows). The compact forms fit 80 columns."""
from __future__ import annotations

import os
from typing import Callable

from rich.console import Console, RenderableType

WIDE_COLUMNS = 250  # --wide / a pipe: wide enough for any of forge's tables, never squeezed
COMPACT_COLUMNS = 80


def console(wide: bool = False) -> Console:
    """The terminal's console (its width, or $COLUMNS); whole rows for --wide or a pipe without
    $COLUMNS."""
    if wide:
        return Console(width=WIDE_COLUMNS)
    c = Console()
    if not c.is_terminal and "COLUMNS" not in os.environ:
        return Console(width=WIDE_COLUMNS)
    return c


def fitting(
    c: Console, whole: RenderableType, compact: Callable[[], RenderableType]
) -> RenderableType:
    """`whole` where it fits the console's width, else the compact form."""
    from forge.fit import Fit

    return Fit(whole, compact)
