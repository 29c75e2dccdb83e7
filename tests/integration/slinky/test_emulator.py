"""The Slinky emulator against the real kube-apiserver (kube-scheduler, kwok) and a real Slurm:
the cordon ⇄ drain sync, Slurm state in pod conditions, disruption protection, the slurmd
preStop hook, pods moving to a spare (StatefulSet mode) and new Slurm nodes on a newly eligible
Node (DaemonSet mode)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from kubernetes_asyncio import client

from healer.adapters.kube.pods import Evicted, evict
from healer.adapters.slinky import pod_state
from healer.sim.slinky import (
    POD_CORDON,
    POD_HOSTNAME,
    POD_PROTECT,
    TERMINATING_REASON,
    TOPOLOGY,
    nodeset_crd,
)
from tests.integration.slinky.conftest import Rig, host_of, two_workers
from tests.integration.slurm_fixtures import HOLD_SCRIPT, release
from tests.integration.waiting import wait_for

OPERATOR = "slurm-operator: "


def _ann(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def _labels(obj: dict[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("labels") or {})


def _conditions(pod: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {str(c["type"]): c for c in (pod.get("status") or {}).get("conditions") or []
            if str(c.get("type", "")).startswith("SlurmNodeState")}


def test_crd_has_the_fields_healer_reads() -> None:
    crd = nodeset_crd()
    version = crd["spec"]["versions"][0]
    assert (crd["spec"]["group"], version["name"], crd["spec"]["scope"]) == (
        "slinky.slurm.net", "v1beta1", "Namespaced")
    assert "status" in version["subresources"]
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert {"replicas", "scalingMode", "controllerRef", "template"} <= set(spec)
    assert spec["scalingMode"]["enum"] == ["StatefulSet", "DaemonSet"]
    tmpl = spec["template"]["properties"]
    assert {"labels"} <= set(tmpl["metadata"]["properties"])
    assert {"nodeSelector", "affinity", "tolerations", "hostname"} <= set(
        tmpl["spec"]["properties"])
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]["properties"]
    assert {"replicas", "readyReplicas", "slurmIdle", "slurmAllocated", "slurmDown",
            "slurmDrain"} <= set(status)


async def test_statefulset_pods_carry_slinky_identity(rig: Rig) -> None:
    await two_workers(rig)
    pods = {p["metadata"]["name"]: p for p in await rig.pods()}
    assert set(pods) == {"worker-0", "worker-1"}
    p = pods["worker-0"]
    labels = _labels(p)
    assert labels["app.kubernetes.io/name"] == "slurmd"
    assert labels["app.kubernetes.io/component"] == "worker"
    assert labels["slinky.slurm.net/cluster"] == "slurm"
    assert labels["nodeset.slinky.slurm.net/pod-name"] == "worker-0"
    assert labels["nodeset.slinky.slurm.net/pod-index"] == "0"
    assert labels[POD_HOSTNAME] == "worker-0"
    assert labels["nodeset.slinky.slurm.net/scaling-mode"] == "StatefulSet"
    assert labels["healer-test/role"] == "gpu"  # from the template
    assert p["spec"]["hostname"] == "worker-0"
    assert p["spec"]["nodeSelector"] == rig.pool
    assert {"key": "nodeset.slinky.slurm.net/worker", "operator": "Exists",
            "effect": "NoExecute"} in p["spec"]["tolerations"]
    anti = p["spec"]["affinity"]["podAntiAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"]
    assert anti[0]["topologyKey"] == "kubernetes.io/hostname"
    assert host_of(pods["worker-0"]) != host_of(pods["worker-1"])  # one slurmd per Node
    conds = _conditions(p)
    assert conds["SlurmNodeStateIdle"]["status"] == "True"
    assert not [t for t in conds if t != "SlurmNodeStateIdle"]

    async def counted() -> dict[str, Any] | None:
        st = await rig.nodeset_status("worker")
        return st if (st.get("replicas"), st.get("readyReplicas"), st.get("slurmIdle")) == (
            2, 2, 2) else None

    status = await wait_for(counted, timeout=30, description="NodeSet status counts")
    assert (status["slurmAllocated"], status["slurmDown"], status["slurmDrain"]) == (0, 0, 0)


async def test_cordon_drains_with_the_nodes_reason(rig: Rig) -> None:
    host0, host1, _ = await two_workers(rig)
    reason = "healer: XID 79 on GPU 3 [inc-1]"
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await rig.cordon(host0, reason)
    st = await rig.wait_slurm("worker-0", lambda s: s.drain, within=30)
    elapsed = loop.time() - t0
    assert st.reason == OPERATOR + reason
    pod = await rig.wait_pod("worker-0", lambda p: pod_state(p).drain)
    assert _ann(pod)[POD_CORDON] == "true"
    ps = pod_state(pod)
    assert (ps.base, ps.reason, ps.reason_is_ours, ps.drained) == ("IDLE", reason, True, True)
    assert _conditions(pod)["SlurmNodeStateDrain"]["message"] == OPERATOR + reason

    # no annotation: the default text; and an existing reason is kept (MakeNodeDrain)
    await rig.cordon(host1)
    st1 = await rig.wait_slurm("worker-1", lambda s: s.drain, within=30)
    assert st1.reason == (f"{OPERATOR}Node ({host1}) was cordoned, Pod ({rig.namespace}/"
                          "worker-1) must be cordoned")
    await rig.patch_node(host1, {"metadata": {"annotations": {
        "nodeset.slinky.slurm.net/node-cordon-reason": "changed later"}}})
    await rig.emu.reconcile_once()
    assert (await rig.slurm_state("worker-1")).reason == st1.reason  # type: ignore[union-attr]

    async def drained_count() -> bool:
        return (await rig.nodeset_status("worker")).get("slurmDrain") == 2

    await wait_for(drained_count, timeout=30, description="NodeSet status slurmDrain=2")
    print(f"\n[timing] cordon → Slurm drained: {elapsed:.2f} s")


async def test_busy_node_shows_draining_then_drained(rig: Rig) -> None:
    host0, _, _ = await two_workers(rig)
    job = await asyncio.to_thread(rig.slurm.submit, HOLD_SCRIPT, "worker-0")
    try:
        pod = await rig.wait_pod("worker-0", lambda p: pod_state(p).busy and _labels(p).get(
            POD_PROTECT) == "true", description="worker-0 busy and protected")
        assert pod_state(pod).base in ("ALLOCATED", "MIXED")
        await rig.cordon(host0, "healer: ECC storm [inc-2]")
        pod = await rig.wait_pod("worker-0", lambda p: pod_state(p).drain,
                                 description="worker-0 draining")
        ps = pod_state(pod)
        assert ps.busy
        assert not ps.drained
        assert ps.reason == "healer: ECC storm [inc-2]"
        conds = _conditions(pod)
        base = "SlurmNodeStateMixed" if ps.base == "MIXED" else "SlurmNodeStateAllocated"
        assert conds[base]["status"] == conds["SlurmNodeStateDrain"]["status"] == "True"
        assert await asyncio.to_thread(rig.slurm.job_state, job) == "RUNNING"
    finally:
        release(rig.slurm, job)
    pod = await rig.wait_pod("worker-0", lambda p: pod_state(p).drained and POD_PROTECT not in
                             _labels(p), description="worker-0 drained and unprotected")
    conds = _conditions(pod)
    assert set(conds) == {"SlurmNodeStateIdle", "SlurmNodeStateDrain"}  # stale ones removed
    assert pod_state(pod).base == "IDLE"


async def test_evicting_a_busy_slurmd_answers_429(rig: Rig) -> None:
    await two_workers(rig)
    job = await asyncio.to_thread(rig.slurm.submit, HOLD_SCRIPT, "worker-0")
    try:
        pod = await rig.wait_pod("worker-0", lambda p: _labels(p).get(POD_PROTECT) == "true",
                                 description="worker-0 protected")
        pdb = await client.PolicyV1Api(rig.api).read_namespaced_pod_disruption_budget(
            "slurm-worker-protect", rig.namespace)
        assert pdb.spec.max_unavailable == 0
        meta = pod["metadata"]
        assert await evict(rig.api, rig.namespace, meta["name"], meta["uid"]) == Evicted.BLOCKED
        assert (await rig.pod("worker-0"))["metadata"]["uid"] == meta["uid"]
        assert await asyncio.to_thread(rig.slurm.job_state, job) == "RUNNING"
    finally:
        release(rig.slurm, job)
    pod = await rig.wait_pod("worker-0", lambda p: POD_PROTECT not in _labels(p) and
                             not pod_state(p).busy, description="worker-0 idle, unprotected")
    assert await evict(rig.api, rig.namespace, "worker-0", pod["metadata"]["uid"]) == \
        Evicted.DONE


async def test_uncordon_undrains_the_operators_drain(rig: Rig) -> None:
    host0, _, _ = await two_workers(rig)
    await rig.cordon(host0, "healer: thermal [inc-3]")
    await rig.wait_slurm("worker-0", lambda s: s.drain, within=30)
    await rig.uncordon(host0)
    st = await rig.wait_slurm("worker-0", lambda s: not s.drain, within=30,
                              description="worker-0 undrained")
    assert st.reason == ""
    pod = await rig.wait_pod("worker-0", lambda p: POD_CORDON not in _ann(p) and
                             not pod_state(p).drain, description="pod uncordoned")
    assert "SlurmNodeStateDrain" not in _conditions(pod)
    updates = rig.updates_of("worker-0")
    assert ("scontrol", "update", "nodename=worker-0", "state=undrain") in updates
    assert not [u for u in updates if "state=resume" in u]  # UNDRAIN, never RESUME


async def test_external_reason_is_never_touched(rig: Rig) -> None:
    host0, host1, _ = await two_workers(rig)
    await rig.scontrol("update", "nodename=worker-1", "state=drain", "reason=admin: bad DIMM")
    await rig.wait_pod("worker-1", lambda p: pod_state(p).reason == "admin: bad DIMM",
                       description="worker-1 shows the admin's drain")
    await rig.cordon(host0, "healer: [inc-4]")
    await rig.cordon(host1, "healer: [inc-4]")
    await rig.wait_slurm("worker-0", lambda s: s.drain, within=30)
    await rig.emu.reconcile_once()  # a full pass that saw both cordons
    st1 = await rig.slurm_state("worker-1")
    assert st1 is not None
    assert st1.drain
    assert st1.reason == "admin: bad DIMM"
    assert POD_CORDON not in _ann(await rig.pod("worker-1"))

    await rig.uncordon(host0)
    await rig.uncordon(host1)
    await rig.wait_slurm("worker-0", lambda s: not s.drain, within=30)
    await rig.emu.reconcile_once()
    st1 = await rig.slurm_state("worker-1")
    assert st1 is not None
    assert st1.drain
    assert st1.reason == "admin: bad DIMM"
    # the pod's identity went into the comment; the node's state and reason were never changed
    assert not [u for u in rig.updates_of("worker-1") if not u[-1].startswith("comment=")]


async def test_pod_cordon_alone_drains_until_removed(rig: Rig) -> None:
    await two_workers(rig)
    await client.CoreV1Api(rig.api).patch_namespaced_pod(
        "worker-1", rig.namespace, {"metadata": {"annotations": {POD_CORDON: "true"}}},
        _content_type="application/merge-patch+json")  # type: ignore[call-arg]
    st = await rig.wait_slurm("worker-1", lambda s: s.drain, within=30)
    assert st.reason == f"{OPERATOR}Pod ({rig.namespace}/worker-1) was cordoned"
    await rig.emu.reconcile_once()
    assert (await rig.slurm_state("worker-1")).drain  # type: ignore[union-attr]
    await client.CoreV1Api(rig.api).patch_namespaced_pod(
        "worker-1", rig.namespace, {"metadata": {"annotations": {POD_CORDON: None}}},
        _content_type="application/merge-patch+json")  # type: ignore[call-arg]
    await rig.wait_slurm("worker-1", lambda s: not s.drain, within=30)


async def test_topology_annotation_is_copied_to_the_pod(rig: Rig) -> None:
    host0, _, _ = await two_workers(rig)
    spec = "topo-switch:s2,topo-block:b2"
    await rig.patch_node(host0, {"metadata": {"annotations": {TOPOLOGY: spec}}})
    pod = await rig.wait_pod("worker-0", lambda p: _ann(p).get(TOPOLOGY) == spec)
    assert pod["metadata"]["name"] == "worker-0"
    assert rig.emu.topology["worker-0"] == spec


@pytest.mark.timeout(180)
async def test_deleting_a_busy_slurmd_kills_its_job(rig: Rig) -> None:
    await two_workers(rig)
    job = await asyncio.to_thread(rig.slurm.submit, HOLD_SCRIPT, "worker-0",
                                  args=["--no-requeue"])
    try:
        pod = await rig.wait_pod("worker-0", lambda p: pod_state(p).busy)
        # a plain DELETE bypasses the PodDisruptionBudget: the preStop hook sets the node DOWN
        await client.CoreV1Api(rig.api).delete_namespaced_pod("worker-0", rig.namespace)
        state = await asyncio.to_thread(rig.slurm.wait_job, job,
                                        ["NODE_FAIL", "FAILED", "CANCELLED"], 30)
        assert state == "NODE_FAIL"
    finally:
        release(rig.slurm, job)
    assert ("scontrol", "update", "nodename=worker-0", "state=down",
            f"reason={TERMINATING_REASON}") in rig.updates_of("worker-0")
    # the pod comes back under the same name and its Slurm node serves again
    await rig.wait_pod("worker-0", lambda p: p["metadata"]["uid"] != pod["metadata"]["uid"]
                       and pod_state(p).base == "IDLE" and not pod_state(p).drain
                       and pod_state(p).registered, description="worker-0 recreated, idle")
    st = await rig.wait_slurm("worker-0", lambda s: s.base == "IDLE" and s.registered)
    assert not st.drain


@pytest.mark.timeout(180)
async def test_drained_pod_deleted_moves_to_the_spare(rig: Rig) -> None:
    host0, _host1, spare = await two_workers(rig, spare=True)
    await rig.cordon(host0, "healer: XID 79 [inc-5]")
    await rig.wait_pod("worker-0", lambda p: pod_state(p).drained)
    await rig.patch_node(spare, {"metadata": {"labels": rig.pool}})  # the claim
    old = await rig.pod("worker-0")
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    assert await evict(rig.api, rig.namespace, "worker-0", old["metadata"]["uid"]) == \
        Evicted.DONE
    pod = await rig.wait_pod(
        "worker-0", lambda p: host_of(p) == spare and pod_state(p).base == "IDLE"
        and pod_state(p).registered and not pod_state(p).drain,
        description="worker-0 on the spare, registered and idle")
    elapsed = loop.time() - t0
    assert pod["metadata"]["uid"] != old["metadata"]["uid"]
    st = await rig.wait_slurm("worker-0", lambda s: s.base == "IDLE" and s.registered)
    assert not st.drain
    assert ("worker-0", False) in rig.slurmd_calls
    assert ("worker-0", True) in rig.slurmd_calls
    # it answers again: a job runs there
    job = await asyncio.to_thread(rig.slurm.submit, "true", "worker-0")
    assert await asyncio.to_thread(rig.slurm.wait_job, job, ["COMPLETED"], 30) == "COMPLETED"
    assert not [p for p in await rig.pods() if host_of(p) == host0]  # the bad node is empty
    print(f"\n[timing] drained pod evicted → registered on the spare: {elapsed:.2f} s")


@pytest.mark.timeout(180)
async def test_daemonset_spare_becomes_a_new_slurm_node(rig: Rig) -> None:
    a = await rig.node("dgx-a", dotted=True)
    b = await rig.node("gpu-host", annotations={
        "nodeset.slinky.slurm.net/hostname-override": "dgx-b"})
    spare = await rig.node("dgx-c", pool=False, dotted=True)
    await rig.nodeset("dgx", mode="DaemonSet")
    pods = await rig.ready("dgx-a", "dgx-b")
    assert (host_of(pods["dgx-a"]), host_of(pods["dgx-b"])) == (a, b)
    for p in pods.values():
        assert p["metadata"]["name"].startswith("dgx-")
        assert p["metadata"]["generateName"] == "dgx-"
        assert _labels(p)["nodeset.slinky.slurm.net/scaling-mode"] == "DaemonSet"
    assert pods["dgx-b"]["spec"]["hostname"] == "dgx-b"
    assert await rig.slurm_state("dgx-c") is None  # not a Slurm node yet

    await rig.cordon(a, "healer: XID 79 [inc-6]")
    await rig.wait_pod("dgx-a", lambda p: pod_state(p).drained)
    # an eligible but cordoned Node gets no new slurmd
    await rig.cordon(spare)
    await rig.patch_node(spare, {"metadata": {"labels": rig.pool}})
    await rig.emu.reconcile_once()
    assert not [p for p in await rig.pods() if host_of(p) == spare]
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await rig.uncordon(spare)
    pod = await rig.wait_pod("dgx-c", lambda p: host_of(p) == spare and pod_state(p).base == "IDLE"
                             and pod_state(p).registered,
                             description="a new Slurm node dgx-c on the spare")
    elapsed = loop.time() - t0
    assert pod["spec"]["hostname"] == "dgx-c"
    assert ("dgx-c", True) in rig.slurmd_calls
    st = await rig.wait_slurm("dgx-c", lambda s: s.base == "IDLE" and s.registered)
    assert not st.drain
    old = await rig.slurm_state("dgx-a")  # the bad node's record stays drained
    assert old is not None
    assert old.drain
    assert old.reason == f"{OPERATOR}healer: XID 79 [inc-6]"
    assert host_of(await rig.pod("dgx-a")) == a  # its pod is kept on the cordoned Node
    print(f"\n[timing] DaemonSet spare uncordoned → new Slurm node idle: {elapsed:.2f} s")


async def test_scale_in_drains_then_deletes_the_highest_ordinal(rig: Rig) -> None:
    await two_workers(rig)
    await client.CustomObjectsApi(rig.api).patch_namespaced_custom_object(
        "slinky.slurm.net", "v1beta1", rig.namespace, "nodesets", "worker",
        {"spec": {"replicas": 1}},
        _content_type="application/merge-patch+json")  # type: ignore[call-arg]

    drain = ("scontrol", "update", "nodename=worker-1", "state=drain",
             f"reason={OPERATOR}Pod ({rig.namespace}/worker-1) is pending termination for "
             "scale-in")
    prestop = ("scontrol", "update", "nodename=worker-1", "state=down",
               f"reason={TERMINATING_REASON}")

    async def gone() -> bool:
        return [p["metadata"]["name"] for p in await rig.pods()] == ["worker-0"] and \
            prestop in rig.updates_of("worker-1")

    await wait_for(gone, timeout=30, description="worker-1 deleted (its preStop ran)")
    updates = rig.updates_of("worker-1")
    assert drain in updates
    assert prestop in updates
    assert updates.index(drain) < updates.index(prestop)  # drained first, then deleted
    st = await rig.slurm_state("worker-0")
    assert st is not None
    assert not st.drain
