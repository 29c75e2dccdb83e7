"""Every dashboard expression returns data from a real Prometheus scraping a running healer.

A real Prometheus (:class:`~healer_dev.devstack.prometheus.LocalPrometheus`, 1 s scrapes) scrapes
the real daemon process (the ``fleet`` fixture: kwok nodes on the real kube-apiserver, Slurm
as a file-backed fake) and one DCGM-exporter simulator per GPU node, half of them labelling
the host ``Hostname`` and half ``hostname``. The scenario then drives the daemon through what
the dashboards chart, in a fleet with a single warm spare and guardrails that trip:

1. GPU faults on the simulated exporters (ECC, row remapping, NVLink, PCIe, thermal, power);
2. a broken policy file is dropped next to the good one: the reload is rejected;
3. A: XID 79 on gpu-0 (GPU serial SN-A) → swapped to the spare, repaired (``play_repair``),
   Done; gpu-0 rejoins the pool as the only free spare;
4. C: XID 79 on gpu-3 → swapped to gpu-0, left in Repair (the step histograms grow again);
5. E: XID 79 on gpu-2 → drained, cordoned, no spare left: HeldForCapacity;
6. D: XID 79 on gpu-1 with GPU serial SN-A (the GPU moved) → its retry budget (1 per serial)
   escalates it; it is the 4th bad node in the window, so the fleet breaker trips;
7. X: XID 79 on a fifth GPU node → blocked by the breaker (a guardrail block).

Then every target of every dashboard (and every query variable) is evaluated as Grafana
would send it (variables at "All"; ``$__rate_interval`` = 1m, ``$__range`` = 1h): a range
query over the scenario for time-series panels, an instant query at the end for instant
targets (tables, bar gauges, range stats). Each must return at least one series with a
finite value; the test waits for that with a deadline (scrapes lag) and then prints every
expression with its series and point counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from healer.adapters.kube.crd import GROUP, PLURAL, VERSION
from healer.core.model import GpuRef, Signal, SignalKind
from healer.errors import ConfigError
from healer_dev.devstack.kwok import fake_node
from healer_dev.devstack.prometheus import LocalPrometheus
from healer_dev.sim.dcgm import DcgmSim, make_node
from healer_dev.sim.dcgm_server import ThreadedDcgmFleet
from tests.builders import policy_yaml
from tests.integration.daemon.conftest import DOMAIN, Fleet
from tests.integration.waiting import wait_for
from tests.unit.test_dashboards import (
    all_expressions,
    load_dashboards,
    metric_names,
    substitute,
    variable_promql,
    variables,
)

FLEET_GUARDRAILS = {"maxConcurrent": 3, "maxUnavailable": 3,
                    "breaker": {"window": "10m", "threshold": 4, "cooldown": "30m"},
                    "retryBudget": {"perNode": 3, "perGpuSerial": 1, "window": "7d"}}

BROKEN_POLICY = """\
apiVersion: healer.io/v1alpha1
kind: RemediationPolicy
metadata: {name: broken}
spec:
  mode: act
