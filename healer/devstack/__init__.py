"""healer.devstack."""
