"""healer.sim."""
