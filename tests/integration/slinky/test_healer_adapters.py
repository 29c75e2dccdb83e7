"""healer's Slinky adapters (:mod:`healer.adapters.slinky`) against the Slinky emulator, the real
kube-apiserver and a real Slurm: the driver drains through the Node (cordon-reason annotation,
then cordon), reads Slurm from pod conditions, undrains through the uncordon and leaves other
people's drains alone; the workload move never evicts a busy slurmd, evicts a drained one and
is done once Slurm serves the node from the spare."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from kubernetes_asyncio import client, watch

from healer.adapters.kube.nodes import INCIDENT, KubeNodes
from healer.adapters.slinky import CORDON_REASON, SlinkyDriver, SlinkyWorkload, pod_state
from healer.ports import SlurmNodeState, StepOutcome
from tests.integration.slinky.conftest import Rig, host_of, two_workers
from tests.integration.slurm_fixtures import HOLD_SCRIPT, release
from tests.integration.waiting import wait_for

OPERATOR = "slurm-operator: "


async def _record_node(api: client.ApiClient, name: str, seen: list[dict[str, Any]],
                       started: asyncio.Event) -> None:
    """Every version of Node ``name``, in order, as a watch delivers them."""
    core = client.CoreV1Api(api)
    async with watch.Watch() as w:
        async for ev in w.stream(core.list_node, field_selector=f"metadata.name={name}",
                                 timeout_seconds=120):
            seen.append(ev["raw_object"])
            started.set()


async def _state_when(driver: SlinkyDriver, node: str, check: Any,
                      timeout: float = 30.0) -> SlurmNodeState:  # noqa: ASYNC109
    async def probe() -> SlurmNodeState | None:
        st = await driver.state(node)
        return st if check(st) else None

    got = await wait_for(probe, timeout=timeout, description=f"driver.state({node})")
    assert got is not None
    return got


async def test_driver_drains_through_the_node_and_undrains_through_the_uncordon(
        rig: Rig) -> None:
    host0, _, _ = await two_workers(rig)
    driver = SlinkyDriver(rig.api, namespace=rig.namespace)
    seen: list[dict[str, Any]] = []
    started = asyncio.Event()
    recorder = asyncio.create_task(_record_node(rig.api, host0, seen, started))
    try:
        await asyncio.wait_for(started.wait(), 30)
        reason = "healer: XID 79 on GPU 3 [inc-7]"
        assert await driver.drain("worker-0", reason) is True
        st = await _state_when(driver, "worker-0", lambda s: s.drain)
        assert (st.reason, st.reason_is_ours, st.drained) == (reason, True, True)
        slurm = await rig.slurm_state("worker-0")
        assert slurm is not None
        assert slurm.reason == OPERATOR + reason
        node = await rig.read_node(host0)
        assert node["spec"]["unschedulable"] is True
        assert node["metadata"]["annotations"][CORDON_REASON] == reason
        assert node["metadata"]["annotations"][INCIDENT] == "inc-7"
    finally:
        recorder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await recorder
    cordoned = [n for n in seen if (n.get("spec") or {}).get("unschedulable")]
    assert cordoned, "the watch saw no cordoned version of the Node"
    # the annotation was there before the cordon: every cordoned version carries it
    assert all((n["metadata"].get("annotations") or {}).get(CORDON_REASON) == reason
               for n in cordoned)
    assert await driver.drain("worker-0", reason) is True  # idempotent

    async def undrained() -> bool:
        return await driver.undrain("worker-0", "inc-7")

    await wait_for(undrained, timeout=30, description="driver.undrain(worker-0) done")
    node = await rig.read_node(host0)
    assert not node["spec"].get("unschedulable")
    assert CORDON_REASON not in (node["metadata"].get("annotations") or {})
    slurm = await rig.slurm_state("worker-0")
    assert slurm is not None
    assert not slurm.drain
    assert not (await driver.state("worker-0")).drain


async def test_driver_leaves_an_external_drain_alone(rig: Rig) -> None:
    _, host1, _ = await two_workers(rig)
    driver = SlinkyDriver(rig.api, namespace=rig.namespace)
    await rig.scontrol("update", "nodename=worker-1", "state=drain", "reason=admin: bad DIMM")
    st = await _state_when(driver, "worker-1", lambda s: s.drain)
    assert st.reason == "admin: bad DIMM"
    assert not st.reason_is_ours
    assert await driver.drain("worker-1", "healer: XID 79 [inc-8]") is False
    node = await rig.read_node(host1)
    assert not node["spec"].get("unschedulable")
    assert CORDON_REASON not in (node["metadata"].get("annotations") or {})
    assert await driver.undrain("worker-1", "inc-8") is False
    await rig.emu.reconcile_once()
    slurm = await rig.slurm_state("worker-1")
    assert slurm is not None
    assert slurm.drain
    assert slurm.reason == "admin: bad DIMM"


@pytest.mark.timeout(180)
async def test_statefulset_move_waits_for_the_job_then_lands_on_the_spare(rig: Rig) -> None:
    host0, _, spare = await two_workers(rig, spare=True)
    driver = SlinkyDriver(rig.api, namespace=rig.namespace)
    wl = SlinkyWorkload(rig.api, KubeNodes(rig.api), driver, namespace=rig.namespace,
                        nodeset="worker")
    assert await wl.scaling_mode() == "StatefulSet"
    selector = await wl.node_selector()
    assert selector == rig.pool
    job = await asyncio.to_thread(rig.slurm.submit, HOLD_SCRIPT, "worker-0")
    try:
        await _state_when(driver, "worker-0", lambda s: s.busy)
        assert await driver.drain("worker-0", "healer: XID 79 [inc-9]") is True
        await _state_when(driver, "worker-0", lambda s: s.drain and s.busy)
        await rig.patch_node(spare, {"metadata": {"labels": selector}})  # the spare's claim
        old = await rig.pod("worker-0")
        r = await wl.move("inc-9", "worker-0", host0, spare)
        assert r.outcome is StepOutcome.PENDING
        assert "busy" in r.detail
        assert (await rig.pod("worker-0"))["metadata"]["uid"] == old["metadata"]["uid"]
        assert await asyncio.to_thread(rig.slurm.job_state, job) == "RUNNING"
        r = await wl.replacement_ready("inc-9", "worker-0", spare)
        assert r.outcome is StepOutcome.PENDING
    finally:
        release(rig.slurm, job)
    await _state_when(driver, "worker-0", lambda s: s.drained)

    async def evicted() -> bool:  # a 429 (the protect label lags a pass) means: again
        r = await wl.move("inc-9", "worker-0", host0, spare)
        assert r.outcome is StepOutcome.PENDING, r
        return "evicted" in r.detail

    await wait_for(evicted, timeout=30, description="move() evicted the drained slurmd")
    assert await asyncio.to_thread(rig.slurm.wait_job, job, ["COMPLETED"], 30) == "COMPLETED"
    await rig.wait_pod("worker-0", lambda p: host_of(p) == spare and pod_state(p).base == "IDLE"
                       and pod_state(p).registered, description="worker-0 idle on the spare")
    r = await wl.move("inc-9", "worker-0", host0, spare)
    assert r.outcome is StepOutcome.DONE, r
    r = await wl.replacement_ready("inc-9", "worker-0", spare)
    assert r.outcome is StepOutcome.DONE, r
    assert dict(r.data)["slurmNode"] == "worker-0"
    st = await rig.wait_slurm("worker-0", lambda s: s.base == "IDLE" and s.registered)
    assert not st.drain
    assert await driver.undrain("worker-0", "inc-9") is True  # nothing left drained
    job2 = await asyncio.to_thread(rig.slurm.submit, "true", "worker-0")
    assert await asyncio.to_thread(rig.slurm.wait_job, job2, ["COMPLETED"], 30) == "COMPLETED"
    assert (await rig.read_node(host0))["spec"]["unschedulable"] is True  # off to repair


@pytest.mark.timeout(180)
async def test_daemonset_move_reports_the_new_slurm_node(rig: Rig) -> None:
    a = await rig.node("dgx-a", dotted=True)
    await rig.node("dgx-b", dotted=True)
    spare = await rig.node("dgx-c", pool=False, dotted=True)
    await rig.nodeset("dgx", mode="DaemonSet")
    await rig.ready("dgx-a", "dgx-b")
    driver = SlinkyDriver(rig.api, namespace=rig.namespace)
    wl = SlinkyWorkload(rig.api, KubeNodes(rig.api), driver, namespace=rig.namespace,
                        nodeset="dgx")
    assert await wl.scaling_mode() == "DaemonSet"
    assert await driver.drain("dgx-a", "healer: XID 79 [inc-10]") is True
    await _state_when(driver, "dgx-a", lambda s: s.drained)
    r = await wl.move("inc-10", "dgx-a", a, spare)
    assert r.outcome is StepOutcome.PENDING  # nothing runs on the spare yet
    await rig.patch_node(spare, {"metadata": {"labels": await wl.node_selector()}})

    async def moved() -> dict[str, str] | None:
        r = await wl.move("inc-10", "dgx-a", a, spare)
        return dict(r.data) if r.outcome is StepOutcome.DONE else None

    data = await wait_for(moved, timeout=30, description="move() done")
    assert data["slurmNode"] == "dgx-c"

    async def ready() -> bool:
        return (await wl.replacement_ready("inc-10", "dgx-c", spare)).outcome is \
            StepOutcome.DONE

    await wait_for(ready, timeout=60, description="replacement_ready(dgx-c)")
    st = await rig.wait_slurm("dgx-c", lambda s: s.base == "IDLE" and s.registered)
    assert not st.drain
    old = await rig.slurm_state("dgx-a")  # the bad node's record stays drained
    assert old is not None
    assert old.drain
    assert old.reason == OPERATOR + "healer: XID 79 [inc-10]"


async def test_move_waits_while_the_recreated_pod_is_unscheduled(rig: Rig) -> None:
    host0, _, spare = await two_workers(rig, spare=True)
    driver = SlinkyDriver(rig.api, namespace=rig.namespace)
    wl = SlinkyWorkload(rig.api, KubeNodes(rig.api), driver, namespace=rig.namespace,
                        nodeset="worker")
    assert await driver.drain("worker-0", "healer: XID 79 [inc-11]") is True
    await _state_when(driver, "worker-0", lambda s: s.drained)
    old = await rig.pod("worker-0")

    async def evicted() -> bool:
        r = await wl.move("inc-11", "worker-0", host0, spare)
        return "evicted" in r.detail

    await wait_for(evicted, timeout=30, description="move() evicted the drained slurmd")
    # the spare has not got the NodeSet's labels yet: the new pod waits to be scheduled
    await rig.wait_pod("worker-0", lambda p: p["metadata"]["uid"] != old["metadata"]["uid"],
                       description="worker-0 recreated")
    r = await wl.move("inc-11", "worker-0", host0, spare)
    assert r.outcome is StepOutcome.PENDING, r
