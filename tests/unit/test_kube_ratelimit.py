"""The client-side rate limit: ``burst`` requests at once, then ``qps``; Leases never wait;
qps 0 is no limit."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from healer.adapters.kube.ratelimit import RateLimit, limit_requests

LEASE = "https://k/apis/coordination.k8s.io/v1/namespaces/healer-system/leases/healer-leader"
NODE = "https://k/api/v1/nodes/gpu-1"


class Rest:
    def __init__(self) -> None:
        self.sent: list[str] = []

    async def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> str:
        self.sent.append(url)
        return "ok"


class Api:
    def __init__(self) -> None:
        self.rest_client = Rest()


async def test_the_burst_goes_at_once_then_requests_wait_and_leases_never_do() -> None:
    api = Api()
    limiter = limit_requests(api, RateLimit(qps=0.001, burst=3))  # type: ignore[arg-type]
    for _ in range(3):
        assert await api.rest_client.request("GET", NODE) == "ok"
    late = asyncio.ensure_future(api.rest_client.request("PATCH", NODE))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not late.done()  # the bucket is empty: it waits for a token (1000 s here)
    # the leader's Lease renewal is not held behind it
    assert await api.rest_client.request("PUT", LEASE) == "ok"
    assert api.rest_client.sent == [NODE] * 3 + [LEASE]
    assert (limiter.sent, limiter.waited) == (5, 1)
    late.cancel()
    with pytest.raises(asyncio.CancelledError):
        await late


async def test_qps_zero_is_no_limit() -> None:
    api = Api()
    limit_requests(api, RateLimit(qps=0, burst=1))  # type: ignore[arg-type]
    for _ in range(50):
        await api.rest_client.request("GET", NODE)
    assert len(api.rest_client.sent) == 50


@pytest.mark.parametrize(("qps", "burst"), [(-1.0, 10), (10.0, 0)])
def test_nonsense_limits_are_refused(qps: float, burst: int) -> None:
    with pytest.raises(ValueError, match="rate limit"):
        RateLimit(qps, burst)
