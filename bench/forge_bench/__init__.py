"""`forge bench`: the engine driven directly vs forge vs forge with FIFO on the same work, the
engine-tier sweep, and forge's control-plane ceiling (docs/benchmarks.md)."""
