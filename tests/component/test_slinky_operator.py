"""The Slinky driver, workload move and spare pool against what the real slurm-operator does
(../shared/reference/slinky-operator.md), on an in-memory API server driven by the real client:
spares stay closed until the move evicts, one open spare per NodeSet, foreign drains held,
update strategies refused up front, topology on operator v1.0."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes_asyncio import client
from structlog.testing import capture_logs

from healer.adapters.kube.nodes import KubeNodes
from healer.adapters.kube.spares import KubeSparePool
from healer.adapters.slinky import (
    CORDON_REASON,
    OperatorCapabilities,
    SlinkyDriver,
    SlinkyPods,
    foreign_reason,
)
from healer.adapters.slinky_workload import SlinkyWorkload
from healer.adapters.topology_step import NO_COPY_NOTE, KubeTopology
from healer.core import rules as cp
from healer.core.phases import Phase
from healer.core.topology import TOPOLOGY_ANNOTATION
from healer.core.vocabulary import CLAIMED_BY, SPARE_TAINT
from healer.errors import NotFoundError, PermanentError
from healer.ports import HookResult, SlurmHandles, StepOutcome, Undrain
from healer_dev.testing import FakeSlurm, fake_ports
from tests.builders import policies, policy
from tests.component.fake_apiserver import FakeKube, nodeset, nodeset_crd, running
from tests.component.test_controller import make

SEL = {"slinky.slurm.net/nodeset": "gpu"}
SPARE = {"key": SPARE_TAINT, "value": "true", "effect": "NoSchedule"}
HEALER_DRAIN = "healer: XID 79 on GPU 3 [inc-a]"


def world(*, mode: str | None = "StatefulSet", v1_1: bool = True) -> FakeKube:
    k = FakeKube()
    for i in range(2):
        k.add_node(f"gpu-{i}", labels=dict(SEL))
        k.add_pod(f"worker-{i}", f"gpu-{i}")
    for s in ("spare-a", "spare-b"):
        k.add_node(s, labels={"healer.io/role": "spare"}, taints=[dict(SPARE)])
    k.nodesets["gpu"] = nodeset(mode=mode)
    k.crds["nodesets.slinky.slurm.net"] = nodeset_crd(v1_1=v1_1)
    return k


def drained(k: FakeKube, pod: str, reason: str = HEALER_DRAIN) -> None:
    """What the operator mirrors once Slurm drained the node."""
    k.pods[pod]["status"]["conditions"] += [
        {"type": "SlurmNodeStateDrain", "status": "True", "message": reason}]


@dataclass
class Env:
    kube: FakeKube
    api: client.ApiClient
    nodes: KubeNodes
    pool: KubeSparePool

    def workload(self) -> SlinkyWorkload:
        """A fresh one: no in-process memory (like a new leader)."""
        return SlinkyWorkload(self.api, self.nodes, self.driver(), namespace="slurm",
                              nodeset="gpu")

    def driver(self) -> SlinkyDriver:
        return SlinkyDriver(self.api, self.nodes, namespace="slurm", nodeset="gpu")


@pytest.fixture
async def env() -> AsyncIterator[Env]:
    k = world()
    async with running(k) as api:
        nodes = KubeNodes(api)
        sw = SlinkyWorkload(api, nodes, SlinkyDriver(api, nodes, namespace="slurm",
                                                     nodeset="gpu"),
                            namespace="slurm", nodeset="gpu")
        pool = KubeSparePool(nodes, cp.LabelSelector({"healer.io/role": "spare"}),
                             labels_provider=sw.node_selector)
        yield Env(k, api, nodes, pool)



# -- a dead node's slurmd pod (issue 20) -------------------------------------------------------


def recreated_unscheduled(k: FakeKube, pod: str) -> None:
    """The dead node's pod was force-deleted (out-of-service taint) and the operator made it
    again: it waits, unscheduled, without Slurm conditions."""
    k.pods[pod]["spec"].pop("nodeName", None)
    k.pods[pod]["status"]["conditions"] = []


async def test_a_dead_pods_slurm_record_is_deleted_before_the_spare_opens(env: Env) -> None:
    """Its preStop never ran: a replacement registering under the same name would keep the
    dead pod's address (tests/integration/slurm/test_dynamic_records.py), so the record goes
    first, once Slurm lists no job there; then the spare opens."""
    k, slurm = env.kube, FakeSlurm(["worker-0", "worker-1"])
    driver = SlinkyDriver(env.api, env.nodes, namespace="slurm", nodeset="gpu",
                          jobs=SlurmHandles(slurm, hold=slurm, records=slurm))
    sw = SlinkyWorkload(env.api, env.nodes, driver, namespace="slurm", nodeset="gpu",
                        records=driver)
    await env.pool.claim("gpu-0", "inc-a")
    recreated_unscheduled(k, "worker-0")
    slurm.add_job(1, "worker-0")  # slurmctld has not set the dead node DOWN yet
    r = await sw.move("inc-a", "worker-0", "gpu-0", "spare-a", dead=True)
    assert r.outcome is StepOutcome.PENDING
    assert "still lists jobs" in r.detail
    assert SPARE_TAINT in k.taints("spare-a")
    assert not any(e[0] == "delete" for e in slurm.log)

    slurm.end_job(1)
    slurm.set_down("worker-0", "Not responding")  # Slurm's own reason: nobody's hold
    for _ in range(2):  # idempotent: deleted once
        r = await sw.move("inc-a", "worker-0", "gpu-0", "spare-a", dead=True)
        assert r.outcome is StepOutcome.PENDING
        assert "is open for it" in r.detail
    assert [e for e in slurm.log if e[0] == "delete"] == [["delete", "worker-0"]]
    assert SPARE_TAINT not in k.taints("spare-a")
    assert not k.evictions


async def test_a_dead_pods_record_healer_cannot_delete_holds_the_spare_closed(env: Env) -> None:
    k, sw = env.kube, env.workload()  # no job backend: no Slurm API to delete with
    await env.pool.claim("gpu-0", "inc-a")
    recreated_unscheduled(k, "worker-0")
    r = await sw.move("inc-a", "worker-0", "gpu-0", "spare-a", dead=True)
    assert r.outcome is StepOutcome.PENDING
    assert r.data == {"held": "slurm-record"}
    assert "scontrol delete nodename=worker-0" in r.detail
    assert SPARE_TAINT in k.taints("spare-a")

# -- (d) claimed spares stay closed; one open spare per NodeSet -------------------------------


async def test_a_claimed_spare_stays_closed_and_out_of_the_pool(env: Env) -> None:
    k = env.kube
    assert await env.pool.claim("gpu-0", "inc-a") == "spare-a"
    assert SPARE_TAINT in k.taints("spare-a")  # closed: nothing lands there yet
    labels = k.node("spare-a")["metadata"]["labels"]
    assert labels["slinky.slurm.net/nodeset"] == "gpu"
    assert "healer.io/role" not in labels
    assert k.node("spare-a")["metadata"]["annotations"][CLAIMED_BY] == "inc-a"
    assert await env.pool.held_by("inc-a") == "spare-a"
    assert await env.pool.claim("gpu-0", "inc-a") == "spare-a"  # idempotent
    assert sum((await env.pool.depth()).values()) == 1  # claimed is not free
    assert await env.pool.choose("gpu-1") == "spare-b"
    assert await env.pool.claim("gpu-1", "inc-b") == "spare-b"
    assert await env.pool.claim("gpu-1", "inc-c") is None
    # released: back in the pool, closed
    await env.pool.release("spare-a", "inc-a")
    assert SPARE_TAINT in k.taints("spare-a")
    assert k.node("spare-a")["metadata"]["labels"]["healer.io/role"] == "spare"
    assert await env.pool.choose("gpu-0") == "spare-a"


async def test_move_opens_the_spare_only_when_it_evicts(env: Env) -> None:
    k, sw = env.kube, env.workload()
    await env.pool.claim("gpu-0", "inc-a")
    r = await sw.move("inc-a", "worker-0", "gpu-0", "spare-a")
    assert r.outcome is StepOutcome.PENDING
    assert "not drained" in r.detail
    assert SPARE_TAINT in k.taints("spare-a")
    assert not k.evictions
    drained(k, "worker-0")
    r = await sw.move("inc-a", "worker-0", "gpu-0", "spare-a")
    assert r.outcome is StepOutcome.PENDING
    assert "evicted worker-0" in r.detail
    assert k.evictions == ["worker-0"]
    assert SPARE_TAINT not in k.taints("spare-a")
    k.add_pod("worker-0", "spare-a")  # the operator recreates it, the scheduler binds it
    assert (await sw.move("inc-a", "worker-0", "gpu-0", "spare-a")).outcome is StepOutcome.DONE
    await env.pool.release("spare-a", "inc-a")  # release closes it again
    assert SPARE_TAINT in k.taints("spare-a")


async def test_concurrent_swaps_in_one_nodeset_open_one_spare_at_a_time(env: Env) -> None:
    k = env.kube
    await env.pool.claim("gpu-0", "inc-a")
    await env.pool.claim("gpu-1", "inc-b")
    drained(k, "worker-0")
    drained(k, "worker-1", "healer: XID 79 [inc-b]")
    sw = env.workload()
    moves = {"inc-a": ("worker-0", "gpu-0", "spare-a"), "inc-b": ("worker-1", "gpu-1", "spare-b")}
    results = dict(zip(moves, await asyncio.gather(
        *(sw.move(inc, *args) for inc, args in moves.items())), strict=True))
    assert len(k.evictions) == 1  # one only, whichever got the lock first
    first = "inc-a" if k.evictions == ["worker-0"] else "inc-b"
    second = "inc-b" if first == "inc-a" else "inc-a"
    pod1, _, spare1 = moves[first]
    pod2, _, spare2 = moves[second]
    assert "evicted" in results[first].detail
    held = results[second]
    assert held.outcome is StepOutcome.PENDING
    assert spare1 in held.detail
    assert first in held.detail
    assert "NodeSet slurm/gpu" in held.detail
    assert SPARE_TAINT in k.taints(spare2)
    assert SPARE_TAINT not in k.taints(spare1)
    # a restarted leader (no in-process lock or memory) reads the same from the cluster
    again = await env.workload().move(second, *moves[second])
    assert again.outcome is StepOutcome.PENDING
    assert spare1 in again.detail
    assert len(k.evictions) == 1
    # the recreated pod is bound to its spare: the next swap may open its own
    k.add_pod(pod1, spare1)
    r = await env.workload().move(second, *moves[second])
    assert f"evicted {pod2}" in r.detail
    assert SPARE_TAINT not in k.taints(spare2)
    k.add_pod(pod2, spare2)
    for inc, args in moves.items():
        assert (await sw.move(inc, *args)).outcome is StepOutcome.DONE


async def test_an_open_spare_another_nodeset_cannot_use_does_not_block(env: Env) -> None:
    k = env.kube
    await env.pool.claim("gpu-0", "inc-a")
    drained(k, "worker-0")
    k.add_node("other", labels={"healer.io/claim": "x", "slinky.slurm.net/nodeset": "cpu"},
               annotations={CLAIMED_BY: "inc-z"})  # open, claimed, for another NodeSet
    r = await env.workload().move("inc-a", "worker-0", "gpu-0", "spare-a")
    assert "evicted" in r.detail


async def test_a_pdb_block_closes_the_spare_again(env: Env) -> None:
    k = env.kube
    await env.pool.claim("gpu-0", "inc-a")
    drained(k, "worker-0")
    k.pdb_blocks = True
    r = await env.workload().move("inc-a", "worker-0", "gpu-0", "spare-a")
    assert r.outcome is StepOutcome.PENDING
    assert "PodDisruptionBudget" in r.detail
    assert SPARE_TAINT in k.taints("spare-a")


async def test_a_pod_bound_elsewhere_fails(env: Env) -> None:
    k = env.kube
    await env.pool.claim("gpu-0", "inc-a")
    k.pods["worker-0"]["spec"]["nodeName"] = "spare-b"
    r = await env.workload().move("inc-a", "worker-0", "gpu-0", "spare-a")
    assert r.outcome is StepOutcome.FAILED
    assert "spare-b" in r.detail


async def test_daemonset_move_opens_the_spare() -> None:
    k = world(mode="DaemonSet")
    async with running(k) as api:
        nodes = KubeNodes(api)
        sw = SlinkyWorkload(api, nodes, SlinkyDriver(api, nodes, namespace="slurm",
                                                     nodeset="gpu"),
                            namespace="slurm", nodeset="gpu")
        pool = KubeSparePool(nodes, cp.LabelSelector({"healer.io/role": "spare"}),
                             labels_provider=sw.node_selector)
        await pool.claim("gpu-0", "inc-a")
        assert SPARE_TAINT in k.taints("spare-a")
        r = await sw.move("inc-a", "worker-0", "gpu-0", "spare-a")
        assert r.outcome is StepOutcome.PENDING
        assert SPARE_TAINT not in k.taints("spare-a")
        assert not k.evictions
        k.add_pod("gpu-spare-a", "spare-a")
        r = await sw.move("inc-a", "worker-0", "gpu-0", "spare-a")
        assert r.outcome is StepOutcome.DONE
        assert r.data["slurmNode"] == "gpu-spare-a"


# -- (e) a drain someone else owns is held ------------------------------------------------


async def test_move_holds_on_a_drain_someone_else_owns(env: Env) -> None:
    k = env.kube
    await env.pool.claim("gpu-0", "inc-a")
    drained(k, "worker-0", "maint: bios update")
    sw = env.workload()
    with capture_logs() as logs:
        for _ in range(3):
            r = await sw.move("inc-a", "worker-0", "gpu-0", "spare-a")
            assert r.outcome is StepOutcome.PENDING
            assert "maint: bios update" in r.detail
            assert "holds until the owner clears it" in r.detail
    assert [e["event"] for e in logs].count(
        "holding the swap: Slurm node drained or down by someone else") == 1
    assert not k.evictions
    assert SPARE_TAINT in k.taints("spare-a")
    # the owner clears it; the operator drains for the cordon (its own reason): go on
    k.add_pod("worker-0", "gpu-0")
    drained(k, "worker-0", "slurm-operator: Node (gpu-0) was cordoned, Pod must be cordoned")
    assert "evicted" in (await sw.move("inc-a", "worker-0", "gpu-0", "spare-a")).detail


async def test_healers_reason_carried_by_the_operator_is_not_foreign(env: Env) -> None:
    k = env.kube
    await env.pool.claim("gpu-0", "inc-a")
    drained(k, "worker-0", "slurm-operator: " + HEALER_DRAIN)
    assert "evicted" in (await env.workload().move("inc-a", "worker-0", "gpu-0",
                                                   "spare-a")).detail


async def test_drain_leaves_a_foreign_drain_alone(env: Env) -> None:
    k = env.kube
    drained(k, "worker-0", "maint: bios update")
    assert await env.driver().drain("worker-0", HEALER_DRAIN) is False
    node = k.node("gpu-0")
    assert CORDON_REASON not in node["metadata"]["annotations"]
    assert not node["spec"].get("unschedulable")
    assert not k.patches


async def test_an_admins_down_is_theirs(env: Env) -> None:
    """The operator mirrors an admin's ``state=down reason=…`` as a Down condition carrying the
    reason (no Drain one): healer's drain leaves it, its undrain says not ours, the move
    holds (ADR 0016)."""
    k = env.kube
    k.add_pod("worker-0", "gpu-0", conditions={"Down": "admin: PSU swap"})
    driver = env.driver()
    st = await driver.state("worker-0")
    assert (st.down, st.reason) == (True, "admin: PSU swap")
    assert await driver.drain("worker-0", HEALER_DRAIN, "inc-a", host="gpu-0") is False
    assert not k.patches
    assert await driver.undrain("worker-0", "inc-a", host="gpu-0") is Undrain.NOT_OURS
    await env.pool.claim("gpu-0", "inc-a")
    r = await env.workload().move("inc-a", "worker-0", "gpu-0", "spare-a")
    assert r.outcome is StepOutcome.PENDING
    assert "admin: PSU swap" in r.detail
    assert not k.evictions


@dataclass
class HoldingWorkload:
    """The workload port answering as SlinkyWorkload does on a foreign drain."""

    calls: int = 0

    async def move(self, incident: str, slurm_node: str, source: str,
                   spare: str, *, dead: bool = False, carry: bool = False) -> HookResult:
        self.calls += 1
        return HookResult(StepOutcome.PENDING, f"Slurm node {slurm_node} is drained by someone "
                                               "else (reason 'maint: bios update'); ... healer "
                                               "holds until the owner clears it")

    async def replacement_ready(self, incident: str, slurm_node: str,
                                spare: str) -> HookResult:
        raise AssertionError("never reached while held")


async def test_the_flow_goes_on_to_hold_in_move_on_a_foreign_drain() -> None:
    """drain says 'not ours' (False) → the machine observes a drained, idle node, cordons,
    claims and holds in move: no escalation, no undrain of the admin's node."""
    from tests.component.test_controller import fleet

    fakes = fake_ports(fleet())
    slurm: FakeSlurm = fakes["slurm"]
    slurm.set_reason("gpu-1", "maint: bios update")
    fakes["workload"] = HoldingWorkload()
    ps = policies(policy(steps=cp.Steps(poll_interval=5)))
    h = await make(ps, fakes=fakes)
    try:
        await h.xid("gpu-1")
        await h.run(60)
        assert h.phase("gpu-1") is Phase.SWAPPING
        rec = next(r for r, _ in h.store.objects.values() if r.node == "gpu-1")
        assert rec.step_ok("drain")
        move = rec.step("move-workload")
        assert move is not None
        assert not move.done
        # (the PENDING message itself is not kept on the record by the core today)
        assert fakes["workload"].calls > 1
        st = slurm.node_state("gpu-1")
        assert "DRAIN" in st["flags"]
        assert st["reason"] == "maint: bios update"
        assert not any(e[0] == "undrain" for e in slurm.log)
    finally:
        await h.close()


