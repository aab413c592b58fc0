import asyncio

import pytest

from forge.report.report import rate_series
from forge.report.sampler import Sampler
from forge.stats import EngineStats, RunStats

from synthetic_run import END_S, SyntheticRun, drive


@pytest.fixture
def sim() -> SyntheticRun:
    return SyntheticRun()


def test_series_stay_bounded_and_rates_stay_exact(sim):
    sampler = Sampler(**sim.sources(), interval_s=1.0, max_points=64)
    drive(sampler, sim)
    assert len(sampler.times) <= 64
    assert sampler.stride_s > 1.0                       # resolution halved as the run went on
    for group in sampler.cards.values():
        assert all(len(col) == len(sampler.times) for col in group.columns.values())
    # counters keep the later value of each merged pair: the last point is the real final count
    gpu0 = sampler.cards["fabric-a/gpu0"].columns
    assert gpu0["output_tokens"][-1] == sim.engines["gpu0"].output_tokens
    # integrating the rate series gives back the counter's growth since the first kept point
    t = sampler.times
    rates = rate_series(t, gpu0["input_tokens"])
    integral = sum(r * (t[i] - t[i - 1]) for i, r in enumerate(rates) if i and r is not None)
    assert integral == pytest.approx(gpu0["input_tokens"][-1] - gpu0["input_tokens"][0])
    assert sampler.times[-1] - sim.t0 >= END_S


def test_halving_keeps_counters_and_averages_gauges():
    stats = EngineStats("n", "c0", "t", 100, 4, 10)
    sampler = Sampler(engines=lambda: [stats], interval_s=1.0, max_points=4)
    for i in range(5):                                  # the 5th sample overflows: pairs merge
        stats.output_tokens, stats.in_flight = 10 * i, i
        sampler.sample(float(i))
    cols = sampler.cards["n/c0"].columns
    assert sampler.times == [1.0, 3.0, 4.0]
    assert cols["output_tokens"] == [10.0, 30.0, 40.0]
    assert cols["in_flight"] == [0.5, 2.5, 4.0]
    assert sampler.stride_s == 2.0


def test_a_card_that_appears_late_is_padded_and_one_that_leaves_gets_gaps():
    cards = [EngineStats("n", "c0", "t", 100, 4, 10)]
    sampler = Sampler(engines=lambda: list(cards), interval_s=1.0)
    sampler.sample(0.0)
    cards.append(EngineStats("n", "c1", "t", 100, 4, 10, in_flight=3))
    sampler.sample(1.0)
    cards.pop(0)
    sampler.sample(2.0)
    assert sampler.cards["n/c1"].columns["in_flight"] == [None, 3.0, 3.0]
    assert sampler.cards["n/c0"].columns["in_flight"] == [0.0, 0.0, None]


def test_a_failing_source_is_counted_not_raised():
    def broken():
        raise RuntimeError("broker gone")
    sampler = Sampler(broker=broken, run=lambda: RunStats(done=3), interval_s=1.0)
    sampler.sample(0.0)
    assert sampler.errors == 1 and "broker gone" in sampler.last_error
    assert sampler.run_series.columns["done"] == [3.0]


def test_run_samples_until_cancelled_and_feeds_metrics():
    from forge.metrics import ForgeMetrics

    stats = EngineStats("n", "c0", "t", 100, 4, 10, output_tokens=5)
    metrics = ForgeMetrics()
    sampler = Sampler(engines=lambda: [stats], run=lambda: RunStats(done=2), interval_s=0.01,
                      metrics=metrics, node="n", function="f")

    async def main():
        task = asyncio.create_task(sampler.run())
        await asyncio.sleep(0.08)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert len(sampler.times) >= 3
    text = metrics.exposition().decode()
    assert 'forge_output_tokens_total{card="c0",node="n",tier="t"} 5.0' in text
    assert 'forge_records_total{function="f",node="n",state="done"} 2.0' in text


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        Sampler(interval_s=0)


def test_calls_between_strides_refresh_the_totals_but_add_no_point():
    run = RunStats()
    sampler = Sampler(run=lambda: run, interval_s=1.0)
    assert sampler.sample(0.0)
    run.done = 5
    assert not sampler.sample(0.3)                        # a progress tick, sooner than the stride
    assert sampler.last_run.done == 5 and sampler.times == [0.0]
    assert sampler.sample(0.4, force=True)                # the final sample is always kept
    assert sampler.run_series.columns["done"] == [0.0, 5.0]
