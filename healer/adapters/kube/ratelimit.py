"""Client-side rate limit of the requests healer sends the API server: QPS and burst, as
client-go's token bucket (``--kube-api-qps``, ``--kube-api-burst``), on aiolimiter.

Every request an :class:`~kubernetes_asyncio.client.ApiClient` sends (reads, writes, the start
of a watch) takes one token first; ``burst`` tokens may be spent at once, and they come back at
``qps`` per second. This is the client's own politeness; the API server's priority and fairness
still answers 429 with ``Retry-After`` when it is busy, which the one retry policy honours
(:mod:`healer.adapters.retry`). Lease requests (leader election) bypass the bucket: a leader
that could not renew its Lease during a storm of remediations would lose it and stop them all
(client-go's advice is a separate client for the election; this is the same, in one place).

Setting ``qps`` to 0 turns the limit off (benchmarks of the API server itself, tests).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiolimiter import AsyncLimiter
from kubernetes_asyncio import client

#: Requests whose URL contains one of these are never held back (leader election).
EXEMPT = ("/apis/coordination.k8s.io/",)


@dataclass(frozen=True, slots=True)
class RateLimit:
    """Requests per second once the burst is spent, and the burst (0 qps: no limit)."""

    qps: float = 50.0
    burst: int = 300

    def __post_init__(self) -> None:
        if self.qps < 0 or self.burst < 1:
            raise ValueError(f"kube API rate limit: qps must be >= 0 and burst >= 1, got "
                             f"qps={self.qps} burst={self.burst}")


class RequestLimiter:
    """The token bucket in front of one ApiClient's REST client (:func:`limit_requests`)."""

    def __init__(self, limit: RateLimit) -> None:
        self.limit = limit
        self._bucket = AsyncLimiter(limit.burst, limit.burst / limit.qps) if limit.qps else None
        #: requests sent, and how many of them waited for a token (for /debug and the bench)
        self.sent = 0
        self.waited = 0

    async def acquire(self, url: str) -> None:
        self.sent += 1
        if self._bucket is None or any(e in url for e in EXEMPT):
            return
        if not self._bucket.has_capacity():
            self.waited += 1
        await self._bucket.acquire()


def limit_requests(api: client.ApiClient, limit: RateLimit) -> RequestLimiter:
    """Put ``limit`` in front of every request ``api`` sends; returns the limiter."""
    limiter = RequestLimiter(limit)
    rest = api.rest_client
    send: Callable[..., Awaitable[Any]] = rest.request

    async def request(method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        await limiter.acquire(url)
        return await send(method, url, *args, **kwargs)

    rest.request = request  # type: ignore[method-assign]
    return limiter
