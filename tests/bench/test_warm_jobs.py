"""`forge bench run --warm-jobs K`: the forge modes run K whole jobs of other records on the node
before the measured one, outside its window, so the card worker has run work before (as the direct
mode's process has) while its prefix cache holds nothing the measured job could reuse; and the
engine counters are read once they have caught up, so the warm work's last steps are not counted in
the window."""
from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from forge.config.load import load_node
from forge.stats import EngineStats
from forge_bench.forge_mode import run_forge_async, settled_engine_stats, write_records
from forge_bench.modes import warm_job_requests
from forge_bench.workload import generate, load_workload

ROOT = Path(__file__).resolve().parents[2]
INSTANT_NODE = ROOT / "tests" / "reliability" / "fixtures" / "nodes" / "instant.yaml"
WORKLOAD = ROOT / "docs" / "bench" / "workloads" / "cpu-mixed-short.yaml"


def test_warm_job_records_share_no_prompt_or_prefix_with_the_measured_ones_or_each_other():
    spec = load_workload(WORKLOAD)
    jobs = [
        generate(spec, 2048, 256),
        warm_job_requests(spec, 2048, 256, 0),
        warm_job_requests(spec, 2048, 256, 1),
    ]
    length = spec.shared_prefix.length
    for a in range(3):
        for b in range(a + 1, 3):
            assert len(jobs[a]) == len(jobs[b])
            assert not {r.prompt for r in jobs[a]} & {r.prompt for r in jobs[b]}
            pa = {r.prompt[:length] for r in jobs[a] if r.prefix is not None}
            pb = {r.prompt[:length] for r in jobs[b] if r.prefix is not None}
            assert pa and pb and not pa & pb


@pytest.mark.timeout(120)
def test_warm_jobs_run_before_the_window_and_stay_out_of_its_counts(tmp_path):
    loaded = load_node(INSTANT_NODE)
    spec = load_workload(WORKLOAD)
    vocab = loaded.plans[0].contract.model.vocab_size
    reqs = generate(spec, vocab, 64)
    records = write_records(reqs, tmp_path / "records.jsonl")
    warm = [
        write_records(warm_job_requests(spec, vocab, 64, k), tmp_path / f"warm-records-{k}.jsonl")
        for k in range(2)
    ]
    res = asyncio.run(
        run_forge_async(
            loaded,
            records,
            len(reqs),
            tmp_path,
            grouping=True,
            warm_records=warm,
            card_transport="thread",
        )
    )
    assert res.completed == res.requests == 64
    assert [n for n in res.notes if n.startswith("after 2 warm job(s) on the same node (128 "
                                                 "records done, 0 failed")]
    # before the window: the warm job's output was complete when the window started
    assert (tmp_path / "forge.warm.out.jsonl").stat().st_mtime <= res.started_at
    assert len((tmp_path / "forge.warm.out.jsonl").read_text().splitlines()) == 64
    # the window's counts are the measured job's alone
    assert sum(c["requests_ok"] for c in res.per_card.values()) == 64
    assert res.input_tokens == sum(len(r.prompt) for r in reqs)
    assert (
        len([json.loads(line) for line in (tmp_path / "forge.out.jsonl").read_text().splitlines()])
        == 64
    )


class LaggingNode:
    """read_engine_stats() catches up with the engine over a few reads, as snapshots reach a real
    node."""

    engine_stats_lag_s = 0.01

    def __init__(self, steps: list[int]):
        self.steps = steps

    async def read_engine_stats(self):
        n = self.steps.pop(0) if len(self.steps) > 1 else self.steps[0]
        return [
            EngineStats(
                node="n",
                card="c0",
                tier="t",
                slots=1,
                token_budget=1,
                kv_blocks_total=1,
                engine_steps=n,
            )
        ]


def test_engine_stats_are_read_once_they_stop_moving():
    got = asyncio.run(
        settled_engine_stats(LaggingNode([90, 97, 100, 100, 100]), read_s=0.01, limit_s=2.0)
    )
    assert got[0].engine_steps == 100
    # bounded: a node whose counters never settle is read for limit_s at most
    moving = LaggingNode(list(range(1000)))
    got = asyncio.run(settled_engine_stats(moving, read_s=0.01, limit_s=0.1))
    assert got[0].engine_steps < 100


