"""healer's Slinky adapters (:mod:`healer.adapters.slinky`,
:mod:`healer.adapters.slinky_workload`) against SchedMD's real slurm-operator (v1.1.0), the
real kube-apiserver + kwok and a real Slurm: the driver drains through the Node (cordon-reason
annotation, then cordon), reads Slurm from pod conditions, undrains through the
uncordon and leaves other people's drains alone; the workload move never evicts a busy slurmd,
holds while someone else's drain is there, opens the claimed spare and evicts a drained slurmd,
and is done once Slurm serves the node from the spare.

Spares are claimed with healer's own :class:`KubeSparePool` (spare taint kept until ``move``
opens the spare)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import pytest
from kubernetes_asyncio import client, watch

from healer.adapters.kube.nodes import KubeNodes
from healer.adapters.kube.spares import KubeSparePool
from healer.adapters.slinky import CORDON_REASON, SlinkyDriver, pod_state
from healer.adapters.slinky_workload import SlinkyWorkload
from healer.core.rules import LabelSelector
from healer.core.vocabulary import INCIDENT_ANNOTATION, SPARE_TAINT
from healer.ports import SlurmNodeState, StepOutcome, Undrain
from tests.integration.slinky.conftest import OPERATOR, Rig, host_of, serving, until
from tests.integration.slurm_fixtures import HOLD_SCRIPT, release
from tests.integration.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

SPARE_LABEL = "healer-test/spare"
TAINT = {"key": SPARE_TAINT, "value": "true", "effect": "NoSchedule"}


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
                      timeout: float = 90.0) -> SlurmNodeState:  # noqa: ASYNC109
    async def probe() -> SlurmNodeState | None:
        st = await driver.state(node)
        return st if check(st) else None

    got: SlurmNodeState | None = await wait_for(probe, timeout=timeout, interval=0.2,
                                                description=f"driver.state({node})")
    assert got is not None
    return got


async def _two_workers(rig: Rig, *, spare: bool = False) -> tuple[str, str, str, str]:
    """Nodes a and b on the pool (+ a spare in healer's spare pool: tainted, not on the NodeSet's
    pool), a 2-replica StatefulSet-mode NodeSet, both slurmd pods serving.
    Returns (NodeSet, Slurm node 0, its host, spare or "")."""
    await rig.node("a")
    await rig.node("b")
    spare_name = await rig.node("spare", pool=False, labels={SPARE_LABEL: rig.namespace},
                                taints=[TAINT]) if spare else ""
    ns = await rig.nodeset("w", replicas=2)
    name = f"{ns}-0"
    pods = await rig.ready(name, f"{ns}-1")
    return ns, name, host_of(pods[name]), spare_name


def _pool(rig: Rig, wl: SlinkyWorkload, *, labels: bool = True) -> KubeSparePool:
    """healer's spare pool; the claim adds the NodeSet's nodeSelector labels (unless not)."""
    nodes = KubeNodes(rig.api)
    selector = LabelSelector(match_labels={SPARE_LABEL: rig.namespace})
    if not labels:
        return KubeSparePool(nodes, selector)
    return KubeSparePool(nodes, selector, labels_provider=wl.node_selector)


def _tainted(node: dict[str, Any]) -> bool:
    return any(t.get("key") == SPARE_TAINT for t in (node.get("spec") or {}).get("taints") or [])


async def test_driver_drains_through_the_node_and_undrains_through_the_uncordon(
        rig: Rig) -> None:
    _, w0, host0, _ = await _two_workers(rig)
    driver = SlinkyDriver(rig.api, KubeNodes(rig.api), namespace=rig.namespace)
    seen: list[dict[str, Any]] = []
    started = asyncio.Event()
    recorder = asyncio.create_task(_record_node(rig.api, host0, seen, started))
    try:
        await asyncio.wait_for(started.wait(), 30)
        reason = "healer: XID 79 on GPU 3 [inc-7]"
        assert await driver.drain(w0, reason, "inc-7") is True
        st = await _state_when(driver, w0, lambda s: s.drain)
        assert (st.reason, st.reason_is_ours, st.drained) == (reason, True, True)
        slurm = await rig.slurm_state(w0)
        assert slurm is not None
        assert slurm.reason == OPERATOR + reason
        node = await rig.read_node(host0)
        assert node["spec"]["unschedulable"] is True
        assert node["metadata"]["annotations"][CORDON_REASON] == reason
        assert node["metadata"]["annotations"][INCIDENT_ANNOTATION] == "inc-7"
    finally:
        recorder.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await recorder
    cordoned = [n for n in seen if (n.get("spec") or {}).get("unschedulable")]
    assert cordoned, "the watch saw no cordoned version of the Node"
    # the annotation was there before the cordon: every cordoned version carries it
    assert all((n["metadata"].get("annotations") or {}).get(CORDON_REASON) == reason
               for n in cordoned)
    assert await driver.drain(w0, reason, "inc-7") is True  # idempotent

    async def undrained() -> bool:
        return await driver.undrain(w0, "inc-7") is Undrain.CLEARED

    await until(undrained, within=90, description=f"driver.undrain({w0}) done")
    node = await rig.read_node(host0)
    assert not node["spec"].get("unschedulable")
    assert CORDON_REASON not in (node["metadata"].get("annotations") or {})
    slurm = await rig.slurm_state(w0)
    assert slurm is not None
    assert not slurm.drain
    assert not (await driver.state(w0)).drain


async def test_driver_leaves_an_external_drain_alone(rig: Rig) -> None:
    ns, _, _, _ = await _two_workers(rig)
    w1 = f"{ns}-1"
    host1 = host_of(await rig.pod(w1))
    driver = SlinkyDriver(rig.api, KubeNodes(rig.api), namespace=rig.namespace)
    await rig.admin_drain(w1, "admin: bad DIMM")
    st = await _state_when(driver, w1, lambda s: s.drain)
    assert st.reason == "admin: bad DIMM"
    assert not st.reason_is_ours
    assert await driver.drain(w1, "healer: XID 79 [inc-8]", "inc-8") is False
    node = await rig.read_node(host1)
    assert not node["spec"].get("unschedulable")
    assert CORDON_REASON not in (node["metadata"].get("annotations") or {})
    assert await driver.undrain(w1, "inc-8") is Undrain.NOT_OURS
    slurm = await rig.slurm_state(w1)
    assert slurm is not None
    assert slurm.drain
    assert slurm.reason == "admin: bad DIMM"


async def test_move_holds_while_someone_elses_drain_is_there(rig: Rig) -> None:
    ns, w0, host0, spare = await _two_workers(rig, spare=True)
    driver = SlinkyDriver(rig.api, KubeNodes(rig.api), namespace=rig.namespace)
    wl = SlinkyWorkload(rig.api, KubeNodes(rig.api), driver, namespace=rig.namespace,
                        nodeset=ns)
    await rig.admin_drain(w0, "maint: x")
    await _state_when(driver, w0, lambda s: s.drain and s.reason == "maint: x")
    assert await _pool(rig, wl).claim(host0, "inc-12") == spare
    old = await rig.pod(w0)
    r = await wl.move("inc-12", w0, host0, spare)
    assert r.outcome is StepOutcome.PENDING, r
    assert "drained or down by someone else" in r.detail
    assert (await rig.pod(w0))["metadata"]["uid"] == old["metadata"]["uid"]
    assert _tainted(await rig.read_node(spare))  # still closed
    st = await rig.slurm_state(w0)
    assert st is not None
    assert (st.drain, st.reason) == (True, "maint: x")


async def test_statefulset_move_waits_for_the_job_then_lands_on_the_spare(rig: Rig) -> None:
    ns, w0, host0, spare = await _two_workers(rig, spare=True)
    driver = SlinkyDriver(rig.api, KubeNodes(rig.api), namespace=rig.namespace)
    wl = SlinkyWorkload(rig.api, KubeNodes(rig.api), driver, namespace=rig.namespace,
                        nodeset=ns)
    assert await wl.scaling_mode() == "StatefulSet"
    assert await wl.node_selector() == rig.pool
    slurm = rig.stack.slurm
    job = await asyncio.to_thread(slurm.submit, HOLD_SCRIPT, w0)
    try:
        await _state_when(driver, w0, lambda s: s.busy)
        assert await driver.drain(w0, "healer: XID 79 [inc-9]", "inc-9") is True
        await _state_when(driver, w0, lambda s: s.drain and s.busy)
        assert await _pool(rig, wl).claim(host0, "inc-9") == spare
        claimed = await rig.read_node(spare)
        assert _tainted(claimed)  # the claim keeps the spare closed
        assert claimed["metadata"]["labels"].items() >= rig.pool.items()
        old = await rig.pod(w0)
        r = await wl.move("inc-9", w0, host0, spare)
        assert r.outcome is StepOutcome.PENDING
        assert "busy" in r.detail
        assert (await rig.pod(w0))["metadata"]["uid"] == old["metadata"]["uid"]
        assert await asyncio.to_thread(slurm.job_state, job) == "RUNNING"
        assert _tainted(await rig.read_node(spare))
        r = await wl.replacement_ready("inc-9", w0, spare)
        assert r.outcome is StepOutcome.PENDING
    finally:
        release(slurm, job)
    assert await asyncio.to_thread(slurm.wait_job, job, ["COMPLETED"], 60) == "COMPLETED"
    await _state_when(driver, w0, lambda s: s.drained)

    async def evicted() -> bool:  # a 429 (pod-protect lags a pass) means: again
        r = await wl.move("inc-9", w0, host0, spare)
        assert r.outcome is StepOutcome.PENDING, r
        return "evicted" in r.detail

    await until(evicted, within=90, interval=0.5,
                   description="move() evicted the drained slurmd")
    assert not _tainted(await rig.read_node(spare))  # opened by move
    await rig.wait_pod(w0, lambda p: host_of(p) == spare and serving(p), within=90,
                       description=f"{w0} idle on the spare")
    r = await wl.move("inc-9", w0, host0, spare)
    assert r.outcome is StepOutcome.DONE, r
    r = await wl.replacement_ready("inc-9", w0, spare)
    assert r.outcome is StepOutcome.DONE, r
    assert dict(r.data)["slurmNode"] == w0
    st = await rig.wait_slurm(w0, lambda s: s.base == "IDLE" and s.registered)
    assert not st.drain
    assert await driver.undrain(w0, "inc-9") is Undrain.CLEARED  # nothing left drained
    job2 = await asyncio.to_thread(slurm.submit, "true", w0)
    assert await asyncio.to_thread(slurm.wait_job, job2, ["COMPLETED"], 60) == "COMPLETED"
    assert (await rig.read_node(host0))["spec"]["unschedulable"] is True  # off to repair


async def test_daemonset_move_reports_the_new_slurm_node(rig: Rig) -> None:
    a = await rig.node("a", dotted=True)
    await rig.node("b", dotted=True)
    spare = await rig.node("c", pool=False, dotted=True, labels={SPARE_LABEL: rig.namespace},
                           taints=[TAINT])
    ns = await rig.nodeset("d", mode="DaemonSet")
    sa, sb, sc = (n.split(".", 1)[0] for n in (a, rig.nodes[1], spare))
    await rig.ready(sa, sb)
    driver = SlinkyDriver(rig.api, KubeNodes(rig.api), namespace=rig.namespace)
    wl = SlinkyWorkload(rig.api, KubeNodes(rig.api), driver, namespace=rig.namespace,
                        nodeset=ns)
    assert await wl.scaling_mode() == "DaemonSet"
    assert await driver.drain(sa, "healer: XID 79 [inc-10]", "inc-10") is True
    await _state_when(driver, sa, lambda s: s.drained)
    assert await _pool(rig, wl).claim(a, "inc-10") == spare

    async def moved() -> dict[str, str] | None:
        r = await wl.move("inc-10", sa, a, spare)
        return dict(r.data) if r.outcome is StepOutcome.DONE else None

    r = await wl.move("inc-10", sa, a, spare)
    assert r.outcome is StepOutcome.PENDING  # nothing runs on the spare yet: move opens it
    data: dict[str, str] | None = await wait_for(moved, timeout=90, interval=0.5,
                                                 description="move() done")
    assert data is not None
    assert data["slurmNode"] == sc

    async def ready() -> bool:
        return (await wl.replacement_ready("inc-10", sc, spare)).outcome is \
            StepOutcome.DONE

    await until(ready, within=90, description=f"replacement_ready({sc})")
    st = await rig.wait_slurm(sc, lambda s: s.base == "IDLE" and s.registered)
    assert not st.drain
    old = await rig.slurm_state(sa)  # the bad node's record stays drained
    assert old is not None
    assert old.drain
    assert old.reason == OPERATOR + "healer: XID 79 [inc-10]"


async def test_move_waits_while_the_recreated_pod_is_unscheduled(rig: Rig) -> None:
    ns, w0, host0, spare = await _two_workers(rig, spare=True)
    driver = SlinkyDriver(rig.api, KubeNodes(rig.api), namespace=rig.namespace)
    wl = SlinkyWorkload(rig.api, KubeNodes(rig.api), driver, namespace=rig.namespace,
                        nodeset=ns)
    assert await driver.drain(w0, "healer: XID 79 [inc-11]", "inc-11") is True
    await _state_when(driver, w0, lambda s: s.drained)
    # claimed without the NodeSet's labels: the recreated pod fits nowhere
    assert await _pool(rig, wl, labels=False).claim(host0, "inc-11") == spare
    old = await rig.pod(w0)

    async def evicted() -> bool:
        r = await wl.move("inc-11", w0, host0, spare)
        return "evicted" in r.detail

    await until(evicted, within=60, interval=0.5,
                   description="move() evicted the drained slurmd")
    pod = await rig.wait_pod(w0, lambda p: p["metadata"]["uid"] != old["metadata"]["uid"],
                             description=f"{w0} recreated")
    assert not host_of(pod)
    r = await wl.move("inc-11", w0, host0, spare)
    assert r.outcome is StepOutcome.PENDING, r
    assert "not scheduled" in r.detail
    assert pod_state(pod).registered is False
