import asyncio
import socket
import urllib.request

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from forge.errors import ForgeError
from forge.metrics import ForgeMetrics

from sample_stats import engines, observe_all


def parse(text: str) -> dict[tuple, float]:
    """{(sample name, frozenset(labels)): value} from Prometheus text."""
    return {(s.name, frozenset(s.labels.items())): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def card(c: str, **extra) -> frozenset:
    tier = {"gpu0": "llama7b-fp8-1k", "gpu1": "llama7b-fp8-1k-half"}[c]
    return frozenset({"node": "fabric-a", "card": c, "tier": tier, **extra}.items())


@pytest.fixture
def served():
    metrics = ForgeMetrics()
    server, port = metrics.serve("127.0.0.1", 0)
    yield metrics, port
    server.shutdown()
    server.server_close()


def scrape(port: int) -> tuple[str, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        return resp.read().decode(), resp.headers["Content-Type"]


def test_scrape_over_http_parses_with_the_prometheus_parser(served):
    metrics, port = served
    assert port > 0
    observe_all(metrics)
    text, content_type = scrape(port)
    assert content_type.startswith("text/plain")
    got = parse(text)
    assert got[("forge_input_tokens_total", card("gpu0"))] == 1_000_000
    assert got[("forge_output_tokens_total", card("gpu1"))] == 60_000
    assert got[("forge_requests_total", card("gpu0", outcome="requeued"))] == 12
    assert got[("forge_in_flight_requests", card("gpu0"))] == 240
    assert got[("forge_max_in_flight_requests", card("gpu1"))] == 128
    assert got[("forge_step_budget_use_ratio", card("gpu0"))] == pytest.approx(0.75)
    assert got[("forge_kv_cache_blocks", card("gpu0", state="reserved"))] == 3800
    assert got[("forge_engine_healthy", card("gpu1"))] == 0
    assert got[("forge_stalls_total", card("gpu0"))] == 1
    assert got[("forge_progress_only_steps_total", card("gpu0"))] == 1
    assert (
        got[
            (
                "forge_queue_depth_items",
                frozenset({"node": "fabric-a", "card": "", "tier": "", "stage": "broker"}.items()),
            )
        ]
        == 1500
    )
    assert got[("forge_queue_depth_items", card("gpu0", stage="engine"))] == 3
    assert got[
        ("forge_prefix_reuse_ratio", frozenset({"node": "fabric-a"}.items()))
    ] == pytest.approx(0.4)
    assert got[("forge_padding_ratio", frozenset({"node": "fabric-a"}.items()))] == pytest.approx(
        0.05
    )
    assert (
        got[
            (
                "forge_broker_pending_requests",
                frozenset({"node": "fabric-a", "bucket": "0-128"}.items()),
            )
        ]
        == 1000
    )
    assert got[("forge_ledger_commit_seconds_count", frozenset({"node": "fabric-a"}.items()))] == 40
    assert got[
        ("forge_ledger_commit_seconds_sum", frozenset({"node": "fabric-a"}.items()))
    ] == pytest.approx(0.12)
    run = {"node": "fabric-a", "function": "summarize"}
    assert got[("forge_records_total", frozenset({**run, "state": "skipped"}.items()))] == 50
    assert (
        got[
            (
                "forge_queue_depth_items",
                frozenset(
                    {"node": "fabric-a", "card": "", "tier": "", "stage": "producer"}.items()
                ),
            )
        ]
        == 600
    )


def test_cumulative_snapshots_are_never_double_counted(served):
    metrics, port = served
    stats = engines()[0]
    metrics.observe_engine(stats)
    metrics.observe_engine(stats)                 # the same snapshot twice
    stats.output_tokens += 10                      # the producer keeps mutating its object ...
    # ... we hold a copy
    assert parse(scrape(port)[0])[("forge_output_tokens_total", card("gpu0"))] == 125_000
    metrics.observe_engine(stats)
    assert parse(scrape(port)[0])[("forge_output_tokens_total", card("gpu0"))] == 125_010


def test_every_family_is_forge_prefixed_and_counters_end_in_total():
    metrics = ForgeMetrics()
    observe_all(metrics)
    families = list(text_string_to_metric_families(metrics.exposition().decode()))
    assert len(families) >= 35
    for fam in families:
        assert fam.name.startswith("forge_"), fam.name
        if fam.type == "counter":
            assert all(s.name.endswith("_total") for s in fam.samples), fam.name
        assert fam.documentation, fam.name


def test_registries_are_independent_and_a_forgotten_card_disappears():
    a, b = ForgeMetrics(), ForgeMetrics()
    observe_all(a)
    assert b"forge_input_tokens_total{" not in b.exposition()
    a.forget_engine("fabric-a", "gpu1")
    text = a.exposition().decode()
    assert 'card="gpu1"' not in text and 'card="gpu0"' in text


def test_asgi_app_serves_the_same_registry():
    metrics = ForgeMetrics()
    observe_all(metrics)

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=metrics.asgi_app())
        async with httpx.AsyncClient(transport=transport, base_url="http://node") as client:
            return await client.get("/metrics")

    resp = asyncio.run(get())
    assert resp.status_code == 200
    assert parse(resp.text)[("forge_input_tokens_total", card("gpu1"))] == 500_000


def test_a_port_in_use_is_one_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(ForgeError, match=f"cannot serve metrics on 127.0.0.1:{port}"):
            ForgeMetrics().serve("127.0.0.1", port)


def test_close_stops_the_server_and_run_labels_are_checked():
    metrics = ForgeMetrics()
    _server, port = metrics.serve("127.0.0.1", 0)
    scrape(port)
    metrics.close()
    metrics.close()                                          # idempotent
    with pytest.raises(OSError):
        scrape(port)
    from sample_stats import run
    with pytest.raises(ValueError, match="node and function"):
        metrics.observe_run(run(), {"node": "n", "job": "x"})
