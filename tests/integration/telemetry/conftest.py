"""A real Prometheus 2.42 scraping the DCGM simulator every second (one of each per module).

The simulated exporters run in their own thread (:class:`ThreadedDcgmFleet`), so they answer
scrapes all the time, also between tests. Every fault test owns its node; faults are cleared
after each test. If Prometheus cannot start, the tests error with its log tail (never skip).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from aiohttp import web

from healer.adapters.prometheus import PrometheusSource
from healer.core.health import Verdict, evaluate_node
from healer.core.model import NodeView, Signal, SignalKind
from healer.core.rules import PolicySet
from healer.obs.http import serve
from healer.policy.load import load_policy_set
from healer_dev.devstack.prometheus import LocalPrometheus
from healer_dev.sim.dcgm import DcgmSim, NodeSpec, make_node
from healer_dev.sim.dcgm_server import ThreadedDcgmFleet

REPO = Path(__file__).resolve().parents[3]
SCRAPE = 1.0  # seconds, Prometheus scrape interval
POLL = 1.0  # seconds, the source's poll interval
STALE_AFTER = 3 * SCRAPE
GPU_NODE = {"nvidia.com/gpu.present": "true"}

# node name → host label spelling and options; every fault test owns one node
FLEET: dict[str, dict[str, Any]] = {
    "n-xid": {},
    "n-xid-gauge": {"host_label": "hostname", "xid_count": False},
    "n-dbe": {},
    "n-sbe": {},
    "n-rrp": {},
    "n-rrf": {},
    "n-nvl": {"host_label": "hostname"},
    "n-pcie": {},
    "n-hot": {"host_label": "hostname"},
    "n-gone": {},
    "n-503": {},
    "n-refused": {"host_label": "hostname"},
    "n-empty": {},
    "n-job": {"host_label": "hostname", "hpc_jobs": {0: ["4242", "4243"]},
              "serial_label": True},
    "n-hist": {},
    "n-calm": {"host_label": "hostname"},
    "n-recover": {},
    "n-inf": {},
}


def fleet_nodes() -> list[NodeSpec]:
    return [make_node(name, 2, **opts) for name, opts in FLEET.items()]


@pytest.fixture(scope="module")
def fleet() -> Iterator[ThreadedDcgmFleet]:
    with ThreadedDcgmFleet(DcgmSim(fleet_nodes())) as f:
        yield f


@pytest.fixture(scope="module")
def prom(fleet: ThreadedDcgmFleet, tmp_path_factory: pytest.TempPathFactory
         ) -> Iterator[LocalPrometheus]:
    p = LocalPrometheus(tmp_path_factory.mktemp("prometheus"), fleet.targets, f"{SCRAPE:g}s")
    p.start()  # ConfigError with the log tail if it does not come up: the tests error
    try:
        p.wait_for_series(f'count(up{{job="dcgm"}} == 1) == {len(FLEET)}', timeout=30)
        yield p
    finally:
        p.stop()


@pytest.fixture(autouse=True)
def _clear_faults(fleet: ThreadedDcgmFleet) -> Iterator[None]:
    yield
    fleet.clear()


@pytest.fixture(scope="session")
def default_policies() -> PolicySet:
    return load_policy_set([REPO / "policies" / "default.yaml"])


@pytest.fixture(scope="session")
def fast_policies(tmp_path_factory: pytest.TempPathFactory) -> PolicySet:
    """policies/default.yaml with every ``for:`` at 2s and every window at 20s, so that the
    rules that hold for minutes confirm within a test."""
    docs = list(yaml.safe_load_all((REPO / "policies" / "default.yaml").read_text()))
    for doc in docs:
        if doc.get("kind") != "RemediationPolicy":
            continue
        for rule in doc["spec"]["rules"]:
            metric = rule.get("metric")
            if metric is None:
                continue
            if "for" in metric:
                metric["for"] = "2s"
            if "window" in metric:
                metric["window"] = "20s"
    path = tmp_path_factory.mktemp("policies") / "fast.yaml"
    path.write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return load_policy_set([path])


def make_source(prom: LocalPrometheus | str, policies: PolicySet, **kw: Any) -> PrometheusSource:
    url = prom if isinstance(prom, str) else prom.url
    kw.setdefault("poll_interval", POLL)
    kw.setdefault("stale_after", STALE_AFTER)
    kw.setdefault("timeout", 5.0)
    return PrometheusSource(url, policies, **kw)


class Sink:
    """A SignalSink that remembers every signal with the wall time it arrived."""

    def __init__(self) -> None:
        self.received: list[tuple[float, Signal]] = []
        self.batches = 0

    async def __call__(self, signals: Any) -> None:
        now = time.time()
        self.batches += 1
        self.received.extend((now, s) for s in signals)

    def of(self, node: str) -> list[Signal]:
        return [s for _, s in self.received if s.node == node]

    def matching(self, pred: Callable[[Signal], bool], after: float = 0.0
                 ) -> list[tuple[float, Signal]]:
        return [(t, s) for t, s in self.received if t >= after and pred(s)]

    async def wait(self, pred: Callable[[Signal], bool], *, after: float = 0.0,
                   within: float = 15.0, what: str = "signal") -> tuple[float, Signal]:
        """The first (arrival time, signal) with ``pred``, arriving at or after ``after``."""
        deadline = time.monotonic() + within
        while True:
            found = self.matching(pred, after)
            if found:
                return found[0]
            if time.monotonic() > deadline:
                recent = [s for _, s in self.received[-8:]]
                raise AssertionError(f"no {what} within {within:g}s; last signals: {recent}")
            await asyncio.sleep(0.02)

    async def wait_polls(self, n: int, within: float = 15.0) -> None:
        target = self.batches + n
        deadline = time.monotonic() + within
        while self.batches < target:
            assert time.monotonic() < deadline, f"fewer than {n} polls in {within:g}s"
            await asyncio.sleep(0.02)


def fresh(node: str) -> Callable[[Signal], bool]:
    return lambda s: s.node == node and s.kind is SignalKind.FRESH


def stale(node: str, reason: str | None = None) -> Callable[[Signal], bool]:
    return lambda s: (s.node == node and s.kind is SignalKind.STALE
                      and (reason is None or s.get("reason") == reason))


@contextlib.asynccontextmanager
async def running(source: PrometheusSource, sink: Sink) -> AsyncIterator[Sink]:
    """``source.run(sink)`` as a background task for the duration of the block."""
    task = asyncio.create_task(source.run(sink))
    try:
        yield sink
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task  # re-raises what killed the loop, if anything did
        source.close()


def verdict(node: str, signals: list[Signal], policies: PolicySet,
            now: float | None = None) -> Verdict:
    """The node's health with every policy that selects a GPU node (worst wins)."""
    view = NodeView(node, GPU_NODE)
    return evaluate_node(node, signals, policies.policies_for(view),
                         time.time() if now is None else now)