"""


@dataclass
class Evaluated:
    where: str
    expr: str
    instant: bool
    series: int = 0
    points: int = 0
    error: str = ""

    @property
    def has_data(self) -> bool:
        return self.points > 0


def _finite(values: list[Any]) -> int:
    return sum(1 for _, v in values if math.isfinite(float(v)))


def _evaluate(prom: LocalPrometheus, item: Evaluated, start: float) -> None:
    try:
        if item.instant:
            result = prom.query(item.expr)
            item.series = len(result)
            item.points = sum(_finite([s["value"]]) for s in result)
        else:
            result = prom.query_range(item.expr, start, time.time(), 1.0)
            item.series = len(result)
            item.points = sum(_finite(s["values"]) for s in result)
        item.error = ""
    except ConfigError as e:
        item.error = str(e)


def _expressions() -> list[Evaluated]:
    out = [Evaluated(where, expr, bool(t.get("instant")))
           for where, _, expr, t in all_expressions()]
    for fname, dash in load_dashboards().items():
        for name, var in variables(dash).items():
            if var["type"] == "query":
                out.append(Evaluated(f"{fname} variable ${name}",
                                     substitute(variable_promql(var), dash), True))
    return out


def _signal(path: Path, node: str, serial: str, gpu: int = 3, code: int = 79) -> None:
    sig = Signal(node, "file", SignalKind.XID, "DCGM_FI_DEV_XID_ERRORS", float(code),
                 time.time(), GpuRef(gpu, f"GPU-{node}-{gpu}", serial))
    with open(path, "a") as f:
        f.write(json.dumps({"node": node, **sig.to_dict()}) + "\n")


def _write(path: Path, text: str) -> None:
    path.write_text(text)


@pytest.mark.timeout(420)
async def test_every_dashboard_expression_has_data(fleet: Fleet, tmp_path: Path) -> None:
    t0 = time.monotonic()
    core = client.CoreV1Api(fleet.api)
    co = client.CustomObjectsApi(fleet.api)
    g0, g1, g2, g3 = fleet.gpus
    extra = f"gpu-{fleet.tid}-4"
    # one warm spare: the second one leaves the fleet; a fifth GPU node joins it
    await core.delete_node(fleet.spares[1])
    await core.create_node(fake_node(extra, labels={  # type: ignore[arg-type]
        "nvidia.com/gpu.present": "true", "healer-test": fleet.tid, DOMAIN: "b"}))
    await asyncio.to_thread(_write, fleet.policies / "policy.yaml",
                            policy_yaml(fleet.tid, name=f"fatal-{fleet.tid}",
                                        fleet={"guardrails": FLEET_GUARDRAILS},
                                        deadNode={"enabled": True}))

    async def extra_ready() -> bool:
        n = await core.read_node(extra)
        return any(c.type == "Ready" and c.status == "True" for c in n.status.conditions or [])

    await wait_for(extra_ready, timeout=60, description=f"{extra} Ready")

    nodes = [g0, g1, g2, g3, extra]
    sim = DcgmSim([make_node(n, 4, host_label="Hostname" if i % 2 else "hostname")
                   for i, n in enumerate(nodes)])
    dcgm = ThreadedDcgmFleet(sim)
    prom: LocalPrometheus | None = None
    try:
        await asyncio.to_thread(dcgm.start)
        sim.ecc_sbe(g0, 1, rate=2.0)
        sim.ecc_dbe(g1, 2, 1, rate=0.2)
        sim.row_remap_pending(g2, 0)
        sim.row_remap_failure(g3, 1)
        sim.nvlink_errors(g0, 2, rate=5.0)
        sim.nvlink_errors(g3, 0, rate=3.0, replay=True)
        sim.pcie_replay(g2, 1, rate=1.0)
        sim.thermal(g1, 0, 92.0)
        sim.power_throttle(extra, 2)

        # Prometheus first: the daemon polls it (its telemetry-source panels), and it scrapes
        # the daemon once the daemon's port is known
        exporters = {t: {"component": "dcgm-exporter"} for t in dcgm.targets}
        prom = LocalPrometheus(tmp_path / "prometheus", exporters, "1s", job="healer-obs")
        await asyncio.to_thread(prom.start)
        daemon = fleet.start("--prometheus-url", prom.url, "--poll-interval", "1")
        await fleet.ready(daemon)
        await asyncio.to_thread(prom.reload, {f"127.0.0.1:{daemon.port}": {"component": "healer"},
                                              **exporters})
        start = time.time()
        await asyncio.to_thread(prom.wait_for_series, "healer_up", 60.0)
        await asyncio.to_thread(prom.wait_for_series, "DCGM_FI_DEV_GPU_TEMP", 60.0)

        # the reload of a broken policy file is rejected (the good policies stay in force)
        await asyncio.to_thread(_write, fleet.policies / "zz-broken.yaml", BROKEN_POLICY)

        async def xid(node: str, serial: str) -> None:
            # the incident opens on the file signal (it names the GPU serial the retry budget
            # counts); the exporter's XID follows as more evidence for the XID panels
            before = len(await fleet.remediations(node))
            await asyncio.to_thread(_signal, fleet.signals, node, serial)

            async def opened() -> bool:
                return len(await fleet.remediations(node)) > before

            await wait_for(opened, timeout=30, description=f"an incident on {node}")
            sim.xid(node, 3, 79)

        async def phase_is(node: str, want: str) -> bool:
            return await fleet.phase(node) == want

        # A: swapped to the only spare, repaired, back in the pool
        await xid(g0, "SN-A")
        await wait_for(lambda: fleet.play_repair(g0), timeout=90,
                       description=f"A: {g0} Done")
        await asyncio.to_thread(prom.wait_for_series,
                                'healer_step_duration_seconds_count{step="drain"}', 30.0)
        # C: swapped to the repaired gpu-0, left in Repair
        await xid(g3, "SN-C")
        await wait_for(lambda: phase_is(g3, "Repair"), timeout=60,
                       description=f"C: {g3} in Repair")
        # E: nothing left to swap to
        await xid(g2, "SN-E")
        await wait_for(lambda: phase_is(g2, "HeldForCapacity"), timeout=60,
                       description=f"E: {g2} HeldForCapacity")
        # the emptied domain still has a series, at 0 (what HealerSparePoolLow alerts on)
        await asyncio.to_thread(prom.wait_for_series, "healer_spare_pool_free == 0", 60.0)
        # D: the GPU serial of A fails again, on another node: escalated; breaker trips
        await xid(g1, "SN-A")
        await wait_for(lambda: phase_is(g1, "Escalated"), timeout=60,
                       description=f"D: {g1} Escalated")

        # X: held by the breaker
        async def blocked_by_breaker() -> bool:
            items = await fleet.remediations(extra)
            status = (items[-1].get("status") or {}) if items else {}
            return bool((status.get("blocked") or {}).get("guardrail") == "breaker")

        await xid(extra, "SN-X")
        await wait_for(blocked_by_breaker, timeout=60, description=f"X: {extra} blocked")
        scenario_s = time.monotonic() - t0

        items = _expressions()
        assert len(items) > 50

        def round_() -> bool:
            assert prom is not None
            for it in items:
                if not it.has_data:
                    _evaluate(prom, it, start)
            return all(it.has_data for it in items)

        async def all_have_data() -> bool:
            return await asyncio.to_thread(round_)

        with contextlib.suppress(TimeoutError):  # reported below, with every expression
            await wait_for(all_have_data, timeout=45, interval=1.0,
                           description="every dashboard expression returning data")
        width = max(len(it.where) for it in items)
        print(f"\n{len(items)} expressions (scenario {scenario_s:.0f}s, "
              f"total {time.monotonic() - t0:.0f}s):")
        for it in items:
            kind = "instant" if it.instant else "range"
            print(f"  {'ok  ' if it.has_data else 'NONE'} {it.where:{width}} {kind:7} "
                  f"series={it.series:<3} points={it.points:<5} {it.expr}")
        empty = [it for it in items if not it.has_data]
        if empty:  # name the metrics Prometheus never saw at all: the daemon does not feed them
            wanted = sorted(set().union(*(metric_names(it.expr) for it in empty)))
            seen = await asyncio.to_thread(
                prom.query, f'group by (__name__) ({{__name__=~"{"|".join(wanted)}"}})')
            never = sorted(set(wanted) - {s["metric"]["__name__"] for s in seen})
            raise AssertionError(
                f"{len(empty)} expression(s) returned no data:\n" + "\n".join(
                    f"  {it.where}: {it.expr}" + (f" ({it.error})" if it.error else "")
                    for it in empty)
                + f"\nmetrics never scraped from the running daemon: {never}")
    finally:
        if prom is not None:
            await asyncio.to_thread(prom.stop)
        await asyncio.to_thread(dcgm.stop)
        for item in await fleet.remediations(extra):
            with contextlib.suppress(client.exceptions.ApiException):
                await co.delete_cluster_custom_object(GROUP, VERSION, PLURAL,
                                                      item["metadata"]["name"])
        with contextlib.suppress(client.exceptions.ApiException):
            await core.delete_node(extra)
