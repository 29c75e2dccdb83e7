"""healer.obs."""