# -- (c) update strategies refused before anything changes -----------------------------------


@pytest.mark.parametrize(("strategy", "v1_1", "why"), [
    ({"type": "OnDelete"}, True, "updateStrategy.type OnDelete"),
    ({}, True, "updateStrategy.type (empty)"),
    ({"type": "RollingUpdate"}, False, "panics on every reconcile"),
])
async def test_drain_refuses_a_strategy_the_operator_cannot_serve(
        strategy: dict[str, Any], v1_1: bool, why: str) -> None:
    k = world(v1_1=v1_1)
    k.nodesets["gpu"] = nodeset(strategy=strategy)
    async with running(k) as api:
        with pytest.raises(PermanentError) as e:
            await SlinkyDriver(api, KubeNodes(api), namespace="slurm").drain(
                "worker-0", HEALER_DRAIN, "inc-a")
    assert "NodeSet slurm/gpu" in str(e.value)
    assert why in str(e.value)
    assert "RollingUpdate" in str(e.value)  # what to change
    assert not k.patches  # nothing cordoned or annotated


@pytest.mark.parametrize(("strategy", "v1_1"), [
    ({"type": "RollingUpdate"}, True),
    ({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}, True),
    ({"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": 1}}, False),
])
async def test_drain_accepts_rolling_update(strategy: dict[str, Any], v1_1: bool) -> None:
    k = world(v1_1=v1_1)
    k.nodesets["gpu"] = nodeset(strategy=strategy)
    async with running(k) as api:
        assert await SlinkyDriver(api, KubeNodes(api), namespace="slurm").drain(
                "worker-0", HEALER_DRAIN, "inc-a")
    node = k.node("gpu-0")
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["annotations"][CORDON_REASON] == HEALER_DRAIN


