"""Rates from a report's cumulative counters: per interval, and over a trailing window (what the
plots draw)."""
from __future__ import annotations


def rate_series(t_s: list[float], cumulative: list[float | None]) -> list[float | None]:
    """Per-second rate between consecutive kept points; None where unknown or the counter reset."""
    out: list[float | None] = [None]
    steps = sorted(b - a for a, b in zip(t_s, t_s[1:]))
    typical = steps[len(steps) // 2] if steps else 0.0
    for i in range(1, len(t_s)):
        j = i - 1
        # A short last interval (the final sample) holds a burst of completions: tokens are counted
        # when a request finishes, so measure it together with the interval before it rather than
        # draw a spike.
        if i >= 2 and t_s[i] - t_s[j] < 0.5 * typical:
            j = i - 2
        a, b, dt = cumulative[j], cumulative[i], t_s[i] - t_s[j]
        out.append((b - a) / dt if a is not None and b is not None and dt > 0 and b >= a else None)
    return out[: len(t_s)]


def windowed_rate_series(t_s: list[float], cumulative: list[float | None],
                         window_s: float) -> list[float | None]:
    """Per-second rate over a trailing window of window_s seconds ending at each point (at least one
    interval): tokens are counted when a request finishes, so a per-interval rate jumps between
    bursts and gaps; the mean over a few seconds shows the throughput a reader means. Falls back to
    the per-interval rate where the window's first point is unknown or the counter reset inside the
    window."""
    raw = rate_series(t_s, cumulative)
    out: list[float | None] = [None]
    j = 0
    for i in range(1, len(t_s)):
        while j < i - 1 and t_s[i] - t_s[j] > window_s:
            j += 1
        a, b, dt = cumulative[j], cumulative[i], t_s[i] - t_s[j]
        window = cumulative[j:i + 1]
        steady = a is not None and b is not None and dt > 0 and all(
            x is not None and y is not None and y >= x for x, y in zip(window, window[1:]))
        out.append((b - a) / dt if steady else raw[i])
    return out[: len(t_s)]
