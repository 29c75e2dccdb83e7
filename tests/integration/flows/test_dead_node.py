"""A node that dies outright, on the real stack (issue 20 item 6): kwok stops heartbeating its
Node (the real kube-controller-manager's node lifecycle controller marks it Ready=Unknown and
taints it unreachable), the pod runtime stops acting for its pods as a dead kubelet would (no
preStop, its finalizer held, its slurmd killed with its job, or frozen), and Slurm flags it
NOT_RESPONDING, then DOWN, after SlurmdTimeout.

* ``test_dead_node_is_fenced_then_replaced`` (each fencing provider; StatefulSet and DaemonSet
  on operator v1.1.0, the StatefulSet swap on v1.0.0 too): Dead → fenced → OutOfService (the
  out-of-service taint, healer's) → the real controller-manager's taint eviction and pod
  garbage collector remove the slurmd pod (healer deletes and evicts nothing) → the real
  operator recreates it on the spare (StatefulSet) or starts one there (DaemonSet) → the same
  Slurm node serves (StatefulSet), undrained, topology set; the job is reported lost; nobody's
  taint but healer's own is touched.
* ``test_partitioned_alive_node_is_held_never_deleted``: heartbeat stopped, slurmd frozen, no
  fence: HeldForFencing, no pod deleted, no out-of-service taint, the Slurm node still
  registered; when it answers again it goes back to the graceful flow (Recovered).
* ``test_half_a_domain_dying_is_not_a_node_fault``: half of an NVLink domain dies at once:
  nothing fenced, the breaker's reason said, and it closes when they answer again.
* ``test_leader_failover_mid_fencing_sends_one_fence_call``: the fencing webhook is called
  once per incident, even when the leader dies while waiting for its acknowledgement.
"""

from __future__ import annotations

import asyncio
import base64
import json
import secrets
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from kubernetes_asyncio import client

from healer.adapters.hooks import sign, verify
from healer.adapters.slurm.parse import parse_kv_line
from healer.obs.http import serve
from healer_dev.devstack.kube import KubeStack
from tests.builders import policy_steps, policy_yaml
from tests.integration.flows.checks import print_timeline
from tests.integration.flows.conftest import JOB, TEST_LABEL, TOPOLOGY, Flow, FlowFactory
from tests.integration.waiting import wait_for

OOS = "node.kubernetes.io/out-of-service"
UNREACHABLE = "node.kubernetes.io/unreachable"
SHUTDOWN = "node.cloudprovider.kubernetes.io/shutdown"
#: kube-controller-manager's --node-monitor-grace-period here: kwok renews the session stack's
#: Leases every ~10 s, so this leaves room for two missed renewals on a loaded machine
NODE_GRACE = 30.0



@pytest.fixture(scope="module", autouse=True)
def short_node_grace(kube_stack: KubeStack) -> Iterator[None]:
    """The node lifecycle controller marks a silent Node Unknown after NODE_GRACE (its
    default, 50 s, again afterwards)."""
    kube_stack.set_node_grace(NODE_GRACE)
    try:
        yield
    finally:
        kube_stack.set_node_grace(None)


def write_policy(f: Flow, providers: list[str], *, deadline: str = "10m",
                 webhook: dict[str, Any] | None = None) -> None:
    """Dead after 5 s of NotReady and Slurm's NOT_RESPONDING, fenced by ``providers`` (with
    the webhook's ``url`` and ``secretRef`` when one is a webhook) within ``deadline``; the
    mass-death breaker at half the fleet or a quarter of a domain within 2 minutes."""
    fencing: dict[str, Any] = {"providers": providers, "deadline": deadline, **(webhook or {})}
    (f.policies / "policy.yaml").write_text(policy_yaml(
        f.tid, name=f"dead-{f.tid}", label=TEST_LABEL,
        deadNode={"deadAfter": "5s", "signals": ["notReady", "slurmNotResponding"],
                  "fencing": fencing,
                  "massDeath": {"window": "2m", "maxShare": "50%", "maxSharePerDomain": "25%"}},
        steps=policy_steps(swap=True, repair_hook="none")))