class _DrainThrough:
    """FakeSlurm, but drains through a real SlinkyDriver on the fake API server."""

    def __init__(self, fake: FakeSlurm, driver: SlinkyDriver) -> None:
        self.fake, self.driver = fake, driver

    async def drain(self, node: str, reason: str, incident: str = "", *,
                    host: str = "") -> bool:
        return await self.driver.drain("worker-0", reason, incident)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fake, name)


async def test_a_refused_strategy_escalates_the_remediation_with_the_reason() -> None:
    from tests.component.test_controller import fleet

    k = world()
    k.nodesets["gpu"] = nodeset(strategy={"type": "OnDelete"})
    async with running(k) as api:
        fakes = fake_ports(fleet())
        fakes["slurm"] = _DrainThrough(fakes["slurm"],
                                        SlinkyDriver(api, KubeNodes(api), namespace="slurm"))
        h = await make(policies(policy(steps=cp.Steps(poll_interval=5))), fakes=fakes)
        try:
            await h.xid("gpu-1")
            # the drain goes over real HTTP to the fake API server: advance the manual clock
            # until the remediation escalated (a deadline in real time, not a fixed wait)
            deadline = time.monotonic() + 30
            while h.phase("gpu-1") is not Phase.ESCALATED and time.monotonic() < deadline:
                await h.run(5)
                await asyncio.sleep(0.02)
            assert h.phase("gpu-1") is Phase.ESCALATED
        finally:
            await h.close()
    rec = next(r for r, _ in h.store.objects.values() if r.node == "gpu-1")
    assert "updateStrategy.type OnDelete" in rec.outcome_detail
    notes = [ev[3] for ev in fakes["events"].events.values() if ev[1] == "Escalated"]
    assert notes
    assert "updateStrategy.type OnDelete" in notes[0]
    assert not k.patches  # the real API saw no write
    assert not fakes["nodes"].node("gpu-1").unschedulable  # and no cordon either


