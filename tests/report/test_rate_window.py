"""The tokens/s plot's series: a trailing-window mean instead of the per-interval step series
(tokens are counted when a request finishes, so per-interval rates swing between bursts and
gaps)."""
from forge.report.rates import rate_series, windowed_rate_series


def test_bursts_average_out_over_the_window():
    t = [float(i) for i in range(21)]
    cumulative = [100.0 * ((i + 1) // 2) for i in range(21)]          # +100 every other second
    raw = rate_series(t, cumulative)
    smooth = windowed_rate_series(t, cumulative, 5.0)
    assert set(raw[1:]) == {0.0, 100.0}  # the step series swings 0 <-> 100
    assert all(40.0 <= r <= 60.0 for r in smooth[6:]), smooth         # the 5 s mean stays near 50
    assert smooth[0] is None and len(smooth) == len(t)


def test_a_reset_or_unknown_point_falls_back_to_the_interval_rate():
    t = [0.0, 1.0, 2.0, 3.0, 4.0]
    cumulative = [0.0, 10.0, None, 5.0, 15.0]
    smooth = windowed_rate_series(t, cumulative, 5.0)
    assert smooth == rate_series(t, cumulative)


def test_sparse_samples_use_one_interval():
    t = [0.0, 10.0, 20.0]
    cumulative = [0.0, 100.0, 300.0]
    assert windowed_rate_series(t, cumulative, 5.0) == [None, 10.0, 20.0]
