"""PrometheusSource against a real Prometheus scraping the DCGM simulator every second.

Per fault kind: the right signal (kind, key, value, GPU) reaches the sink within two poll
intervals of the first scrape that shows the fault (the latency is printed), and the real
default policy turns the node's signals into the right verdict. Telemetry trouble (an exporter
down, a node without series, Prometheus down, a scrape gap) is *stale* — never disruptive — and
its recovery is noticed. Run with ``-s`` to see the latencies.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import structlog
from aiohttp import web

from healer.adapters.prometheus.history import history
from healer.core.model import GpuRef, HealthState, Severity, Signal, SignalKind
from healer.core.rules import LabelSelector as Sel
from healer.core.rules import MetricRule, Op, Policy, PolicySet
from healer.errors import (
    ConfigError,
    ForbiddenError,
    NotFoundError,
    PermanentError,
    TransientError,
)
from healer.obs.http import serve
from healer.policy.load import load_policy_set
from healer_dev.devstack.certs import CertificateAuthority
from healer_dev.devstack.prometheus import LocalPrometheus
from healer_dev.sim.dcgm import Fault, FaultKind, M, gpu_uuid
from healer_dev.sim.dcgm_server import ThreadedDcgmFleet
from tests.integration.telemetry.conftest import (
    EMPTY_RESULT,
    FLEET,
    POLL,
    SCRAPE,
    Sink,
    fake_prometheus,
    first_sample,
    fresh,
    last_sample,
    make_source,
    running,
    stale,
    verdict,
)

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[3]

LATENCIES: dict[str, float] = {}


def gpu(node: str, index: int) -> GpuRef:
    return GpuRef(index, gpu_uuid(node, index))


def every_temp() -> PolicySet:
    """A rule every GPU violates: a live poll emits only violating series (and one recovery),
    so the tests that look at every GPU's temperature series use this one."""
    rule = MetricRule("any-temp", Severity.DEGRADING, M.GPU_TEMP, Op.GE, -1000.0)
    return PolicySet((Policy("p", Sel(), (rule,)),))


@dataclass(frozen=True)
class Case:
    id: str
    node: str
    gpu: int
    fault: Callable[[str, int], Fault]
    kind: SignalKind
    key: str
    value: Callable[[float], bool]
    metric: str  # the raw series whose first faulty sample starts the latency clock
    raw: Callable[[float], bool]
    state: HealthState  # with policies/default.yaml
    rule: str
    fast_state: HealthState | None = None  # with every for:/window shortened


def _key(rule: str) -> str:
    """The signal key of one of the default policies' metric rules."""
    ps = load_policy_set([ROOT / "policies" / "default.yaml"])
    for p in ps.policies:
        r = p.rule(rule)
        if isinstance(r, MetricRule):
            return r.key
    raise KeyError(rule)


