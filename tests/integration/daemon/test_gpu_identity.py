"""GPU identity end to end on the real stack (issue 14, item 3): the daemon process against the
real kube-apiserver, the agent's condition written by the agent's own writer
(:class:`healer.agent.publish.ConditionWriter`), and, for the DCGM path, a real Prometheus
scraping the DCGM simulator (the daemon's real ``PrometheusSource``).

A GPU (one UUID, one serial) fails on one node, then on another: with ``perGpuSerial: 1`` the
second incident escalates, because the serial reached the retry budget both times:

* agent path: the serial comes with the GPUHealthy condition's identity block;
* DCGM path: dcgm-exporter's series carry the UUID but no serial; the serial is the one the
  node's (healthy) agent published for that UUID.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from healer.agent.findings import EventKind, GpuEvent, GpuInfo, GpuReading, Thresholds, assess
from healer.agent.publish import ConditionWriter, build_condition
from healer.policy.catalog import default_catalog
from healer_dev.devstack.prometheus import LocalPrometheus
from healer_dev.sim.dcgm import DcgmSim, Fault, FaultKind, GpuSpec, NodeSpec, make_node
from healer_dev.sim.dcgm_server import ThreadedDcgmFleet
from tests.builders import FATAL_XID, policy_yaml
from tests.integration.agent_client import lite_like
from tests.integration.daemon.conftest import Fleet
from tests.integration.waiting import wait_for

UUID = "GPU-7e57ab1e-0000-4000-8000-00000000c0de"
SERIAL = "1652023000042"



def _gpus(moved_index: int = 3) -> list[GpuInfo]:
    """The node's GPUs as NVML enumerates them; GPU ``moved_index`` is the one that moves."""
    return [GpuInfo(i, UUID if i == moved_index else f"GPU-other-{i}-{time.monotonic_ns()}",
                    SERIAL if i == moved_index else f"16520230{i:05d}") for i in range(4)]


async def publish(api: client.ApiClient, node: str, gpus: list[GpuInfo], *,
                  xid_on: int | None = None) -> str:
    """Publish GPUHealthy as the agent would (its assessment, its condition, its writer)."""
    now = time.time()
    readings = [GpuReading(gpu=g, at=now) for g in gpus]
    events = [] if xid_on is None else [GpuEvent(xid_on, gpus[xid_on].uuid, EventKind.XID, 1,
                                                 now, xid=79, serial=gpus[xid_on].serial)]
    a = assess(readings, events, default_catalog(), Thresholds(), now)
    cond = build_condition(a, None, now)
    lite = lite_like(api)  # the agent's own client, to the same API server as the same user
    try:
        await ConditionWriter(lite, node).write(cond)
    finally:
        await lite.close()
    return cond.message



async def _incident(f: Fleet, node: str, phase: str | None = None) -> dict[str, Any] | None:
    """The incident (``spec.incident``) of ``node``'s newest NodeRemediation, once it is in
    ``phase`` (any phase when None)."""
    items = await f.remediations(node)
    if not items:
        return None
    status = items[-1].get("status") or {}
    if phase is not None and status.get("phase") != phase:
        return None
    incident: dict[str, Any] | None = items[-1]["spec"].get("incident")
    return incident


async def _notes(api: client.ApiClient, node: str, reason: str) -> list[str]:
    evs = await client.EventsV1Api(api).list_namespaced_event(
        "default", label_selector=f"healer.io/node={node}")
    return [e.note for e in evs.items if e.reason == reason]


async def _follows_the_gpu(f: Fleet, first: str, second: str) -> None:
    """After the fault on ``first`` and then on ``second``: the serial was seen both times."""
    opened = await wait_for(lambda: _incident(f, first), timeout=60,
                            description=f"a NodeRemediation for {first}")
    assert {(g["uuid"], g["serial"]) for g in opened["gpus"]} == {(UUID, SERIAL)}
    notes = await wait_for(lambda: _notes(f.api, first, "IncidentOpened"), timeout=30,
                           description="the IncidentOpened Event")
    assert f"serial {SERIAL}" in notes[0], notes


