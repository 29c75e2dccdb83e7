"""What healer relies on in SchedMD's slurm-operator, proven on the real operator (v1.1.0, and
v1.0.0 where it applies) with kwok Nodes, a real Slurm 26.05 (dynamic nodes, its real
slurmrestd) and the devstack's pod runtime (a real ``slurmd -Z`` per Running slurmd pod, with the
pod's preStop).

Measured on this machine (2 shared cores, 2026-11-25; printed as ``[measured]`` lines and in
the terminal summary "Slinky timings (real operator)"):

  NodeSet created -> 2 slurmd pods Running + SlurmNodeStateIdle:  v1.1.0 0.5-2.1 s,
                                                                  v1.0.0 2.7-5.4 s (13 s once)
  cordon (+ cordon-reason annotation) -> Slurm DRAIN:             v1.1.0 0.13-0.25 s, v1.0.0 1.1 s
  uncordon -> Slurm no longer drained (RollingUpdate):            v1.1.0 0.13-0.25 s, v1.0.0 1.0 s
  drained pod deleted -> recreated pod's slurmd registered IDLE:  v1.1.0 0.27-0.38 s, v1.0.0 2.2 s
  recreated pod seen Running -> its slurmd registered (runtime):  0.04-0.06 s
  DaemonSet: Node labelled to fit -> its slurmd pod idle:         v1.1.0 0.5-0.6 s
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from typing import Any

import pytest
from kubernetes_asyncio.client.exceptions import ApiException

from healer.adapters.slinky import pod_state
from healer.ports import SlurmNodeState
from healer_dev.devstack.podruntime import PRESTOP_REASON
from tests.integration.slinky.conftest import (
    OPERATOR,
    POD_CORDON,
    POD_PROTECT,
    Rig,
    annotations_of,
    host_of,
    labels_of,
    note,
    report,
    serving,
    since,
)
from tests.integration.slurm_fixtures import HOLD_SCRIPT, release
from tests.integration.waiting import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

BOTH = pytest.mark.parametrize("operator_version", ["v1.1.0", "v1.0.0"], indirect=True)
V1_1 = pytest.mark.parametrize("operator_version", ["v1.1.0"], indirect=True)
TOPOLOGY = "topology.slinky.slurm.net/spec"
SPEC = "default:spine1:leaf3"


def _drained(st: SlurmNodeState) -> bool:
    return st.drain


async def _two_workers(rig: Rig, *, spare: bool = False, **kw: Any
                       ) -> tuple[str, list[dict[str, Any]]]:
    """Nodes a, b (+ c) on the pool, a NodeSet of 2, both slurmd pods serving."""
    await rig.node("a")
    await rig.node("b")
    if spare:
        await rig.node("c")
    t0 = time.monotonic()
    name = await rig.nodeset("w", replicas=2, **kw)
    pods = await rig.wait_pods(2, within=60)
    report(f"NODESET_REGISTERED ({rig.version}) NodeSet created -> 2 pods idle in Slurm",
           since(t0))
    return name, sorted(pods, key=lambda p: str(p["metadata"]["name"]))


async def _pod_info(rig: Rig, name: str) -> dict[str, str]:
    """The PodInfo JSON the operator writes into the Slurm node's comment."""
    async def probe() -> dict[str, str] | None:
        m = re.search(r"\bComment=(\{[^}]*\})", await rig.slurm_show(name))
        return dict(json.loads(m.group(1))) if m else None

    got: dict[str, str] | None = await wait_for(probe, timeout=60, interval=0.2,
                                                description=f"the PodInfo comment of {name}")
    assert got is not None
    return got