async def first_sample(prom: LocalPrometheus, metric: str, uuid: str,
                       pred: Callable[[float], bool], lookback: str = "2m") -> float:
    """Prometheus' timestamp of the first scraped sample of ``metric`` on that GPU with
    ``pred(value)`` (what the scrape→signal latency is measured from)."""
    q = f'{metric}{{UUID="{uuid}"}}[{lookback}]'
    result = await asyncio.to_thread(prom.query, q)
    times = sorted(float(t) for series in result for t, v in series["values"]
                   if pred(float(v)))
    assert times, f"Prometheus holds no sample of {q} that matches"
    return times[0]


async def last_sample(prom: LocalPrometheus, metric: str, uuid: str,
                      lookback: str = "2m") -> float:
    q = f'{metric}{{UUID="{uuid}"}}[{lookback}]'
    result = await asyncio.to_thread(prom.query, q)
    times = [float(t) for series in result for t, _ in series["values"]]
    assert times, f"Prometheus holds no sample of {q}"
    return max(times)


EMPTY_RESULT = b'{"status":"success","data":{"resultType":"vector","result":[]}}'


@contextlib.asynccontextmanager
async def fake_prometheus(handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                          ssl_context: ssl.SSLContext | None = None) -> AsyncIterator[str]:
    """A stand-in for Prometheus' HTTP API on loopback (errors, TLS, headers); its URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = await serve(app, "127.0.0.1", 0, ssl_context)
    host, port = runner.addresses[0][:2]
    try:
        yield f"{'https' if ssl_context else 'http'}://{host}:{port}"
    finally:
        await runner.cleanup()
