"""healer.runtime."""