CASES = [
    Case("xid-burst", "n-xid", 1,
         lambda n, g: Fault(FaultKind.XID, n, g, code=79, count=3),
         SignalKind.XID, M.XID_ERRORS, lambda v: v == 79, M.XID_ERRORS, lambda v: v == 79,
         HealthState.FAILED, "fatal-xid"),
    Case("ecc-dbe-growth", "n-dbe", 0,
         lambda n, g: Fault(FaultKind.ECC_DBE, n, g, count=2),
         SignalKind.METRIC, _key("ecc-dbe"), lambda v: v > 0, M.ECC_DBE_VOL, lambda v: v > 0,
         HealthState.FAILED, "ecc-dbe"),
    Case("ecc-sbe-storm", "n-sbe", 1,
         lambda n, g: Fault(FaultKind.ECC_SBE, n, g, count=5000, rate=50),
         SignalKind.METRIC, _key("ecc-sbe-storm"), lambda v: v > 1000, M.ECC_SBE_VOL,
         lambda v: v > 0,
         HealthState.DEGRADING, "ecc-sbe-storm"),
    Case("row-remap-pending", "n-rrp", 0,
         lambda n, g: Fault(FaultKind.ROW_REMAP_PENDING, n, g),
         SignalKind.METRIC, M.ROW_REMAP_PENDING, lambda v: v == 1, M.ROW_REMAP_PENDING,
         lambda v: v == 1, HealthState.SUSPECT, "row-remap-pending", HealthState.DEGRADING),
    Case("row-remap-failure", "n-rrf", 1,
         lambda n, g: Fault(FaultKind.ROW_REMAP_FAILURE, n, g),
         SignalKind.METRIC, M.ROW_REMAP_FAILURE, lambda v: v == 1, M.ROW_REMAP_FAILURE,
         lambda v: v == 1, HealthState.FAILED, "row-remap-failure"),
    Case("nvlink-crc-growth", "n-nvl", 0,
         lambda n, g: Fault(FaultKind.NVLINK_CRC, n, g, count=500, rate=20),
         SignalKind.METRIC, _key("nvlink-crc-errors"), lambda v: v > 100, M.NVLINK_CRC_FLIT,
         lambda v: v > 0, HealthState.DEGRADING, "nvlink-crc-errors"),
    Case("pcie-replay", "n-pcie", 1,
         lambda n, g: Fault(FaultKind.PCIE_REPLAY, n, g, count=500),
         SignalKind.METRIC, _key("pcie-replays"), lambda v: v > 100, M.PCIE_REPLAY, lambda v: v > 0,
         HealthState.DEGRADING, "pcie-replays"),
    Case("thermal-throttling", "n-hot", 0,
         lambda n, g: Fault(FaultKind.THERMAL, n, g, value=95, rate=6e8),
         SignalKind.METRIC, M.GPU_TEMP, lambda v: v == 95, M.GPU_TEMP, lambda v: v == 95,
         HealthState.SUSPECT, "gpu-too-hot", HealthState.DEGRADING),
    Case("gpu-disappearing", "n-gone", 1,
         lambda n, g: Fault(FaultKind.GPU_GONE, n, g),
         SignalKind.STALE, "dcgm", lambda v: v == 0, M.GPU_TEMP, lambda v: True,
         HealthState.STALE, "telemetry-stale"),
]


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_fault_reaches_the_sink_and_the_verdict(
        case: Case, fleet: ThreadedDcgmFleet, prom: LocalPrometheus,
        default_policies: PolicySet, fast_policies: PolicySet) -> None:
    node, ref = case.node, gpu(case.node, case.gpu)
    source = make_source(prom, default_policies)
    async with running(source, Sink()) as sink:
        await sink.wait(fresh(node), what=f"FRESH for {node}")
        injected = time.time()
        fleet.inject(case.fault(node, case.gpu))

        def hit(s: Signal) -> bool:
            return (s.node == node and s.kind is case.kind and s.key == case.key
                    and s.gpu == ref and case.value(s.value))

        arrived, sig = await sink.wait(hit, after=injected, what=case.id)
        if case.kind is SignalKind.STALE:
            # the first scrape without the GPU is one interval after its last sample
            scraped = await last_sample(prom, case.metric, ref.uuid) + SCRAPE
            assert sig.get("reason") == "gpu-missing"
        else:
            scraped = await first_sample(prom, case.metric, ref.uuid, case.raw)
            assert sig.observed_at >= scraped - 0.001
        latency = arrived - scraped
        LATENCIES[case.id] = latency
        print(f"\n  {case.id:20s} {case.kind.value:6s} {case.key:46s} value={sig.value:g} "
              f"on {ref.describe()}: scrape→signal {latency * 1000:5.0f} ms (poll {POLL:g}s)")
        assert -0.1 <= latency <= 2 * POLL, f"{case.id}: {latency:.3f}s from scrape to signal"

        if case.kind is SignalKind.XID:  # every occurrence of the burst, once
            await sink.wait_polls(3)
            burst = sink.matching(hit, after=injected)
            assert len(burst) == 3
            assert {s.get("via") for _, s in burst} == {"count"}

        v = verdict(node, sink.of(node), default_policies)
        assert v.state is case.state, v.summary()
        assert case.rule in [m.rule for m in v.matches]
        if case.state.is_confirmed:
            assert v.gpus == (ref,)
            assert v.severity is (Severity.FAILED if case.state is HealthState.FAILED
                                  else Severity.DEGRADING)
        else:
            assert v.severity is None  # suspect or stale never disrupts
        if case.fast_state is not None:  # the same signals confirm once held long enough
            deadline = time.monotonic() + 15
            while True:
                fast = verdict(node, sink.of(node), fast_policies)
                if fast.state is case.fast_state or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.1)
            assert fast.state is case.fast_state, fast.summary()
            assert fast.gpus == (ref,)


