"""healer.adapters."""
