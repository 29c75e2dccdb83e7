"""A 20-node simulated fleet on the real Prometheus: what each poll asks for and gets.

Every query the source sends goes through a recording proxy, so the tests assert on the
queries of the poll that reported something: an XID injected on one GPU is reported exactly
once and the raw XID answer holds only that host's series; a GPU whose series disappear gives
the ``gpu-missing`` STALE naming it while the other 19 nodes stay FRESH, and only that node's
per-GPU freshness rows are fetched in that poll.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field

import aiohttp
import pytest
from aiohttp import web

from healer.adapters.prometheus import PrometheusSource
from healer.core.model import GpuRef, Signal, SignalKind
from healer.core.rules import MetricRule, PolicySet
from healer.obs.http import serve
from healer_dev.devstack.prometheus import LocalPrometheus
from healer_dev.sim.dcgm import DcgmSim, Fault, FaultKind, gpu_uuid, make_node
from healer_dev.sim.dcgm_server import ThreadedDcgmFleet
from tests.integration.telemetry.conftest import POLL, SCRAPE, make_source

pytestmark = pytest.mark.integration

NODES = [f"f-{i:02d}" for i in range(20)]


@pytest.fixture(scope="module")
def fleet() -> Iterator[ThreadedDcgmFleet]:
    with ThreadedDcgmFleet(DcgmSim([make_node(n, 2) for n in NODES])) as f:
        yield f


@pytest.fixture(scope="module")
def prom(fleet: ThreadedDcgmFleet, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[LocalPrometheus]:
    p = LocalPrometheus(tmp_path_factory.mktemp("prometheus20"), fleet.targets, f"{SCRAPE:g}s")
    p.start()
    try:
        p.wait_for_series(f'count(up{{job="dcgm"}} == 1) == {len(NODES)}', timeout=30)
        yield p
    finally:
        p.stop()


@dataclass
class Recorder:
    """Every (query, answer body) sent through the proxy, in order."""

    sent: list[tuple[str, bytes]] = field(default_factory=list)

    def since(self, mark: int) -> list[tuple[str, list[dict[str, object]]]]:
        return [(q, json.loads(b)["data"]["result"]) for q, b in self.sent[mark:]]


@pytest.fixture
async def proxied(prom: LocalPrometheus) -> AsyncIterator[tuple[str, Recorder]]:
    rec = Recorder()
    async with aiohttp.ClientSession() as upstream:

        async def forward(request: web.Request) -> web.Response:
            params = dict(request.query)
            if request.method == "POST":
                params.update({k: str(v) for k, v in (await request.post()).items()})
            async with upstream.get(prom.url + request.path, params=params) as r:
                body = await r.read()
            rec.sent.append((params.get("query", ""), body))
            return web.Response(status=r.status, body=body, content_type="application/json")

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", forward)
        runner = await serve(app, "127.0.0.1", 0)
        host, port = runner.addresses[0][:2]
        try:
            yield f"http://{host}:{port}", rec
        finally:
            await runner.cleanup()


async def poll(source: PrometheusSource) -> list[Signal]:
    signals = await source.poll_once()
    await asyncio.sleep(POLL)
    return signals


async def settle(source: PrometheusSource) -> None:
    """Poll until every node is FRESH from the per-node answer alone (no follow-up)."""
    for _ in range(15):
        signals = await poll(source)
        fresh = {s.node for s in signals if s.kind is SignalKind.FRESH}
        if fresh == set(NODES) and source.last_poll is not None \
                and source.last_poll.rounds == 1:
            return
    raise AssertionError("the fleet did not settle")


def host_matcher(node: str) -> str:
    """``Hostname=~"<node, regex-escaped, then PromQL-quoted>"``."""
    return "Hostname=~" + json.dumps(re.escape(node))


def raw_xid(sent: list[tuple[str, list[dict[str, object]]]]) -> list[str]:
    """The raw XID queries among ``sent``."""
    return [q for q, _ in sent if q.lstrip().startswith("{__name__=~")]


def hosts_of(result: list[dict[str, object]]) -> set[str]:
    return {str(e["metric"].get("Hostname")) for e in result  # type: ignore[attr-defined]
            if isinstance(e, dict)}


async def test_xid_on_one_gpu_is_reported_once_and_fetched_for_its_host_only(
        fleet: ThreadedDcgmFleet, proxied: tuple[str, Recorder],
        default_policies: PolicySet) -> None:
    url, rec = proxied
    node = "f-07"
    # an overlap of a few scrapes (not 30 s): the XID's change leaves the window soon
    source = make_source(url, default_policies, forget_after=1e9, xid_overlap=3 * SCRAPE)
    try:
        await settle(source)
        mark = len(rec.sent)
        await poll(source)
        assert not [q for q, _ in rec.since(mark) if q.lstrip().startswith("{__name__=~")]
        fleet.inject(Fault(FaultKind.XID, node, 1, code=79))
        xids: list[Signal] = []
        for _ in range(15):
            mark = len(rec.sent)
            got = [s for s in await poll(source) if s.kind is SignalKind.XID]
            if got:
                xids += got
                break
        else:
            raise AssertionError("no XID signal")
        (sig,) = xids
        assert (sig.node, sig.gpu, sig.value) == (node, GpuRef(1, gpu_uuid(node, 1)), 79.0)
        raw = [(q, r) for q, r in rec.since(mark) if q.lstrip().startswith("{__name__=~")]
        assert len(raw) == 1, [q for q, _ in raw]
        query, result = raw[0]
        assert host_matcher(node) in query
        assert result  # its series, and only its host's
        assert hosts_of(result) == {node}
        for _ in range(3):  # reported once: later polls of the same XID say nothing
            mark = len(rec.sent)
            assert not [s for s in await poll(source) if s.kind is SignalKind.XID]
            for q, r in rec.since(mark):
                if q.lstrip().startswith("{__name__=~"):
                    assert hosts_of(r) <= {node}
        # then, stuck at 79 (the gauge keeps it, the count series stays): nothing new, so
        # the pre-query lists nothing and no raw XID series is fetched at all
        for _ in range(10):
            mark = len(rec.sent)
            assert not [s for s in await poll(source) if s.kind is SignalKind.XID]
            if not raw_xid(rec.since(mark)):
                break
        else:
            raise AssertionError("the XID's host is still fetched")
        for _ in range(2):
            mark = len(rec.sent)
            assert not [s for s in await poll(source) if s.kind is SignalKind.XID]
            assert raw_xid(rec.since(mark)) == []
            (pre,) = [r for q, r in rec.since(mark) if "changes(" in q]
            assert pre == []  # the GPU stuck at 79 is not listed
    finally:
        source.close()


async def test_missing_gpu_is_named_and_only_its_node_gets_per_gpu_rows(
        fleet: ThreadedDcgmFleet, proxied: tuple[str, Recorder],
        default_policies: PolicySet) -> None:
    url, rec = proxied
    node = "f-12"
    gone = GpuRef(1, gpu_uuid(node, 1))
    # the metric rules only: the other test's XID stays in the pre-query's window (its
    # raw samples, and its node's per-GPU rows, would be fetched in every poll)
    metric_only = PolicySet(tuple(
        dataclasses.replace(p, rules=tuple(r for r in p.rules if isinstance(r, MetricRule)))
        for p in default_policies.policies))
    source = make_source(url, metric_only, forget_after=1e9)
    try:
        await settle(source)
        fleet.inject(Fault(FaultKind.GPU_GONE, node, 1))
        for _ in range(15):
            mark = len(rec.sent)
            signals = await poll(source)
            stale = [s for s in signals if s.kind is SignalKind.STALE]
            if stale:
                break
        else:
            raise AssertionError("no STALE signal")
        assert [(s.node, s.gpu, s.get("reason")) for s in stale] == [
            (node, gone, "gpu-missing")]
        fresh = sorted(s.node for s in signals if s.kind is SignalKind.FRESH)
        assert fresh == sorted(set(NODES) - {node})
        assert not any(source.live.refresh_due(n) for n in NODES)  # no inventory refresh now
        sent = rec.since(mark)
        per_gpu = [(q, r) for q, r in sent if "timestamp(" in q and "=~" in q]
        assert len(per_gpu) == 1, [q for q, _ in per_gpu]
        query, result = per_gpu[0]
        assert host_matcher(node) in query
        assert hosts_of(result) == {node}
        assert len(result) == 1  # the GPU left
        # the first-round freshness answer: two rows per node, not one per GPU
        (first,) = [r for q, r in sent if "healer_fresh" in q]
        assert len(first) == 2 * len(NODES)
        fleet.clear()
        for _ in range(15):
            signals = await poll(source)
            if node in {s.node for s in signals if s.kind is SignalKind.FRESH}:
                break
        else:
            raise AssertionError(f"{node} never FRESH again")
    finally:
        source.close()
