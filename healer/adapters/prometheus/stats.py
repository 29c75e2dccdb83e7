"""What one poll did (:class:`PollStats`) and what a query's answer may be (``Answer``)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from healer.errors import HealerError

#: One query's answer handed to :meth:`PrometheusSource.parse_poll`: the raw HTTP body, the
#: decoded ``result`` list, or the error the query ended with.
Answer = bytes | list[Any] | HealerError


@dataclass(frozen=True, slots=True)
class PollStats:
    """What one poll did, for metrics and logs."""

    at: float  # the poll's evaluation time
    duration: float  # wall seconds the poll took
    queries: int
    failed_queries: int
    http_requests: int
    samples: int
    signals: int
    xid_events: int
    fresh_nodes: int
    stale_nodes: int
    unmapped_samples: int  # samples without a node label (see host_labels / node_map)
    stale_samples: int  # emitted-worthy samples of nodes without a heartbeat now (dropped)
    outage: bool
    errors: tuple[str, ...] = ()
    malformed_samples: int = 0  # entries skipped: wrong shape, NaN or ±Inf
    rounds: int = 1  # 2 when follow-up queries were answered (see ``follow_up_queries``)
