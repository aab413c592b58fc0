"""Spills of tests/broker/test_balance.py's closed loop (two cards at speeds 3:1, 16 prefix families, 1,200 requests)
over eight seeds, with output classes of 2**BITS per power of two (docs/benchmarks.md, "The sixth session on the
H200"; since 2026-12-02 a broker of one engine uses quarters, of several the power of two, and this sets the
classes of the two-card broker directly). From the repo root:

    python docs/bench/cpu-proxy/class_spills.py BITS        (0: the shipped power of two; 1 halves; 2 quarters)
"""
import statistics
import sys

sys.path.insert(0, ".")

from forge.broker import BrokerCore  # noqa: E402
import tests.broker.test_balance as tb  # noqa: E402

SEEDS = range(1, 9)
BITS = [0]


def one_run(owner: str, in_system: int, seed: int) -> tuple[int, float]:
    """The test's setup for one seed: family 0 pinned to `owner` first, then the closed loop; (spills, fast share)."""
    geoms = [tb.geom(f"g{k}", slots=8, budget=1024) for k in range(2)]
    core = BrokerCore(geoms, grouping=True)
    core._pending.class_bits = BITS[0]
    sims = [tb.SimEngine(g, s) for g, s in zip(geoms, (24.0, 8.0))]
    first = geoms[0 if owner == "fast" else 1].engine_id
    pin = tb.req(tb.prefixed(0, 100, 10**6), max_new=32)
    core.add(pin)
    core.take(first, free_slots=1, free_kv_blocks=4096)
    core.on_done(first, pin)
    tb.simulate(core, sims, tb._requests(1200, seed=seed, families=16), in_system=in_system)
    return core.stats().affinity_spills, tb._shares(sims)[0]


def main(bits: int) -> None:
    BITS[0] = bits
    for owner in ("fast", "slow"):
        for in_system in (32, 64):
            runs = [one_run(owner, in_system, seed) for seed in SEEDS]
            spills = [s for s, _ in runs]
            shares = [f for _, f in runs]
            print(f"bits {bits}, owner {owner}, {in_system} in system: spills of 1,201 mean "
                  f"{statistics.mean(spills):.0f}, max {max(spills)} {spills}; fast card's share "
                  f"{min(shares):.3f}-{max(shares):.3f}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