async def test_xid_last_value_and_repeats(fleet: ThreadedDcgmFleet, prom: LocalPrometheus,
                                          default_policies: PolicySet) -> None:
    """The last-value gauge is reported once per change; a repeat is seen only via the count."""
    counted, gauge_only = "n-xid", "n-xid-gauge"
    source = make_source(prom, default_policies)
    async with running(source, Sink()) as sink:
        for n in (counted, gauge_only):
            await sink.wait(fresh(n), what=f"FRESH for {n}")

        def xid(node: str, code: int) -> Callable[[Signal], bool]:
            return lambda s: s.node == node and s.kind is SignalKind.XID and s.value == code

        t0 = time.time()
        fleet.inject(Fault(FaultKind.XID, gauge_only, 0, code=48))
        fleet.inject(Fault(FaultKind.XID, counted, 0, code=13))
        _, sig = await sink.wait(xid(gauge_only, 48), after=t0)
        assert sig.get("via") == "last-value"
        assert sig.gpu == gpu(gauge_only, 0)
        await sink.wait(xid(counted, 13), after=t0)
        await sink.wait_polls(3)  # the same last value on later polls is not reported again
        assert len(sink.matching(xid(gauge_only, 48), after=t0)) == 1
        assert len(sink.matching(xid(counted, 13), after=t0)) == 1
        # the same XID again: visible in the count series only
        t1 = time.time()
        fleet.inject(Fault(FaultKind.XID, counted, 0, code=13))
        fleet.inject(Fault(FaultKind.XID, gauge_only, 0, code=48))
        _, again = await sink.wait(xid(counted, 13), after=t1)
        assert again.get("via") == "count"
        # a different code on the gauge-only exporter is a change again
        fleet.inject(Fault(FaultKind.XID, gauge_only, 0, code=79))
        await sink.wait(xid(gauge_only, 79), after=t1)
        await sink.wait_polls(2)
        assert len(sink.matching(xid(gauge_only, 48), after=t1)) == 0  # invisible repeat
        assert len(sink.matching(xid(counted, 13), after=t1)) == 1
        v = verdict(gauge_only, sink.of(gauge_only), default_policies)
        assert v.state is HealthState.FAILED  # 48 and 79 are fatal
        assert v.gpus == (gpu(gauge_only, 0),)


