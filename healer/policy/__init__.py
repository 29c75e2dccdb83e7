"""healer.policy."""
