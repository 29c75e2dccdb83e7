"""The runtime: serial per-node workers, the executor, sources, leadership."""