async def test_only_violating_series_and_one_recovery_are_emitted(
        fleet: ThreadedDcgmFleet, prom: LocalPrometheus, default_policies: PolicySet) -> None:
    """gpu-too-hot (temperature >= 90): nothing while cool, the hot GPU every poll while hot,
    then exactly one signal with the real (cool) value when it cools down, then nothing."""
    node, hot = "n-recover", gpu("n-recover", 0)
    source = make_source(prom, default_policies)

    def temp(s: Signal) -> bool:
        return s.node == node and s.kind is SignalKind.METRIC and s.key == M.GPU_TEMP

    async with running(source, Sink()) as sink:
        await sink.wait(fresh(node), what=f"FRESH for {node}")
        await sink.wait_polls(2)
        assert not sink.matching(temp)  # cool GPUs are never emitted
        t0 = time.time()
        fleet.inject(Fault(FaultKind.THERMAL, node, 0, value=95, rate=6e8))
        await sink.wait(lambda s: temp(s) and s.value == 95, after=t0, what="hot")
        await sink.wait_polls(3)
        t1 = time.time()
        fleet.clear(node=node)
        _, back = await sink.wait(lambda s: temp(s) and s.value < 90, after=t1,
                                  what="the recovery signal")
        await sink.wait_polls(3)
        polls = sink.batches
    mine = [s for _, s in sink.matching(temp)]
    assert {s.gpu for s in mine} == {hot}  # the cool GPU never
    violating = [s for s in mine if s.value >= 90]
    recovered = [s for s in mine if s.value < 90]
    assert len(violating) >= 3  # every poll while hot
    assert recovered == [back]  # exactly one, with the real value
    assert mine[-1] == back  # and nothing after it
    assert 0 < back.value < 90
    assert verdict(node, sink.of(node), default_policies).state is HealthState.HEALTHY
    print(f"\n  {len(violating)} violating signals, 1 recovery (value {back.value:g}) "
          f"in {polls} polls")


async def test_exporter_down_is_stale_never_failed_and_recovers(
        fleet: ThreadedDcgmFleet, prom: LocalPrometheus, default_policies: PolicySet) -> None:
    source = make_source(prom, default_policies)
    async with running(source, Sink()) as sink:
        for n in ("n-503", "n-refused"):
            await sink.wait(fresh(n), what=f"FRESH for {n}")
        t0 = time.time()
        fleet.inject(Fault(FaultKind.EXPORTER_DOWN, "n-503", mode="503"))
        fleet.inject(Fault(FaultKind.EXPORTER_DOWN, "n-refused", mode="refused"))
        for n in ("n-503", "n-refused"):
            t, s = await sink.wait(stale(n, "exporter-down"), after=t0, what=f"STALE for {n}")
            print(f"\n  exporter down ({n}): STALE after {t - t0:.2f}s ({s.get('reason')})")
            assert s.key == "dcgm"
            assert s.value == 0
            assert s.gpu is None
            v = verdict(n, sink.of(n), default_policies)
            assert v.state is HealthState.STALE, v.summary()
            assert v.severity is None
        assert source.last_poll is not None
        assert not source.last_poll.outage
        t1 = time.time()
        fleet.clear()
        for n in ("n-503", "n-refused"):
            t, _ = await sink.wait(fresh(n), after=t1, within=20, what=f"FRESH again for {n}")
            print(f"  exporter back ({n}): FRESH after {t - t1:.2f}s")
            assert verdict(n, sink.of(n), default_policies).state is HealthState.HEALTHY


async def test_node_whose_series_are_missing_is_stale(
        fleet: ThreadedDcgmFleet, prom: LocalPrometheus, default_policies: PolicySet) -> None:
    node = "n-empty"
    source = make_source(prom, default_policies)
    async with running(source, Sink()) as sink:
        await sink.wait(fresh(node))
        t0 = time.time()
        fleet.inject(Fault(FaultKind.GPU_GONE, node, None))  # the exporter answers, empty
        _, _s = await sink.wait(stale(node, "series-missing"), after=t0)
        v = verdict(node, sink.of(node), default_policies)
        assert v.state is HealthState.STALE, v.summary()
        assert "reported stale" in v.summary()
        assert not [x for x in sink.of(node) if x.kind is SignalKind.METRIC
                    and x.observed_at > t0 + SCRAPE]
        t1 = time.time()
        fleet.clear()
        await sink.wait(fresh(node), after=t1, within=20)
        assert verdict(node, sink.of(node), default_policies).state is HealthState.HEALTHY