async def _escalated(f: Fleet, node: str) -> None:
    escalated = await wait_for(lambda: _incident(f, node, "Escalated"), timeout=60,
                               description=f"{node} escalated by the serial budget")
    assert {g["serial"] for g in escalated["gpus"]} == {SERIAL}
    notes = await wait_for(lambda: _notes(f.api, node, "Escalated"), timeout=30,
                           description="the Escalated Event")
    assert f"GPU serial {SERIAL} failed 1 times" in notes[0], notes


def identity_policy(tid: str) -> str:
    """Fatal XIDs from DCGM and the agent's GPUHealthy=False, one incident per GPU serial."""
    return policy_yaml(
        tid, name=f"identity-{tid}",
        rules=[FATAL_XID, {"name": "agent", "severity": "failed",
                           "condition": {"type": "GPUHealthy", "status": ["False"],
                                         "reason": "^Xid"}}],
        guardrails={"retryBudget": {"perNode": 5, "perGpuSerial": 1, "window": "1d"}})


@pytest.mark.timeout(240)
async def test_agent_condition_serial_budget_follows_the_gpu(fleet: Fleet) -> None:
    (fleet.policies / "policy.yaml").write_text(identity_policy(fleet.tid))
    d = fleet.start()
    await fleet.ready(d)
    first, second = fleet.gpus[0], fleet.gpus[2]
    message = await publish(fleet.api, first, _gpus(), xid_on=3)
    assert f"*3:{UUID}:{SERIAL}" in message
    await _follows_the_gpu(fleet, first, second)
    # the same GPU, now in another node, fails again
    await publish(fleet.api, second, _gpus(), xid_on=3)
    await _escalated(fleet, second)
    assert d.terminate() == 0


# -- the DCGM path -------------------------------------------------------------------------------


@pytest.fixture
def dcgm(fleet: Fleet) -> Iterator[tuple[ThreadedDcgmFleet, LocalPrometheus]]:
    """The DCGM simulator for the fleet's first and third node, both holding GPU 3 = ``UUID``
    (it moved), scraped every second by a real Prometheus."""
    specs = []
    for name in (fleet.gpus[0], fleet.gpus[2]):
        base = make_node(name, 4)
        gpus = tuple(GpuSpec(g.index, UUID, g.pci_bus_id, g.model, "") if g.index == 3 else g
                     for g in base.gpus)
        specs.append(NodeSpec(name, gpus))
    with ThreadedDcgmFleet(DcgmSim(specs)) as sim:
        prom = LocalPrometheus(fleet.dir / "prometheus", sim.targets, "1s")
        prom.start()
        try:
            prom.wait_for_series('count(up{job="dcgm"} == 1) == 2', timeout=30)
            yield sim, prom
        finally:
            prom.stop()


@pytest.mark.timeout(240)
async def test_dcgm_serial_budget_follows_the_gpu_by_the_agents_identity(
        fleet: Fleet, dcgm: tuple[ThreadedDcgmFleet, LocalPrometheus]) -> None:
    sim, prom = dcgm
    (fleet.policies / "policy.yaml").write_text(identity_policy(fleet.tid))
    first, second = fleet.gpus[0], fleet.gpus[2]
    # both nodes' agents are healthy; their blocks name GPU 3's UUID and serial
    for node in (first, second):
        message = await publish(fleet.api, node, _gpus())
        assert f" 3:{UUID}:{SERIAL}" in message
    d = fleet.start("--prometheus-url", prom.url, "--poll-interval", "1")
    await fleet.ready(d)
    # XID 79 from dcgm-exporter: its series name the GPU by UUID, with no serial
    await asyncio.to_thread(sim.inject, Fault(FaultKind.XID, first, 3, code=79))
    await _follows_the_gpu(fleet, first, second)
    await asyncio.to_thread(sim.inject, Fault(FaultKind.XID, second, 3, code=79))
    await _escalated(fleet, second)
    assert d.terminate() == 0
