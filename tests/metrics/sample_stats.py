"""Stats objects as a two-card node would hand them to ForgeMetrics."""
from forge.stats import BrokerStats, EngineStats, LedgerStats, RunStats


def engines() -> list[EngineStats]:
    return [
        EngineStats(
            "fabric-a",
            "gpu0",
            "llama7b-fp8-1k",
            token_budget=8192,
            slots=256,
            kv_blocks_total=4096,
            in_flight=240,
            kv_blocks_reserved=3800,
            kv_blocks_used=3500,
            kv_blocks_free=596,
            engine_queued=3,
            tokens_last_step=6144,
            input_tokens=1_000_000,
            output_tokens=125_000,
            requests_ok=900,
            requests_failed=2,
            requests_cancelled=1,
            requests_requeued=12,
            admission_refusals=5,
            retries=5,
            stalls=1,
            progress_only_steps=1,
            tokens_per_s=98_000.0,
            engine_steps=250,
            prefix_hit_tokens=400_000,
        ),
        EngineStats(
            "fabric-a",
            "gpu1",
            "llama7b-fp8-1k-half",
            token_budget=4096,
            slots=128,
            kv_blocks_total=2048,
            in_flight=100,
            input_tokens=500_000,
            output_tokens=60_000,
            requests_ok=450,
            healthy=False,
        ),
    ]


def broker() -> BrokerStats:
    return BrokerStats(
        "fabric-a",
        pending=1500,
        pending_by_bucket={"0-128": 1000, "129-256": 500},
        dispatched=1400,
        affinity_hits=900,
        affinity_spills=100,
        prompt_tokens=1_500_000,
        shared_prefix_tokens=600_000,
        padded_tokens=50_000,
        batch_tokens=1_000_000,
        no_fit=3,
    )


def ledger() -> LedgerStats:
    return LedgerStats(commits=40, rows_committed=1350, last_commit_s=0.004, total_commit_s=0.12)


def run() -> RunStats:
    return RunStats(
        total=2000,
        done=1340,
        failed=10,
        skipped=50,
        retried=7,
        in_flight=300,
        input_tokens=1_500_000,
        output_tokens=185_000,
        started_at=1_700_000_000.0,
        producer_queue=600,
        writer_queue=20,
    )


def observe_all(metrics) -> None:
    metrics.observe_engines(engines())
    metrics.observe_broker(broker())
    metrics.observe_ledger(ledger(), node="fabric-a")
    metrics.observe_run(run(), {"node": "fabric-a", "function": "summarize"})