async def test_both_host_label_spellings(prom: LocalPrometheus,
                                         default_policies: PolicySet) -> None:
    source = make_source(prom, every_temp())
    try:
        signals = await source.poll_once()
    finally:
        source.close()
    for node, opts in FLEET.items():
        temps = [s for s in signals if s.node == node and s.key == M.GPU_TEMP]
        assert sorted(s.gpu for s in temps if s.gpu) == [gpu(node, 0), gpu(node, 1)] or \
            opts.get("serial_label"), (node, opts.get("host_label", "Hostname"))
        assert any(s.kind is SignalKind.FRESH and s.node == node for s in signals), node
    assert source.last_poll is not None
    assert source.last_poll.unmapped_samples == 0
    # an adapter told about one spelling only cannot place the other's samples
    lower = make_source(prom, default_policies, host_labels=("hostname",))
    try:
        signals = await lower.poll_once()
    finally:
        lower.close()
    nodes = {s.node for s in signals}
    assert nodes == {n for n, o in FLEET.items() if o.get("host_label") == "hostname"}
    assert lower.last_poll is not None
    assert lower.last_poll.unmapped_samples > 0


async def test_hpc_job_and_serial_labels(prom: LocalPrometheus,
                                         default_policies: PolicySet) -> None:
    node = "n-job"
    source = make_source(prom, every_temp())
    try:
        signals = await source.poll_once()
    finally:
        source.close()
    temps = [s for s in signals if s.node == node and s.key == M.GPU_TEMP]
    assert len(temps) == 2  # one per GPU although GPU 0 has a series per job
    by_index = {s.gpu.index: s for s in temps if s.gpu}
    assert by_index[0].get("hpc_job") == "4242,4243"
    assert by_index[1].get("hpc_job") == ""
    assert all(s.gpu is not None and s.gpu.serial and s.gpu.uuid for s in temps)


async def test_one_query_per_rule_for_the_whole_fleet(prom: LocalPrometheus,
                                                      default_policies: PolicySet) -> None:
    """Count the HTTP requests through a proxy: the number of rules, not of nodes."""
    counts: Counter[str] = Counter()
    queries: list[str] = []
    async with aiohttp.ClientSession() as upstream:

        async def forward(request: web.Request) -> web.Response:
            counts[request.path] += 1
            queries.append(request.query.get("query", ""))
            async with upstream.get(prom.url + request.path, params=request.query) as r:
                return web.Response(status=r.status, body=await r.read(),
                                    content_type="application/json")

        app = web.Application()
        app.router.add_get("/{tail:.*}", forward)
        runner = await serve(app, "127.0.0.1", 0)
        host, port = runner.addresses[0][:2]
        source = make_source(f"http://{host}:{port}", default_policies)
        try:
            await source.poll_once()
            await source.poll_once()
        finally:
            source.close()
            await runner.cleanup()
    per_poll = source.plan.queries_per_poll
    metric_rules = {(p.name, r.name) for p in default_policies.policies for r in p.rules
                    if isinstance(r, MetricRule)}
    print(f"\n  {len(FLEET)} nodes x 2 GPUs, {len(metric_rules)} metric rules: "
          f"{counts['/api/v1/query']} requests for 2 polls")
    assert per_poll == len(metric_rules) + 2 == 10  # + the XID pre-query + freshness
    # follow-ups (host-restricted: per-GPU freshness rows of new nodes and of nodes with
    # something to report, raw XID samples of GPUs with XIDs left by earlier tests,
    # recoveries) come on top: at most 3 kinds per poll, one query per host label spelling
    follow = [q for q in queries if any(f"{lb}=~" in q for lb in ("Hostname", "hostname"))]
    assert len(follow) <= 2 * 3 * 2
    assert counts == Counter({"/api/v1/query": 2 * per_poll + len(follow)})
    assert source.last_poll is not None
    assert source.last_poll.http_requests == source.last_poll.queries
    assert per_poll <= source.last_poll.queries <= per_poll + 3 * 2
    assert source.last_poll.duration < POLL
    for q in queries:  # the first round is fleet-wide: no query names a node
        if q not in follow:
            assert not any(f'"{n}"' in q for n in FLEET), q