@dataclass
class Fencer:
    """A fencing webhook receiver: checks healer's signature, records every call, and (when
    ``ack``) answers ``fenced`` through healer's ack endpoint, signed with the same key."""

    key: bytes
    ack: bool = True
    ack_url: str = ""
    calls: list[dict[str, Any]] = field(default_factory=list)
    bad: list[str] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        if not verify(self.key, body, request.headers.get("X-Healer-Signature", "")):
            self.bad.append("signature")
            return web.Response(status=403)
        msg = json.loads(body)
        self.calls.append({"body": msg, "event": request.headers.get("X-Healer-Event"),
                           "key": request.headers.get("Idempotency-Key")})
        if self.ack:
            asyncio.get_running_loop().create_task(self.send_ack(msg["incident"], msg["node"]))
        return web.json_response({"status": "pending"})

    async def send_ack(self, incident: str, node: str) -> int:
        raw = json.dumps({"incident": incident, "node": node, "kind": "fenced",
                          "timestamp": time.time(), "nonce": secrets.token_hex(16)}).encode()
        async with aiohttp.ClientSession() as s, s.post(self.ack_url, data=raw, headers={
                "Content-Type": "application/json",
                "X-Healer-Signature": sign(self.key, raw)}) as r:
            return r.status


@pytest.fixture
async def fencer() -> AsyncIterator[Fencer]:
    f = Fencer(secrets.token_hex(24).encode())
    app = web.Application()
    app.router.add_post("/fence", f.handle)
    runner = await serve(app, "127.0.0.1", 0)
    f.url = f"http://127.0.0.1:{runner.addresses[0][1]}/fence"
    try:
        yield f
    finally:
        await runner.cleanup()


async def webhook_policy(f: Flow, fencer: Fencer) -> dict[str, Any]:
    await f.core.create_namespaced_secret(f.namespace, {  # type: ignore[arg-type]
        "metadata": {"name": "fence-hmac"},
        "data": {"hmac": base64.b64encode(fencer.key).decode()}})  # text, as kubectl makes it
    return {"url": fencer.url, "allowInsecureHttp": True,
            "secretRef": f"{f.namespace}/fence-hmac"}


def start(f: Flow) -> Any:
    return f.start_daemon("--slurm-state-interval", "2")


async def kill(f: Flow, node: str, slurmd: str = "kill") -> list[str]:
    return await asyncio.to_thread(f.sstack.kill_node, node, slurmd=slurmd)


async def revive(f: Flow, node: str) -> None:
    await asyncio.to_thread(f.sstack.revive_node, node)


async def submit(f: Flow, slurm_node: str) -> int:
    """A job on ``slurm_node`` that Slurm may not requeue: when the node dies it ends
    NODE_FAIL (a requeued one would be pending again, with no node)."""
    job = await asyncio.to_thread(f.slurm.submit, JOB.format(exit_on_usr1=0), slurm_node,
                                  name=f"train-{f.tid}", args=("--no-requeue",))
    await asyncio.to_thread(f.slurm.wait_job, job, ("RUNNING",), 60)
    return job


async def node_obj(f: Flow, name: str) -> Any:
    return await f.core.read_node(name)


def taint_keys(node: Any) -> set[str]:
    return {t.key for t in node.spec.taints or []}


async def fence(f: Flow, provider: str, node: str) -> None:
    """What each provider does once the machine is off (the webhook's receiver acks itself)."""
    if provider == "manual":
        await f.core.patch_node(node, {"metadata": {"annotations": {
            "healer.io/fenced": "ops@example: power supply dead, unplugged"}}})
    elif provider == "cloudShutdown":
        n = await node_obj(f, node)
        taints = [{"key": t.key, "value": t.value or "", "effect": t.effect}
                  for t in n.spec.taints or []]
        taints.append({"key": SHUTDOWN, "effect": "NoSchedule"})
        await f.core.patch_node(node, {"metadata": {"resourceVersion": n.metadata.resource_version},
                                       "spec": {"taints": taints}})
    elif provider == "nodeDeleted":
        await f.core.delete_node(node)