@BOTH
async def test_pods_carry_slinky_identity_and_register(rig: Rig) -> None:
    ns, pods = await _two_workers(rig)
    for i, pod in enumerate(pods):
        meta = pod["metadata"]
        name = f"{ns}-{i}"
        assert meta["name"] == name
        labels = labels_of(pod)
        assert labels["app.kubernetes.io/name"] == "slurmd"
        assert labels["app.kubernetes.io/component"] == "worker"
        assert labels["app.kubernetes.io/instance"] == ns
        assert labels["nodeset.slinky.slurm.net/pod-name"] == name
        assert labels["nodeset.slinky.slurm.net/pod-hostname"] == name
        assert labels["nodeset.slinky.slurm.net/pod-index"] == str(i)
        assert pod["spec"]["hostname"] == name
        conds = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
        assert conds.get("SlurmNodeStateIdle") == "True", conds
        st = pod_state(pod)
        assert (st.name, st.base, st.registered, st.drain) == (name, "IDLE", True, False)
        slurm = await rig.slurm_state(name)
        assert slurm is not None
        assert slurm.registered
        assert slurm.base == "IDLE"
        # the operator ties the Slurm node to its pod through the node comment (PodInfo)
        # (a later step of the reconcile than the registration: waited for)
        info = await _pod_info(rig, name)
        assert (info["namespace"], info["podName"], info["node"]) == (
            rig.namespace, name, host_of(pod))
    assert len({host_of(p) for p in pods}) == 2  # 8 GPUs each: one slurmd per Node


@BOTH
async def test_cordon_drains_with_the_annotation_and_uncordon_undrains(rig: Rig) -> None:
    ns, pods = await _two_workers(rig)
    name, host = str(pods[0]["metadata"]["name"]), host_of(pods[0])
    reason = "healer: XID 79 on GPU 3 [inc-1]"
    t0 = time.monotonic()
    await rig.cordon(host, reason)
    st = await rig.wait_slurm(name, _drained, within=30, description=f"{name} DRAIN")
    report(f"CORDON_DRAIN ({rig.version}) cordon -> Slurm DRAIN", since(t0))
    assert st.reason == OPERATOR + reason
    pod = await rig.wait_pod(name, lambda p: pod_state(p).drain, within=60,
                             description=f"{name} pod conditions show Drain")
    assert annotations_of(pod).get(POD_CORDON) == "true"
    msgs = {c["type"]: c.get("message") for c in pod["status"]["conditions"]}
    assert msgs["SlurmNodeStateDrain"] == OPERATOR + reason  # the Slurm reason, raw
    other = await rig.slurm_state(str(pods[1]["metadata"]["name"]))
    assert other is not None
    assert not other.drain  # only the cordoned Node's slurmd
    t0 = time.monotonic()
    await rig.uncordon(host)
    await rig.wait_slurm(name, lambda s: not s.drain, within=60,
                         description=f"{name} undrained (RollingUpdate)")
    report(f"UNCORDON_UNDRAIN ({rig.version}) uncordon -> Slurm not drained", since(t0))
    pod = await rig.wait_pod(name, lambda p: serving(p) and POD_CORDON not in annotations_of(p),
                             within=60, description=f"{name} pod uncordoned and idle")
    assert ns in labels_of(pod)["app.kubernetes.io/instance"]


@V1_1
async def test_an_admin_drain_survives_a_cordon_uncordon_cycle(rig: Rig) -> None:
    _, pods = await _two_workers(rig)
    name, host = str(pods[0]["metadata"]["name"]), host_of(pods[0])
    other, other_host = str(pods[1]["metadata"]["name"]), host_of(pods[1])
    # the operator sees it on its re-list (up to 30 s): the pod conditions carry the reason
    await rig.admin_drain(name, "maint: x")
    # both Nodes cordoned together: one reconcile of the NodeSet handles both pods, so the
    # other pod's drain proves the operator has seen our cordon too
    await rig.cordon(host, "healer: XID 79 [inc-2]")
    await rig.cordon(other_host, "healer: control [inc-3]")
    await rig.wait_slurm(other, _drained, within=30, description=f"control {other} drained")
    st = await rig.slurm_state(name)
    assert st is not None
    assert (st.drain, st.reason) == (True, "maint: x")
    assert POD_CORDON not in annotations_of(await rig.pod(name))  # not its drain: untouched
    await rig.uncordon(host)
    await rig.uncordon(other_host)
    await rig.wait_slurm(other, lambda s: not s.drain, within=60,
                         description=f"control {other} undrained")
    st = await rig.slurm_state(name)
    assert st is not None
    assert (st.drain, st.reason) == (True, "maint: x")


