"""The Kubernetes adapter against the real kube-apiserver: watches that resume, writes that
race, the NodeRemediation round trip, Events, eviction and spare claims."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kubernetes_asyncio import client

from healer.adapters.kube.client import ApiEventWriter
from healer.adapters.kube.crd import crd_manifest
from healer.adapters.kube.events import KubeEvents, event_name
from healer.adapters.kube.nodes import KubeNodes
from healer.adapters.kube.pods import Evicted, evict
from healer.adapters.kube.spares import KubeSparePool
from healer.adapters.kube.store import CRStateStore, ensure_crd
from healer.core.model import (
    GpuRef,
    HealthState,
    Incident,
    NodeRecord,
    Severity,
    StepOutcome,
    StepRecord,
)
from healer.core.modes import Mode
from healer.core.phases import Phase
from healer.core.rules import LabelSelector
from healer.core.vocabulary import CLAIMED_BY, INCIDENT_ANNOTATION
from healer.errors import ConflictError
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import fake_node
from tests.integration.waiting import wait_for

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def nodes(kube_api: client.ApiClient, request: pytest.FixtureRequest
                ) -> AsyncIterator[tuple[KubeNodes, list[str]]]:
    """Three fresh kwok nodes (unique names) for one test; deleted afterwards."""
    core = client.CoreV1Api(kube_api)
    prefix = f"n{abs(hash(request.node.name)) % 10**6}"
    names = [f"{prefix}-{i}" for i in range(3)]
    for n in names:
        await core.create_node(fake_node(n, labels={"nvidia.com/gpu.present": "true",  # type: ignore[arg-type]
                                                   "test": prefix}))
    try:
        yield KubeNodes(kube_api, watch_timeout=30), names
    finally:
        for n in names:
            with contextlib.suppress(Exception):
                await core.delete_node(n)


async def _collect(kn: KubeNodes, cache: dict[str, dict[str, str]], synced: asyncio.Event,
                   rv: str = "") -> None:
    async for ev in kn.watch(rv):
        if ev.type == "SYNCED":
            synced.set()
        elif ev.node is not None:
            if ev.type == "DELETED":
                cache.pop(ev.node.name, None)
            else:
                cache[ev.node.name] = dict(ev.node.labels)


async def _relist(kn: KubeNodes, names: list[str]) -> dict[str, dict[str, str]]:
    return {n.name: dict(n.labels) for n in await kn.list() if n.name in names}


async def test_watch_resumes_after_apiserver_restart(
        kube_stack: KubeStack, nodes: tuple[KubeNodes, list[str]]) -> None:
    kn, names = nodes
    cache: dict[str, dict[str, str]] = {}
    synced = asyncio.Event()
    task = asyncio.create_task(_collect(kn, cache, synced))
    try:
        await asyncio.wait_for(synced.wait(), 20)
        await kn.patch_metadata(names[0], labels={"before": "restart"})
        await asyncio.to_thread(kube_stack.restart_apiserver)
        for i, n in enumerate(names):  # changes made after the restart
            await kn.patch_metadata(n, labels={"after": str(i)})

        async def caught_up() -> bool:
            return {n: cache.get(n) for n in names} == await _relist(kn, names)

        await wait_for(caught_up, timeout=60, description="watch cache == re-list")
        assert cache[names[0]]["before"] == "restart"
        assert cache[names[2]]["after"] == "2"
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_watch_relists_after_410_gone(
        kube_stack: KubeStack, nodes: tuple[KubeNodes, list[str]]) -> None:
    kn, names = nodes
    _, old_rv = await kn.list_raw()
    for i, n in enumerate(names):
        await kn.patch_metadata(n, labels={"gen": str(i)})
    # compact etcd past old_rv so a watch from it answers 410 Gone
    bins = kube_stack.binaries
    etcdctl = bins.etcd.parent / "etcdctl"
    status = await asyncio.to_thread(
        subprocess.run, [str(etcdctl), f"--endpoints={kube_stack.etcd_url}", "endpoint",
                         "status", "--write-out=json"], capture_output=True, text=True, check=True)
    rev = json.loads(status.stdout)[0]["Status"]["header"]["revision"]
    await asyncio.to_thread(
        subprocess.run, [str(etcdctl), f"--endpoints={kube_stack.etcd_url}", "compact", str(rev)],
        capture_output=True, text=True, check=True)
    # the apiserver's watch cache would still serve old_rv; a restart drops it, so the
    # compacted revision is truly gone and the watch gets 410 Gone
    await asyncio.to_thread(kube_stack.restart_apiserver)
    cache: dict[str, dict[str, str]] = {}
    synced = asyncio.Event()
    task = asyncio.create_task(_collect(kn, cache, synced, rv=old_rv))
    try:
        await asyncio.wait_for(synced.wait(), 30)  # only a re-list produces SYNCED here
        assert {n: cache.get(n) for n in names} == await _relist(kn, names)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


async def test_cordon_never_takes_over_a_human_cordon(
        nodes: tuple[KubeNodes, list[str]]) -> None:
    kn, names = nodes
    core = client.CoreV1Api(kn.api)
    await core.patch_node(names[0], {"spec": {"unschedulable": True}})
    assert await kn.cordon(names[0], "inc-1", "healer: test") is False
    assert await kn.uncordon(names[0], "inc-1") is False
    assert (await kn.get(names[0])).unschedulable  # the human's cordon stays
    # healer's own cordon is undone by healer, with its taint and provenance
    assert await kn.cordon(names[1], "inc-2", "healer: test") is True
    assert await kn.cordon(names[1], "inc-2", "healer: test") is True  # idempotent
    v = await kn.get(names[1])
    assert v.unschedulable
    assert v.annotations[INCIDENT_ANNOTATION] == "inc-2"
    assert any(t.key == "healer.io/remediation" for t in v.taints)
    assert await kn.uncordon(names[1], "inc-other") is False
    assert await kn.uncordon(names[1], "inc-2") is True
    v = await kn.get(names[1])
    assert not v.unschedulable
    assert INCIDENT_ANNOTATION not in v.annotations
    assert not any(t.key == "healer.io/remediation" for t in v.taints)


async def test_concurrent_writer_is_never_overwritten(
        nodes: tuple[KubeNodes, list[str]]) -> None:
    """A human labels and taints the node between healer's read and healer's write: the
    write fails on the resourceVersion, is recomputed, and both changes survive."""
    kn, names = nodes
    core = client.CoreV1Api(kn.api)
    real_get = kn.get_raw
    raced = {"n": 0}

    async def racing_get(name: str) -> dict[str, Any]:
        raw = await real_get(name)
        if raced["n"] == 0:
            raced["n"] += 1
            await core.patch_node(name, {"metadata": {"labels": {"human": "was-here"}},
                                         "spec": {"taints": [{"key": "human", "value": "1",
                                                              "effect": "NoSchedule"}]}})
        return raw

    kn.get_raw = racing_get  # type: ignore[method-assign]
    assert await kn.cordon(names[2], "inc-3", "healer: race") is True
    kn.get_raw = real_get  # type: ignore[method-assign]
    v = await kn.get(names[2])
    assert v.labels["human"] == "was-here"
    assert {t.key for t in v.taints} >= {"human", "healer.io/remediation"}
    assert v.unschedulable
    # a stale resourceVersion is refused, not applied
    with pytest.raises(ConflictError):
        await kn.patch_metadata(names[2], labels={"x": "y"}, resource_version="1")


async def test_noderemediation_round_trips_exactly(kube_api: client.ApiClient) -> None:
    await ensure_crd(kube_api, install=True)
    store = CRStateStore(kube_api)
    inc = Incident("rt-node-20260105-080000", "rt-node", 1767600000.123456, Severity.FAILED,
                   ("fatal-xid",), (GpuRef(3, "GPU-abc", "1650000003"),), "XID 79 x1")
    rec = NodeRecord("rt-node", inc, "gpu-fatal", Phase.DRAINING, 1767600001.5, Mode.ACT,
                     (StepRecord("drain", 1767600001.5, 2, 1767600002.75, StepOutcome.DONE, "",
                                 "owner=healer"),),
                     slurm_node="rt-node", verdict=HealthState.FAILED, verdict_at=1767600000.25)
    s1 = await store.save(rec, None)
    got = await store.get(s1.name)
    assert got.record == rec
    rec2 = rec.with_step(StepRecord("cordon", 1767600003.0))
    s2 = await store.save(rec2, s1)
    assert (await store.get(s1.name)).record == rec2
    with pytest.raises(ConflictError):
        await store.save(rec, s1)  # stale resourceVersion
    assert s2.resource_version != s1.resource_version
    await store.delete(s1.name)


async def test_crd_is_structural_and_has_printer_columns(kube_api: client.ApiClient) -> None:
    await ensure_crd(kube_api, install=True)
    ext = client.ApiextensionsV1Api(kube_api)
    crd = await ext.read_custom_resource_definition(crd_manifest()["metadata"]["name"])
    cols = {c.name: c.priority or 0 for c in crd.spec.versions[0].additional_printer_columns}
    # Placement (how far the spare is: domain, tier-N, any) only with -o wide
    assert cols == {"Node": 0, "Phase": 0, "Reason": 0, "Spare": 0, "Placement": 1, "Age": 0}
    conds = {c.type: c.status for c in crd.status.conditions}
    assert conds.get("NonStructuralSchema", "False") == "False"
    assert conds["Established"] == "True"


async def test_events_are_emitted_once_per_key(kube_api: client.ApiClient) -> None:
    ev = KubeEvents(ApiEventWriter(kube_api), instance="test")  # Node Events live in default
    for _ in range(3):
        await ev.emit(key="inc-9/event-opened", node="some-node", reason="IncidentOpened",
                      note="hello", type="Warning", remediation="inc-9")
    e = await client.EventsV1Api(kube_api).read_namespaced_event(
        event_name("inc-9/event-opened"), "default")
    assert e.reporting_controller == "healer.io/healer"
    assert e.regarding.kind == "Node"
    assert e.related.kind == "NodeRemediation"
    assert e.type == "Warning"


async def test_eviction_honours_pdb(kube_stack: KubeStack, kube_api: client.ApiClient,
                                    namespace: str) -> None:
    core = client.CoreV1Api(kube_api)
    node = f"evict-{namespace[-6:]}"
    await core.create_node(fake_node(node))  # type: ignore[arg-type]
    try:
        pod = {"apiVersion": "v1", "kind": "Pod",
               "metadata": {"name": "slurmd-0", "labels": {"app": "slurmd"}},
               "spec": {"nodeName": node, "containers": [{"name": "c", "image": "x"}],
                        "tolerations": [{"operator": "Exists"}]}}
        await core.create_namespaced_pod(namespace, pod)  # type: ignore[arg-type]

        async def running() -> bool:
            p = await core.read_namespaced_pod("slurmd-0", namespace)
            return p.status.phase == "Running"

        await wait_for(running, timeout=60, description="pod Running on the kwok node")
        pdb = {"apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
               "metadata": {"name": "protect"},
               "spec": {"maxUnavailable": 0, "selector": {"matchLabels": {"app": "slurmd"}}}}
        await client.PolicyV1Api(kube_api).create_namespaced_pod_disruption_budget(namespace, pdb)  # type: ignore[arg-type]

        async def blocked() -> bool:
            return await evict(kube_api, namespace, "slurmd-0") == Evicted.BLOCKED

        await wait_for(blocked, timeout=30, description="eviction answered 429")
        await client.PolicyV1Api(kube_api).delete_namespaced_pod_disruption_budget(
            "protect", namespace)
        assert await evict(kube_api, namespace, "slurmd-0") == Evicted.DONE
        assert await evict(kube_api, namespace, "no-such-pod") == Evicted.GONE
    finally:
        await core.delete_node(node)


async def test_spare_claim_is_atomic_and_topology_aware(kube_api: client.ApiClient) -> None:
    core = client.CoreV1Api(kube_api)
    dom = "accelerator.topograph.run/domain"
    specs = {"claim-bad": {dom: "x"}, "claim-spare-x": {dom: "x", "healer.io/role": "spare"},
             "claim-spare-y": {dom: "y", "healer.io/role": "spare"}}
    for name, labels in specs.items():
        taints = [{"key": "healer.io/spare", "value": "true", "effect": "NoSchedule"}] \
            if "spare" in name else []
        await core.create_node(fake_node(name, labels=labels, taints=taints))  # type: ignore[arg-type]
    try:
        kn = KubeNodes(kube_api)
        pool = KubeSparePool(kn, LabelSelector({"healer.io/role": "spare"}),
                             claim_labels={"slinky.slurm.net/nodeset": "gpu"})

        async def ready() -> bool:
            return len([n for n in await kn.list() if n.name.startswith("claim-") and n.ready]) == 3

        await wait_for(ready, timeout=60, description="kwok nodes Ready")
        # two incidents race for spares: each gets a different one, the closer one wins first
        a, b = await asyncio.gather(pool.claim("claim-bad", "inc-a"),
                                    pool.claim("claim-bad", "inc-b"))
        assert {a, b} == {"claim-spare-x", "claim-spare-y"}
        assert await pool.claim("claim-bad", "inc-a") == a  # idempotent per incident
        assert await pool.claim("claim-bad", "inc-c") is None  # the pool is empty
        sx = await kn.get("claim-spare-x")
        assert sx.annotations[CLAIMED_BY] in ("inc-a", "inc-b")
        assert sx.labels["slinky.slurm.net/nodeset"] == "gpu"
        assert "healer.io/role" not in sx.labels
        # claimed but closed: the taint stays until the move opens it (one open spare per
        # NodeSet, so a recreated pod cannot land on another remediation's spare)
        assert any(t.key == "healer.io/spare" for t in sx.taints)
        await pool.release("claim-spare-x", sx.annotations[CLAIMED_BY])
        back = await kn.get("claim-spare-x")
        assert back.labels["healer.io/role"] == "spare"
        assert any(t.key == "healer.io/spare" for t in back.taints)
        assert (await pool.depth()) == {"x": 1}
    finally:
        for name in specs:
            with contextlib.suppress(Exception):
                await core.delete_node(name)