CASES = [
    pytest.param("StatefulSet", "manual", "v1.1.0", id="StatefulSet-manual"),
    pytest.param("DaemonSet", "cloudShutdown", "v1.1.0", id="DaemonSet-cloudShutdown"),
    pytest.param("StatefulSet", "webhook", "v1.1.0", id="StatefulSet-webhook"),
    pytest.param("DaemonSet", "nodeDeleted", "v1.1.0", id="DaemonSet-nodeDeleted"),
    pytest.param("StatefulSet", "manual", "v1.0.0", id="StatefulSet-manual-v1.0.0"),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize(("mode", "provider", "operator_version"), CASES,
                         indirect=["operator_version"])
async def test_dead_node_is_fenced_then_replaced(flows: FlowFactory, fencer: Fencer, mode: str,
                                                 provider: str, operator_version: str) -> None:
    f = await flows(mode, "slinky")
    lay = f.lay
    bad = lay.gpus[1]  # nvl-a
    sn = await f.slurm_name_on(bad)
    hook: dict[str, Any] | None = None
    if provider == "webhook":
        hook = await webhook_policy(f, fencer)
    write_policy(f, [provider] if provider != "webhook" else ["webhook", "manual"],
                 webhook=hook)
    d = start(f)
    await f.ready(d)
    fencer.ack_url = f"http://127.0.0.1:{d.port}/v1/hooks/ack"
    job = await submit(f, sn)
    t0 = time.time()
    assert await kill(f, bad) == [sn]

    # dead: Kubernetes and Slurm agree, healer says so and waits for a fence
    rec = await f.wait_phase(bad, "Dead", "OutOfService", "Swapping", within=180)
    t_dead = time.time()
    death = rec["status"]["death"]
    assert any("Ready=Unknown" in w for w in death["witnesses"]), death
    assert any("NOT_RESPONDING" in w for w in death["witnesses"]), death
    if provider != "webhook":
        assert rec["status"]["phase"] == "Dead"
        assert OOS not in taint_keys(await node_obj(f, bad))  # nothing before the fence
        pod = await f.pod_of(sn) if mode == "StatefulSet" else None
        assert mode != "StatefulSet" or pod is not None
        await fence(f, provider, bad)
    rec = await f.wait_phase(bad, "Repair", within=300, also=f.step_done(bad, "mark-repair")) \
        if provider != "nodeDeleted" else await f.wait_phase(bad, "Done", within=300)
    t_end = time.time()
    print_timeline(f"dead/{mode}/{provider}/{operator_version}", rec, t0)
    st = rec["status"]
    assert st["death"]["provider"] == provider
    assert str(job) in st["death"].get("lostJobs", ""), st["death"]
    phases = [h["to"] for h in st["history"]]
    assert phases[phases.index("Dead") + 1] == "OutOfService", phases
    assert not {"Draining", "Checkpointing"} & set(phases), phases
    steps = [s["step"] for s in st["ledger"]]
    assert not {"drain", "checkpoint"} & set(steps), steps
    assert st["spare"] == lay.spare_a

    # the replacement serves: the same Slurm node (StatefulSet) or the spare's, undrained
    new_sn = sn if mode == "StatefulSet" else lay.spare_a
    pod = await f.pod_of(new_sn)
    assert pod is not None
    assert pod["spec"]["nodeName"] == lay.spare_a
    await f.wait_slurm(new_sn, lambda s: s.base == "IDLE" and s.registered and not s.drain,
                       what="idle, registered and undrained")
    # slurmctld reaches the replacement: the dead pod's record (its address) was deleted
    # before the recreated pod registered under the same name
    assert f.sstack.runtime is not None
    r = await asyncio.to_thread(f.slurm.run, ["scontrol", "show", "node", new_sn, "-o"])
    assert parse_kv_line(r.stdout.strip())["NodeAddr"] == f.sstack.runtime.addresses[new_sn]
    spare = await node_obj(f, lay.spare_a)
    assert spare.metadata.annotations.get(TOPOLOGY) == "default:nvl-a"
    if provider != "nodeDeleted":
        n = await node_obj(f, bad)
        taints = taint_keys(n)
        assert {OOS, UNREACHABLE} <= taints, taints  # ours, and the node lifecycle's
        assert n.metadata.annotations.get("healer.io/out-of-service") == \
            rec["spec"]["incident"]["id"]
        assert n.spec.unschedulable
    else:
        with pytest.raises(client.exceptions.ApiException) as gone:
            await f.core.read_node(bad)
        assert gone.value.status == 404
    if provider == "webhook":
        assert len(fencer.calls) == 1, fencer.calls
        assert fencer.calls[0]["event"] == "fence"
        assert fencer.calls[0]["key"] == f"{rec['spec']['incident']['id']}/fence"
        assert not fencer.bad
    print(f"heartbeat lost → dead {t_dead - t0:.1f}s, → replacement serving "
          f"{t_end - t0:.1f}s")


async def slurm_record(f: Flow, name: str) -> Any:
    return await f.slurm_state(name)


@pytest.mark.timeout(480)
@pytest.mark.parametrize("mode", ["StatefulSet", "DaemonSet"])
async def test_partitioned_alive_node_is_held_never_deleted(flows: FlowFactory,
                                                            mode: str) -> None:
    """Heartbeat stopped, slurmd frozen (SIGSTOP: cut off, still alive), no provider says it
    is off: HeldForFencing; nothing irreversible; back to normal when it answers again."""
    f = await flows(mode, "slinky")
    bad = f.lay.gpus[1]
    sn = await f.slurm_name_on(bad)
    write_policy(f, ["manual"], deadline="10s")
    d = start(f)
    await f.ready(d)
    before = await f.pod_of(sn)
    assert before is not None
    assert await kill(f, bad, "freeze") == [sn]
    rec = await f.wait_phase(bad, "HeldForFencing", within=240)
    st = rec["status"]

    # held: no spare claimed, no cordon, no out-of-service taint, no pod force-deleted
    steps = {s["step"] for s in st["ledger"]}
    assert not {"claim-spare", "cordon", "out-of-service", "move-workload"} & steps, steps
    assert st["spare"] == ""
    n = await node_obj(f, bad)
    assert OOS not in taint_keys(n)
    assert not n.spec.unschedulable
    assert f.sstack.runtime is not None
    assert not f.sstack.runtime.events("force-deleted", sn), "a pod was force-deleted"
    same = await f.core.list_namespaced_pod(f.namespace, field_selector=(
        f"metadata.name={before['metadata']['name']}"))
    assert [p.metadata.uid for p in same.items] == [before["metadata"]["uid"]]  # still there
    # the frozen slurmd is still Slurm's node: its record was never deleted (no preStop ran)
    rec_slurm = await slurm_record(f, sn)
    assert rec_slurm is not None, f"Slurm node {sn} was deleted"
    assert "NOT_RESPONDING" in rec_slurm.flags
    assert await d.metric("healer_held_for_fencing") == 1
    reasons = await f.event_reasons(bad)
    assert reasons["HeldForFencing"] == 1, reasons

    # it answers again before anyone fenced it: back to the graceful flow (Failed, waiting for
    # a confirmed verdict while Slurm hears it again), then Recovered: nothing to undo
    await revive(f, bad)
    rec = await f.wait_phase(bad, "Done", within=240)
    phases = [h["to"] for h in rec["status"]["history"]]
    assert phases[-2:] == ["Recovered", "Done"], phases
    assert "HeldForFencing" in phases
    assert not {"drain", "cordon", "claim-spare"} & {s["step"] for s in rec["status"]["ledger"]}
    assert await d.metric("healer_held_for_fencing") == 0
    await f.wait_slurm(sn if mode == "StatefulSet" else bad,
                       lambda s: s.registered and not s.drain and s.base == "IDLE",
                       within=120, what="idle again")


@pytest.mark.timeout(600)
@pytest.mark.parametrize("mode", ["StatefulSet", "DaemonSet"])
async def test_half_a_domain_dying_is_not_a_node_fault(flows: FlowFactory, mode: str) -> None:
    """Half of NVLink domain nvl-a (2 of its 4 nodes) goes dark at once, both already
    annotated fenced: nothing is fenced, claimed or tainted; the breaker says why; as they
    answer again one after the other the last one is not fenced either; it closes a window
    after they answer again."""
    f = await flows(mode, "slinky")
    extra = [f"f{f.tid}-x{i}" for i in (4, 5)]  # nvl-a's other two nodes (no slurmd)
    for name in extra:
        await f.create_node(name, "nvl-a", "leaf-1", spare=False, pool=False)
    dying = f.lay.gpus[:2]
    for n in dying:  # if anything were admitted, the manual provider would fence at once
        await f.core.patch_node(n, {"metadata": {"annotations": {
            "healer.io/fenced": "pre-approved: would fence at once"}}})
    write_policy(f, ["manual"])
    d = start(f)
    await f.ready(d)
    scope = f"dead-{f.tid}"
    assert await d.metric("healer_mass_death_tripped", scope=scope) == 0
    for n in dying:
        await kill(f, n, "freeze")

    async def blocked() -> bool:
        recs = [await f.record(n) for n in dying if await f.remediations(n)]
        return len(recs) == 2 and all(
            (r["status"].get("blocked") or {}).get("guardrail") == "mass-death"
            for r in recs)

    await wait_for(blocked, timeout=240, description="both dead nodes blocked by mass-death")
    for n in dying:
        st = (await f.record(n))["status"]
        assert st["phase"] == "Dead"
        assert "suspect the control plane or the network, not the nodes" in \
            st["blocked"]["message"], st["blocked"]
        assert "fence" not in {s["step"] for s in st["ledger"]}
        node = await node_obj(f, n)
        assert OOS not in taint_keys(node)
        assert not node.spec.unschedulable
    assert await d.metric("healer_mass_death_tripped", scope=scope) == 1
    assert f.sstack.runtime is not None
    assert not [e for e in f.sstack.runtime.events("force-deleted")
                if e.pod.startswith(f"{f.namespace}/")]

    for n in dying:
        await revive(f, n)
    for n in dying:
        rec = await f.wait_phase(n, "Done", within=240)
        assert "fence" not in {s["step"] for s in rec["status"]["ledger"]}, \
            (rec["status"]["ledger"], rec["status"]["history"])

    async def closed() -> bool:
        return await d.metric("healer_mass_death_tripped", scope=scope) == 0

    # one massDeath.window (2m) after they answered again
    await wait_for(closed, timeout=240, description="the mass-death breaker closed")


@pytest.mark.timeout(480)
@pytest.mark.parametrize("mode", ["StatefulSet", "DaemonSet"])
async def test_leader_failover_mid_fencing_sends_one_fence_call(flows: FlowFactory,
                                                                fencer: Fencer,
                                                                mode: str) -> None:
    """The leader sends the fencing webhook and dies waiting for its acknowledgement; the
    next leader resumes the fence step and does not send it again."""
    f = await flows(mode, "slinky")
    bad = f.lay.gpus[1]
    fencer.ack = False
    hook = await webhook_policy(f, fencer)
    write_policy(f, ["webhook"], webhook=hook)
    a = f.start_daemon("--slurm-state-interval", "2", leader_election=True)
    await f.ready(a)
    await kill(f, bad)

    async def requested() -> bool:
        n = await node_obj(f, bad)
        return bool((n.metadata.annotations or {}).get("healer.io/fence-requested"))

    await wait_for(requested, timeout=240, description="the fencing webhook sent")
    assert len(fencer.calls) == 1
    incident = fencer.calls[0]["body"]["incident"]
    a.kill9()
    b = f.start_daemon("--slurm-state-interval", "2", leader_election=True)
    await f.ready(b)

    async def leading() -> bool:
        return await b.metric("healer_leader") == 1

    await wait_for(leading, timeout=60, description="the second daemon leads")
    # it resumed the fence step (re-issued, polled) without sending the webhook again
    rec = await f.wait_phase(bad, "Dead", within=60)
    assert rec["spec"]["incident"]["id"] == incident
    fencer.ack_url = f"http://127.0.0.1:{b.port}/v1/hooks/ack"
    assert await fencer.send_ack(incident, bad) == 200
    await f.wait_phase(bad, "Repair", within=300, also=f.step_done(bad, "mark-repair"))
    assert len(fencer.calls) == 1, fencer.calls
    assert fencer.calls[0]["key"] == f"{incident}/fence"
