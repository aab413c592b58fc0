"""A renderable that is a whole table where the width it is drawn at holds it, else its compact
form: chosen when drawn, so a live view follows the terminal's width (forge top) and a printed one
fits 80 columns."""
from __future__ import annotations

from typing import Callable

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement


def natural_width(console: Console, renderable: RenderableType) -> int:
    """Columns the renderable takes when nothing squeezes it."""
    return Measurement.get(console, console.options.update_width(10_000), renderable).maximum


class Fit:
    def __init__(self, whole: RenderableType, compact: Callable[[], RenderableType]):
        self.whole, self.compact = whole, compact

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield (
            self.whole
            if natural_width(console, self.whole) <= options.max_width
            else self.compact()
        )