class PeriodicNode:
    """A host samples its engine's counters periodically: read at once, the node's view lags the
    engine by up to its engine_stats_lag_s, however often it is read."""

    def __init__(self, before: int, after: int, lag_s: float):
        import time

        self.before, self.after, self.at, self.engine_stats_lag_s = (
            before,
            after,
            time.monotonic() + lag_s,
            lag_s,
        )

    async def read_engine_stats(self):
        import time
        n = self.after if time.monotonic() >= self.at else self.before
        return [
            EngineStats(
                node="n",
                card="c0",
                tier="t",
                slots=1,
                token_budget=1,
                kv_blocks_total=1,
                engine_steps=n,
            )
        ]


def test_engine_stats_wait_out_the_nodes_lag():
    from forge.link.link import COLLECT_WAIT_S, HOST_STATS_LAG_S

    # the job's last steps show up to the node's lag after the job ends: its host's sampling for a
    # linked node (a call reads the host now), one idle long-poll for a node that only has its
    # links' collect replies
    for lag in (HOST_STATS_LAG_S, COLLECT_WAIT_S + HOST_STATS_LAG_S):
        got = asyncio.run(settled_engine_stats(PeriodicNode(136, 141, lag_s=lag)))
        assert got[0].engine_steps == 141, lag


@pytest.mark.slow
@pytest.mark.engine
@pytest.mark.timeout(240)
def test_direct_runs_its_warm_jobs_through_the_manager_its_window_uses(tmp_path):
    """The direct mode gets the same warm jobs (in the bench's process and in a fresh one): fed
    through the manager its window then uses, before the window, and left out of the window's
    counts."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from tests.forge_cli import forge

    def bench(out, *extra):
        proc = forge(
            "bench",
            "run",
            "bench/forge_bench/quick.yaml",
            "--modes",
            "direct",
            "--direct",
            "longest",
            "--records",
            12,
            "--out",
            out,
            *extra,
            timeout=200,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        return json.loads((out / "bench.json").read_text())["results"]

    plain = bench(tmp_path / "plain")
    warm = bench(
        tmp_path / "warm", "--warm-jobs", "2", "--direct-process", "child", "--repeat", "2"
    )
    assert len(warm) == 2
    for r in warm:
        assert r["completed"] == r["requests"] == 12
        assert "after 2 warm job(s) on the same manager (24 records; own prompts)" in r["notes"]
        assert any(n.startswith("own process") for n in r["notes"])
        # the window's counts are the measured job's alone: the same tokens as without warm jobs,
        # and no prefix reuse from the warm jobs' prompts (they share none with the measured
        # records)
        assert (r["input_tokens"], r["output_tokens"]) == (
            plain[0]["input_tokens"],
            plain[0]["output_tokens"],
        )
        assert r["prefix_hit_tokens"] == plain[0]["prefix_hit_tokens"]
        assert r["engine_steps"] == plain[0]["engine_steps"]
    assert not [n for n in plain[0]["notes"] if "warm job" in n]


def test_a_settled_read_right_after_a_job_counts_every_step_the_engine_took(tmp_path):
    """On a real linked node (two CPU-bound instant cards, hosts in this process): the stats read as
    the job's last answer arrives count every engine step, prefix hit and token the hosts count a
    long-poll later."""
    from forge_bench.cpu_nodes import write_cpu_node
    from forge.link.link import COLLECT_WAIT_S
    from forge.node.local import LocalNode
    from forge.requests import GenerateParams

    loaded = load_node(write_cpu_node(tmp_path / "nodes", "cpu-2", [1.0, 2.0]))
    reqs = generate(
        load_workload(ROOT / "docs" / "bench" / "workloads" / "cpu-steps.yaml"), 2048, 60
    )

    async def main():
        node = LocalNode(loaded, card_transport="thread")
        await node.start()
        try:
            before = await settled_engine_stats(node)
            await asyncio.gather(
                *(
                    node.generate(list(r.prompt), GenerateParams(max_tokens=r.max_new_tokens))
                    for r in reqs
                )
            )
            settled = await settled_engine_stats(node)
            # every collect reply since has carried the counters
            await asyncio.sleep(3 * COLLECT_WAIT_S)
            return before, settled, node.engine_stats()
        finally:
            await node.stop()

    before, settled, later = asyncio.run(main())
    fields = ("engine_steps", "prefix_hit_tokens", "requests_ok", "input_tokens", "output_tokens")
    view = lambda stats: {s.card: [getattr(s, f) for f in fields] for s in stats}       # noqa: E731
    assert view(settled) == view(later)
    assert sum(s.requests_ok for s in settled) - sum(s.requests_ok for s in before) == 60
    assert all(s.engine_steps > 0 for s in settled)