@BOTH
async def test_a_busy_node_is_protected_and_its_eviction_answers_429(rig: Rig) -> None:
    _, pods = await _two_workers(rig)
    name = str(pods[0]["metadata"]["name"])
    job = await asyncio.to_thread(rig.stack.slurm.submit, HOLD_SCRIPT, name)
    try:
        await asyncio.to_thread(rig.stack.slurm.wait_job, job, ["RUNNING"], 30)
        pod = await rig.wait_pod(name, lambda p: labels_of(p).get(POD_PROTECT) == "true",
                                 within=90, description=f"{name} pod-protect")
        body: Any = {"apiVersion": "policy/v1", "kind": "Eviction",
                     "metadata": {"name": name, "namespace": rig.namespace}}
        with pytest.raises(ApiException) as e:
            await rig.core.create_namespaced_pod_eviction(name, rig.namespace, body)
        assert e.value.status == 429, e.value
        assert (await rig.pod(name))["metadata"]["uid"] == pod["metadata"]["uid"]
        assert await asyncio.to_thread(rig.stack.slurm.job_state, job) == "RUNNING"
    finally:
        release(rig.stack.slurm, job)
    await asyncio.to_thread(rig.stack.slurm.wait_job, job, ["COMPLETED"], 60)
    await rig.wait_pod(name, lambda p: labels_of(p).get(POD_PROTECT) != "true", within=90,
                       description=f"{name} unprotected once idle")


@BOTH
async def test_a_deleted_drained_pod_runs_prestop_and_registers_again_elsewhere(
        rig: Rig) -> None:
    _, pods = await _two_workers(rig, spare=True)
    name, host = str(pods[0]["metadata"]["name"]), host_of(pods[0])
    old_uid = pods[0]["metadata"]["uid"]
    used = {host_of(p) for p in pods}
    free = [n for n in rig.nodes if n not in used]
    assert len(free) == 1
    await rig.cordon(host, "healer: XID 79 [inc-4]")
    await rig.wait_slurm(name, _drained, within=30)
    seen: list[tuple[str, str]] = []
    stop = asyncio.Event()

    async def watch_slurm() -> None:  # what Slurm shows while the preStop runs
        while not stop.is_set():
            st = await rig.slurm_state(name)
            seen.append(("absent", "") if st is None else
                        ("+".join([st.base, *sorted(st.flags)]), st.reason))
            await asyncio.sleep(0.02)

    watcher = asyncio.create_task(watch_slurm())
    try:
        mark = len(await asyncio.to_thread(rig.stack.slurm.log))
        t0 = time.monotonic()
        await rig.core.delete_namespaced_pod(name, rig.namespace)
        pod = await rig.wait_pod(name, lambda p: p["metadata"]["uid"] != old_uid, within=60,
                                 description=f"{name} recreated")
        assert host_of(pod) in ("", free[0])
        await rig.wait_slurm(name, lambda s: s.registered and s.base == "IDLE", within=60,
                             description=f"{name} registered again")
        report(f"DELETE_REGISTERED ({rig.version}) pod deleted -> recreated slurmd registered",
               since(t0))
    finally:
        stop.set()
        await watcher
    pod = await rig.wait_pod(name, serving, within=90, description=f"{name} serving again")
    assert host_of(pod) == free[0]  # the only uncordoned Node with free GPUs
    runtime = rig.stack.runtime
    assert runtime is not None
    new_key = f"{rig.namespace}/{name}"

    def recorded() -> tuple[list[Any], list[float], list[float]] | None:
        """The runtime's records once it has noted the new pod running and its slurmd
        registered: it notes the registration when its own wait for it returns, which can be
        after Slurm (and the operator's conditions) already show it."""
        hist = runtime.events(slurm_name=name)
        running = [h.time for h in hist if h.event == "seen-running" and h.node == free[0]
                   and h.pod == new_key]
        registered = [h.time for h in hist if h.event == "registered" and h.node == free[0]]
        return (hist, running, registered) if running and registered else None

    hist, running, registered = await wait_for(
        recorded, timeout=60, description=f"the pod runtime's records of {new_key}")
    report(f"RECREATED_REGISTERED ({rig.version}) recreated pod Running -> slurmd registered",
           registered[-1] - running[-1])
    events = [h.event for h in hist]
    i = events.index("prestop")
    assert "prestop-failed" not in events
    assert events.index("stopped", i) < events.index("registered", i)
    # the preStop: DOWN "Pod is terminating" (slurmctld's log: too quick to poll), then
    # `scontrol delete`: the record was gone before the new slurmd registered
    ctld = (await asyncio.to_thread(rig.stack.slurm.log))[mark:]
    assert f"update_node: node {name} reason set to: {PRESTOP_REASON}" in ctld
    assert f"update_node: node {name} state set to DOWN" in ctld
    assert ("absent", "") in seen
    note(f"[observed {rig.version}] Slurm states of {name} around the delete: "
         f"{list(dict.fromkeys(seen))}")
    st = await rig.slurm_state(name)
    assert st is not None
    assert not st.drain  # a new record, on an uncordoned Node