# -- (b) topology on operator v1.0 ----------------------------------------------------------


async def test_capabilities_from_the_nodeset_crd() -> None:
    for v1_1 in (True, False):
        k = world(v1_1=v1_1)
        async with running(k) as api:
            caps = OperatorCapabilities(api)
            assert await caps.copies_topology() is v1_1
            del k.crds["nodesets.slinky.slurm.net"]
            assert await caps.copies_topology() is v1_1  # cached
    k = world()
    k.forbidden.add("nodesets.slinky.slurm.net")
    async with running(k) as api:
        assert await OperatorCapabilities(api).v1_1() is None
    k.crds.clear()
    k.forbidden.clear()
    async with running(k) as api:
        assert await OperatorCapabilities(api).v1_1() is None


async def test_topology_on_v1_0_does_not_wait_for_the_pod_copy() -> None:
    k = world(v1_1=False)
    k.node("spare-a")["metadata"]["labels"]["fabric.topograph.run/tier-0"] = "leaf1"
    k.add_pod("worker-9", "spare-a")
    async with running(k) as api:
        topo = KubeTopology(KubeNodes(api), pods=SlinkyPods(api, "slurm"),
                            copies_topology=OperatorCapabilities(api).copies_topology)
        r = await topo.annotate("inc-a", "spare-a", "worker-9")
    assert r.outcome is StepOutcome.DONE, r.detail
    assert NO_COPY_NOTE in r.detail
    assert r.data["operatorCopiesTopology"] == "false"
    assert r.data["checks"] == "placement"
    assert k.node("spare-a")["metadata"]["annotations"][TOPOLOGY_ANNOTATION] == "default:leaf1"


