"""The daemon process against the real kube-apiserver: a whole remediation, kill -9 at every
step boundary, leader failover between two processes. Slurm, the workload move and telemetry
are file-backed fakes (tests/integration/daemon/main.py); everything Kubernetes is real."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections import Counter

import pytest
from kubernetes_asyncio import client

from tests.integration.daemon.conftest import Fleet
from tests.integration.waiting import wait_for


async def _healer_events(api: client.ApiClient, node: str) -> Counter[str]:
    evs = await client.EventsV1Api(api).list_namespaced_event(
        "default", label_selector=f"healer.io/node={node}")
    return Counter(e.reason for e in evs.items)


def _exactly_once(f: Fleet, node: str) -> None:
    log = f.slurm.log
    assert [e for e in log if e[0] == "drain" and e[1] == node].__len__() == 1, log
    assert [e for e in log if e[0] == "move" and e[1] == node].__len__() == 1, log
    assert [e for e in log if e[0] == "undrain" and e[1] == node].__len__() == 1, log


async def _finish(f: Fleet, node: str, deadline: float = 90) -> None:
    await wait_for(lambda: f.play_repair(node), timeout=deadline,
                   description=f"remediation of {node} Done")


@pytest.mark.timeout(180)
async def test_daemon_remediates_a_node_end_to_end(fleet: Fleet) -> None:
    d = fleet.start()
    await fleet.ready(d)
    bad = fleet.gpus[1]
    fleet.xid(bad)
    await _finish(fleet, bad)
    items = await fleet.remediations(bad)
    assert len(items) == 1
    status = items[0]["status"]
    assert status["spare"] == fleet.spares[0]  # same domain
    assert [s["step"] for s in status["ledger"]][:4] == ["drain", "cordon", "claim-spare",
                                                         "move-workload"]
    _exactly_once(fleet, bad)
    reasons = await _healer_events(fleet.api, bad)
    assert reasons["IncidentOpened"] == 1
    assert reasons["RemediationDone"] == 1
    core = client.CoreV1Api(fleet.api)
    spare = await core.read_node(fleet.spares[0])
    assert spare.metadata.annotations["topology.slinky.slurm.net/spec"] == "default:a"
    assert d.terminate() == 0  # SIGTERM: clean, bounded shutdown
    # `healer status` reads it back from the API: the table, and --json for scripts
    kubeconfig = str(fleet.kubeconfig or fleet.stack.kubeconfig)

    def healer_status(*flags: str) -> str:
        return subprocess.run([sys.executable, "-m", "healer", "status", "--kubeconfig",
                               kubeconfig, "--all", *flags], capture_output=True, text=True,
                              check=True).stdout

    table = await asyncio.to_thread(healer_status)
    row = next(line for line in table.splitlines() if f" {bad} " in line)
    assert items[0]["metadata"]["name"] in row
    assert status["phase"] in row
    assert table.splitlines()[0].split()[:4] == ["NAME", "NODE", "PHASE", "AGE"]
    listed = json.loads(await asyncio.to_thread(healer_status, "--json"))
    mine = [r for r in listed if r["node"] == bad]
    assert [r["phase"] for r in mine] == [status["phase"]]


@pytest.mark.timeout(400)
async def test_kill_9_at_every_step_boundary_finishes_exactly_once(fleet: Fleet) -> None:
    """Each daemon kills itself with SIGKILL at the first step boundary no earlier daemon died
    at: right after a write that advanced the remediation (intent or outcome persisted), or
    right after a step's action ran but before its outcome was persisted. The next one resumes
    from the NodeRemediation. The remediation must finish with every side effect exactly once
    and nothing half-applied."""
    bad = fleet.gpus[2]
    fleet.xid(bad)
    daemons = []
    phases: list[str] = []
    for _ in range(80):
        items = await fleet.remediations(bad)
        if items and items[-1].get("status", {}).get("phase") == "Done":
            break
        await fleet.play_repair(bad)
        d = fleet.start("--crash-log", str(fleet.dir / "crashes.txt"))

        async def died(d: object = d) -> bool:
            await fleet.play_repair(bad)
            return d.proc.poll() is not None or await fleet.phase(bad) == "Done"  # type: ignore[attr-defined]

        await wait_for(died, timeout=60, interval=0.05, description="the daemon's crash")
        daemons.append(d)
        phases.append(await fleet.phase(bad))
    print("phases after each crash:", phases)
    for d in daemons:  # one may still run (it saw Done first) and may yet die at a new point
        if d.proc.poll() is None:
            d.terminate()
    fleet.start()  # a daemon that is left alone finishes whatever remains
    await _finish(fleet, bad)
    points = (fleet.dir / "crashes.txt").read_text().splitlines()
    crashes = sum(1 for d in daemons if d.proc.returncode == -9)
    assert crashes == len(points)
    items = await fleet.remediations(bad)
    incident = items[0]["spec"]["incident"]["id"]
    for step in items[0]["status"]["ledger"]:  # every step: killed after its action ran...
        assert f"action {incident}/{step['step']}" in points, (step["step"], points)
    writes = [p for p in points if p.startswith("write ")]  # ...and after each intent/outcome
    assert len(writes) >= len(items[0]["status"]["ledger"]), points
    _exactly_once(fleet, bad)
    # none lost either: the Events of a transition ride with its intent and are written again
    # by the next leader (the last daemon may have died right after writing Done)
    async def all_events() -> bool:
        reasons = await _healer_events(fleet.api, bad)
        return reasons["IncidentOpened"] == 1 and reasons["RemediationDone"] == 1

    await wait_for(all_events, timeout=30, description="every Event of the flow")
    reasons = await _healer_events(fleet.api, bad)
    assert all(n == 1 for n in reasons.values()), reasons
    items = await fleet.remediations(bad)
    assert len(items) == 1
    ledger = items[0]["status"]["ledger"]
    assert all(s.get("finishedAt") for s in ledger), ledger  # nothing left half-applied
    core = client.CoreV1Api(fleet.api)
    n = await core.read_node(bad)
    assert n.metadata.labels.get("healer.io/role") == "spare"  # repaired, back in the pool
    assert not n.spec.unschedulable


@pytest.mark.timeout(240)
async def test_leader_failover_finishes_the_remediation(fleet: Fleet) -> None:
    a = fleet.start(identity=f"a-{fleet.tid}", leader=True)
    await fleet.ready(a)
    coord = client.CoordinationV1Api(fleet.api)

    async def holder() -> str:
        lease = await coord.read_namespaced_lease(f"healer-{fleet.tid}", "healer-system")
        return str(lease.spec.holder_identity or "")

    await wait_for(lambda: _is(holder, f"a-{fleet.tid}"), timeout=30, description="a leads",
                   ignore=(client.exceptions.ApiException,))
    b = fleet.start(identity=f"b-{fleet.tid}", leader=True)
    await fleet.ready(b)  # a follower is ready, just not leading
    bad = fleet.gpus[0]
    fleet.xid(bad)

    async def mid_flight() -> bool:
        return await fleet.phase(bad) in ("Swapping", "Annotating", "Undraining", "Repair")

    await wait_for(mid_flight, timeout=60, interval=0.05, description="remediation in flight")
    a.kill9()
    await wait_for(lambda: _is(holder, f"b-{fleet.tid}"), timeout=30, description="b leads")
    await _finish(fleet, bad)
    _exactly_once(fleet, bad)
    reasons = await _healer_events(fleet.api, bad)
    assert all(n == 1 for n in reasons.values()), reasons


async def _is(fn: object, want: str) -> bool:
    got = await fn()  # type: ignore[operator]
    return bool(got == want)
