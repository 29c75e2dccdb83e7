"""healer_dev.devstack."""