async def test_history_backtest(fleet: ThreadedDcgmFleet, prom: LocalPrometheus,
                                default_policies: PolicySet) -> None:
    node, ref = "n-hist", gpu("n-hist", 0)
    start = time.time()
    fleet.inject(Fault(FaultKind.XID, node, 0, code=48))
    fleet.inject(Fault(FaultKind.ECC_DBE, node, 0, count=1))
    await asyncio.to_thread(prom.wait_for_series,
                            f'{M.XID_ERRORS}{{UUID="{ref.uuid}"}} == 48', 15)
    await asyncio.to_thread(prom.wait_for_series,
                            f'increase({M.ECC_DBE_VOL}{{UUID="{ref.uuid}"}}[1m]) > 0', 15)
    end = time.time() + SCRAPE
    source = make_source(prom, default_policies)
    try:
        signals = await history(source, start - 10, end, 1.0)
    finally:
        source.close()
    mine = [s for s in signals if s.node == node]
    xids = [s for s in mine if s.kind is SignalKind.XID]
    assert [(s.value, s.gpu) for s in xids] == [(48.0, ref)]
    assert start - 0.001 <= xids[0].observed_at <= end
    dbe = [s for s in mine if s.key == _key("ecc-dbe") and s.gpu == ref and s.value > 0]
    assert dbe
    assert any(s.kind is SignalKind.FRESH for s in mine)
    assert not any(s.kind is SignalKind.STALE for s in mine)
    assert [s.observed_at for s in signals] == sorted(s.observed_at for s in signals)
    v = verdict(node, mine, default_policies, now=end)
    assert v.state is HealthState.FAILED
    assert v.gpus == (ref,)


async def test_a_bad_promql_rule_is_a_permanent_error(prom: LocalPrometheus) -> None:
    bad = MetricRule("broken", Severity.DEGRADING, "broken", Op.GT, 0, promql="sum(")
    ok = MetricRule("warm", Severity.DEGRADING, M.GPU_TEMP, Op.GT, -1000)  # every GPU
    policies = PolicySet((Policy("p", Sel(), (bad, ok)),))
    source = make_source(prom, policies)
    try:
        with structlog.testing.capture_logs() as logs:
            signals = await source.poll_once()
            await source.poll_once()
        with pytest.raises(PermanentError, match="p/broken"):
            await source.check()
    finally:
        source.close()
    assert source.last_poll is not None
    assert source.last_poll.failed_queries == 1
    assert not source.last_poll.outage
    assert any(s.kind is SignalKind.FRESH for s in signals)  # the rest still works
    assert any(s.key == M.GPU_TEMP for s in signals)
    errors = [e for e in logs if e["log_level"] == "error"]
    assert len(errors) == 1  # logged once, not on every poll
    assert "HTTP 400" in errors[0]["error"]


def test_local_prometheus_reports_why_it_did_not_start(tmp_path: Path) -> None:
    bad = LocalPrometheus(tmp_path, ["127.0.0.1:1"], scrape_interval="1 second")
    with pytest.raises(ConfigError, match="exited with status") as e:
        bad.start()
    assert "scrape_interval" in str(e.value) or "duration" in str(e.value)  # the log tail
    assert not bad.running