@BOTH
async def test_topology_spec_is_copied_to_the_pod_at_binding_from_v1_1(rig: Rig) -> None:
    await rig.node("a", annotations={TOPOLOGY: SPEC})
    await rig.nodeset("t", replicas=1)
    [pod] = await rig.wait_pods(1)
    got = annotations_of(pod).get(TOPOLOGY)
    if rig.v1_1:
        assert got == SPEC
    else:
        assert got is None


@V1_1
async def test_on_delete_an_uncordoned_node_stays_drained(rig: Rig) -> None:
    _, pods = await _two_workers(rig, update_strategy={"type": "OnDelete"})
    name, host = str(pods[0]["metadata"]["name"]), host_of(pods[0])
    await rig.cordon(host, "healer: XID 79 [inc-5]")
    await rig.wait_slurm(name, _drained, within=30)
    await rig.wait_pod(name, lambda p: annotations_of(p).get(POD_CORDON) == "true", within=60)
    await rig.uncordon(host)
    # OnDelete: splitUpdatePods keeps no pod, so the pod stays cordoned and the operator
    # drains it again with its own reason "Pod (<ns>/<pod>) was cordoned"
    want = f"{OPERATOR}Pod ({rig.namespace}/{name}) was cordoned"

    async def rewritten() -> SlurmNodeState | None:
        st = await rig.slurm_state(name)
        return st if st is not None and st.drain and st.reason == want else None

    try:
        st: SlurmNodeState | None = await wait_for(
            rewritten, timeout=60, description=f"{name} reason rewritten")
    except TimeoutError:
        st = await rig.slurm_state(name)
        assert st is not None
        pytest.fail(f"after the uncordon (OnDelete) Slurm shows {st.base} {sorted(st.flags)} "
                    f"reason {st.reason!r}")
    assert st is not None
    assert st.drain
    pod = await rig.pod(name)
    assert annotations_of(pod).get(POD_CORDON) == "true"


@V1_1
async def test_daemonset_mode_one_pod_per_fitting_node_named_after_it(rig: Rig) -> None:
    a = await rig.node("a", dotted=True)
    b = await rig.node("b", dotted=True)
    c = await rig.node("c", dotted=True, pool=False)
    await rig.nodeset("d", mode="DaemonSet")
    pods = await rig.wait_pods(2)
    by_host = {host_of(p): p for p in pods}
    assert set(by_host) == {a, b}
    for host, pod in by_host.items():
        short = host.split(".", 1)[0]  # getDaemonSetPodHostname: the Node name up to a dot
        assert pod["spec"]["hostname"] == short
        assert labels_of(pod)["nodeset.slinky.slurm.net/pod-hostname"] == short
        assert pod_state(pod).name == short
        st = await rig.slurm_state(short)
        assert st is not None
        assert st.registered
    t0 = time.monotonic()
    await rig.patch_node(c, {"metadata": {"labels": rig.pool}})
    pods = await rig.wait_pods(3, within=90)
    report("DAEMONSET_NEW_NODE (v1.1.0) Node labelled -> its slurmd pod idle", since(t0))
    assert {host_of(p) for p in pods} == {a, b, c}
    await rig.wait_slurm(c.split(".", 1)[0], lambda s: s.registered and s.base == "IDLE")

