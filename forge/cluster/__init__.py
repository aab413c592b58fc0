"""forge on a Ray cluster (docs/cluster.md): node agents join a Ray cluster and hold one engine
actor per card; `forge deploy --cluster` runs a job across every provisioned node through one
broker.

Nothing here imports Ray at module level: the single-machine path never needs it (`forge[ray]`
extra)."""
