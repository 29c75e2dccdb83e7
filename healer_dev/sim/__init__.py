"""healer_dev.sim: simulators for the local stack and the bench (DCGM exporters, shard plans)."""