async def test_reload_and_nodes_named_by_target_labels_or_node_map(
        fleet: ThreadedDcgmFleet, prom: LocalPrometheus, default_policies: PolicySet) -> None:
    """Exporters without a usable host label: a Kubernetes-style ``node`` target label, or a
    ``node_map`` from the scrape address. ``reload`` swaps the targets' labels in place."""
    addr = fleet.addresses
    labelled = {a: {"node": f"k8s-{n}"} for n, a in addr.items()}
    await asyncio.to_thread(prom.reload, labelled)
    try:
        await asyncio.to_thread(prom.wait_for_series,
                                f'count(count by (node) (DCGM_FI_DEV_GPU_TEMP{{node=~"k8s-.+"}})) '
                                f"== {len(FLEET)}", 20)
        by_label = make_source(prom, default_policies, host_labels=("node", "Hostname"))
        by_address = make_source(prom, every_temp(), host_labels=(),
                                 node_map=lambda lb: {a: f"ip-{n}" for n, a in addr.items()}
                                 .get(lb.get("instance", "")))
        want = {f"k8s-{n}" for n in FLEET}
        try:
            # the old targets' series stay until Prometheus marks them stale, soon after
            deadline = time.monotonic() + 20
            while True:
                a = await by_label.poll_once()
                if {s.node for s in a if s.kind is SignalKind.FRESH} == want:
                    break
                assert time.monotonic() < deadline, sorted({s.node for s in a})
                await asyncio.sleep(POLL)
            b = await by_address.poll_once()
        finally:
            by_label.close()
            by_address.close()
        assert {s.node for s in b if s.kind is SignalKind.FRESH} == {f"ip-{n}" for n in FLEET}
        temps = [s for s in b if s.node == "ip-n-calm" and s.key == M.GPU_TEMP]
        assert sorted(s.gpu for s in temps if s.gpu) == [gpu("n-calm", 0), gpu("n-calm", 1)]
    finally:
        await asyncio.to_thread(prom.reload, fleet.targets)
    await asyncio.to_thread(prom.wait_for_series,
                            'absent(DCGM_FI_DEV_GPU_TEMP{node=~"k8s-.+"})', 20)


async def test_http_errors_map_to_healer_errors(default_policies: PolicySet) -> None:
    script: list[Callable[[], web.Response]] = []  # one fresh response per request
    seen: list[str] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append(request.path)
        return script.pop(0)() if script else web.Response(body=EMPTY_RESULT,
                                                           content_type="application/json")

    def error(status: int, **kw: Any) -> Callable[[], web.Response]:
        return lambda: web.json_response({"status": "error", "errorType": "x",
                                          "error": f"e{status}"}, status=status, **kw)

    async with fake_prometheus(handler) as url:
        source = make_source(url, default_policies, retries=2)
        try:
            script[:] = [error(503), error(502)]  # retried within the poll
            assert await source.query("up", time.time()) == []
            assert len(seen) == 3
            seen.clear()
            script[:] = [error(401)]
            with pytest.raises(ForbiddenError, match="HTTP 401"):
                await source.query("up", time.time())
            script[:] = [error(400)]
            with pytest.raises(PermanentError, match="e400"):
                await source.query("up", time.time())
            script[:] = [error(404)]
            with pytest.raises(NotFoundError):
                await source.query("up", time.time())
            assert len(seen) == 3  # permanent errors are not retried
            seen.clear()
            script[:] = [error(500)] * 3
            with pytest.raises(TransientError, match="HTTP 500"):
                await source.query("up", time.time())
            assert len(seen) == 3
            script[:] = [lambda: web.Response(text="<html>proxy</html>")] * 3
            with pytest.raises(TransientError, match="not JSON"):  # text/plain
                await source.query("up", time.time())
            script[:] = [lambda: web.Response(body=b"<html>proxy</html>",
                                              content_type="application/json")] * 3
            with pytest.raises(TransientError, match="unexpected answer"):  # not JSON at all
                await source.query("up", time.time())
            script[:] = [error(429, headers={"Retry-After": "7"})] * 3
            with pytest.raises(TransientError) as e:
                await source.query("up", time.time())
            assert e.value.delay == 7
        finally:
            source.close()


