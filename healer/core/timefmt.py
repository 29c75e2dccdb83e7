"""Kubernetes timestamps (metav1.Time: RFC 3339, UTC, whole seconds) to and from seconds since
the epoch. Pure: converts the times it is given, never reads a clock."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any


def rfc3339(t: float) -> str:
    """Seconds since the epoch → ``2024-05-01T12:00:00Z``."""
    return datetime.fromtimestamp(int(t), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(value: Any) -> float | None:
    """An API timestamp (string, or the datetime a typed client returns) → seconds since the
    epoch; None when absent or unreadable."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None