async def test_topology_on_v1_1_waits_for_the_pod_copy() -> None:
    k = world(v1_1=True)
    k.node("spare-a")["metadata"]["labels"]["fabric.topograph.run/tier-0"] = "leaf1"
    k.add_pod("worker-9", "spare-a")
    async with running(k) as api:
        topo = KubeTopology(KubeNodes(api), pods=SlinkyPods(api, "slurm"),
                            copies_topology=OperatorCapabilities(api).copies_topology)
        r = await topo.annotate("inc-a", "spare-a", "worker-9")
        assert r.outcome is StepOutcome.PENDING
        assert "has not propagated" in r.detail
        k.pods["worker-9"]["metadata"]["annotations"] = {TOPOLOGY_ANNOTATION: "default:leaf1"}
        r = await topo.annotate("inc-a", "spare-a", "worker-9")
    assert r.outcome is StepOutcome.DONE
    assert r.data["operatorCopiesTopology"] == "true"
    assert r.data["checks"] == "placement,pod"




# -- a rolling update takes the drained node's slurmd pod away ---------------------------------


async def test_a_slurm_node_whose_pod_left_its_node_reads_down_there(env: Env) -> None:
    """While a remediation drains gpu-0, a rolling update deletes worker-0 once its job ended
    and recreates it: absent for a moment, then unscheduled or on another Node. Seen from
    gpu-0 nothing runs there any more: DOWN, no job, nobody's reason (it holds nothing);
    read without a Node, the pod's own state stands."""
    driver = env.driver()
    drained(env.kube, "worker-0")
    st = await driver.state("worker-0", host="gpu-0")
    assert (st.drain, st.down, st.busy) == (True, False, False)
    del env.kube.pods["worker-0"]  # deleted, not recreated yet
    st = await driver.state("worker-0", host="gpu-0")
    assert (st.down, st.busy, st.reason, st.registered) == (True, False, "", False)
    with pytest.raises(NotFoundError):  # read without a Node: there is no pod to read
        await driver.state("worker-0")
    env.kube.add_pod("worker-0", "gpu-0")
    recreated_unscheduled(env.kube, "worker-0")
    st = await driver.state("worker-0", host="gpu-0")
    assert (st.down, st.busy, st.reason, st.registered) == (True, False, "", False)
    assert foreign_reason(st) == ""
    env.kube.pods["worker-0"]["spec"]["nodeName"] = "gpu-1"  # it landed elsewhere
    assert (await driver.state("worker-0", host="gpu-0")).down
    assert not (await driver.state("worker-0")).down  # its own state, wherever it runs