async def test_tls_client_certificate_and_auth_headers(tmp_path: Path,
                                                       default_policies: PolicySet) -> None:
    """A managed Prometheus behind TLS with client certificates and a tenant header."""
    ca = CertificateAuthority.create("healer-test-ca")
    ca.write(tmp_path / "ca.crt", tmp_path / "ca.key")
    ca.issue_server("prometheus").write(tmp_path / "srv.crt", tmp_path / "srv.key")
    ca.issue_client("healer").write(tmp_path / "cli.crt", tmp_path / "cli.key")
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=tmp_path / "ca.crt")
    server.load_cert_chain(tmp_path / "srv.crt", tmp_path / "srv.key")
    server.verify_mode = ssl.CERT_REQUIRED
    token = tmp_path / "token"
    token.write_text("tok-1\n")
    seen: list[tuple[str, str]] = []

    async def handler(request: web.Request) -> web.Response:
        seen.append((request.headers.get("Authorization", ""),
                     request.headers.get("X-Scope-OrgID", "")))
        return web.Response(body=EMPTY_RESULT, content_type="application/json")

    async with fake_prometheus(handler, server) as url:
        good = make_source(url, default_policies, ca_file=str(tmp_path / "ca.crt"),
                           client_cert=(str(tmp_path / "cli.crt"), str(tmp_path / "cli.key")),
                           bearer_token_file=str(token), headers={"X-Scope-OrgID": "tenant-a"})
        untrusted = make_source(url, default_policies, bearer_token="abc")
        try:
            await good.poll_once()
            assert good.last_poll is not None
            assert not good.last_poll.outage
            assert good.last_poll.failed_queries == 0
            assert set(seen) == {("Bearer tok-1", "tenant-a")}
            token.write_text("tok-2")  # a rotated service-account token is picked up
            await good.poll_once()
            assert seen[-1] == ("Bearer tok-2", "tenant-a")
            await untrusted.poll_once()  # the CA is not trusted: stale, and not retried
            assert untrusted.last_poll is not None
            assert untrusted.last_poll.outage
            assert "TLS" in untrusted.last_poll.errors[0]
            assert untrusted.last_poll.http_requests == untrusted.plan.queries_per_poll
        finally:
            good.close()
            untrusted.close()


async def test_prometheus_outage_and_scrape_gap_are_stale_then_recover(
        prom: LocalPrometheus, default_policies: PolicySet) -> None:
    """Prometheus down: every node STALE, logged once. Back: old samples (a scrape gap) are
    STALE ``series-old`` until fresh scrapes arrive, then FRESH; the recovery is logged once."""
    nodes = ["n-calm", "n-503", "n-refused", "n-job"]  # nodes without a real fault
    source = make_source(prom, default_policies)
    saved = prom.labelled_targets
    with structlog.testing.capture_logs() as logs:
        try:
            async with running(source, Sink()) as sink:
                for n in nodes:
                    await sink.wait(fresh(n))
                t_stop = time.time()
                await asyncio.to_thread(prom.stop)
                for n in nodes:
                    t, _s = await sink.wait(stale(n, "prometheus-unreachable"), after=t_stop)
                    v = verdict(n, sink.of(n), default_policies)
                    assert v.state is HealthState.STALE, v.summary()
                    assert v.severity is None
                print(f"\n  prometheus down: STALE after {t - t_stop:.2f}s")
                await sink.wait_polls(2)  # still down: no second log line
                assert source.outage
                assert source.last_poll is not None
                assert source.last_poll.outage
                # back, but not scraping yet (no targets): it holds only the old samples,
                # whatever the machine's load does to the timing of the first scrape
                await asyncio.to_thread(prom.reload, {})
                t_start = time.time()
                await asyncio.to_thread(prom.start)
                gap, _ = await sink.wait(stale("n-calm", "series-old"), after=t_start,
                                         within=20)
                await asyncio.to_thread(prom.reload, saved)
                for n in nodes:
                    t, _ = await sink.wait(fresh(n), after=t_start, within=30)
                    assert verdict(n, sink.of(n), default_policies).state is \
                        HealthState.HEALTHY
                print(f"  prometheus back: old samples STALE after {gap - t_start:.2f}s, "
                      f"FRESH after {t - t_start:.2f}s")
                assert not source.outage
        finally:
            if not prom.running:
                prom.start()
            if prom.labelled_targets != saved:
                prom.reload(saved)
    events = [e["event"] for e in logs]
    assert sum(e.startswith("prometheus unreachable") for e in events) == 1
    assert sum(e.startswith("prometheus reachable again") for e in events) == 1
    assert source.totals["failed_polls"] >= 1
