"""``make demo`` (``python -m healer_dev demo``): the whole story on the local real stack, with
SchedMD's real slurm-operator.

Starts, on loopback (:class:`healer_dev.demo_world.DemoStack`): kube-apiserver + etcd +
kube-controller-manager + kube-scheduler + kwok (fake GPU Nodes that look alive), a real Slurm
26.05 from Debian (slurmctld; slurmds register as dynamic nodes), SchedMD's slurm-operator (its
manager, and from v1.1 its pod-binding webhook, built from the Go module proxy and run out of
cluster) talking to that Slurm's real slurmrestd, the kwok pod runtime that runs a real
``slurmd -Z`` for every Running slurmd pod, the DCGM exporter simulator scraped by a real
Prometheus, and healer itself (``healer.app.run``, the same code as ``healer run``, slinky driver
with slurmrestd as its job backend) with the shipped default policies switched to ``mode: act``.

The fleet: 8 GPU nodes in two NVLink domains (node-00..03 in nvl-a, node-04..07 in nvl-b) and
two warm spares (spare-a in nvl-a, spare-b in nvl-b); a NodeSet ``gpu`` (8 replicas, 8 GPUs per
slurmd) whose pods, hence Slurm nodes, are gpu-0..gpu-7, one per GPU node. Scenarios:

* ``xid79`` (``make demo``): a job runs on node-02 when its GPU 3 reports XID 79 (fell off the
  bus). healer drains the Slurm node (no checkpoint: the GPU is gone), waits until Slurm reports
  it drained, cordons node-02, claims spare-a (same NVLink domain), moves the slurmd pod there
  (the operator recreates it, the scheduler binds it to the spare, its slurmd registers again),
  annotates topology, undrains, and hands node-02 to repair.
* ``storm``: five nodes report fatal XIDs within seconds; the breaker and the concurrency limit
  let one remediation through and hold the rest (reported, not touched).
* ``degrading``: single-bit ECC errors climb on node-05 while a checkpointable job runs there;
  healer signals USR1, the job writes its checkpoint and exits, then the flow replaces the node.
* ``fabric``: HCA port mlx5_1/1 of node-06 goes down (node-exporter's infiniband series, served
  by the same simulated exporters) while a job runs there; with
  ``policies/examples/infiniband.yaml`` also in act, healer replaces the node like a failed GPU
  and the NodeRemediation names the port.
* ``slurm``: Slurm itself takes node-01 out: its HealthCheckProgram (NHC) drains Slurm node
  gpu-1 with an ``NHC: ...`` reason. With ``policies/examples/slurm-detector.yaml`` also in act,
  the Slurm feed turns that into an incident carrying NHC's reason; healer cordons and claims a
  spare but never touches the drain, so the swap holds and says why (moving the slurmd pod would
  delete NHC's drain, docs/adr/0006); once the owner clears it, the swap goes on.
* ``dead-node``: node-02 dies outright while a job runs on it (kwok stops heartbeating it, its
  slurmd and the job are killed, nothing runs the pod's preStop). The real node lifecycle
  controller marks it Ready=Unknown (grace period 10 s here), Slurm flags it NOT_RESPONDING
  (SlurmdTimeout 10 s), healer declares it dead (deadAfter 5 s here) and waits for a fence; the
  demo fences it as an admin would (``healer.io/fenced``); healer cordons it, claims spare-a,
  taints it out of service, kube-controller-manager's pod garbage collector removes the slurmd
  pod, the operator recreates it on spare-a and the same Slurm node serves again.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from healer.adapters.slinky import pod_state, slurm_name
from healer.errors import ConfigError
from healer_dev.demo_world import (
    DEAD_NODE_GRACE,
    SLURM,
    DemoStack,
    act_policies,
    dead_node,
)
from healer_dev.devstack.operator import DEFAULT_VERSION, SUPPORTED_VERSIONS
from healer_dev.sim.infiniband import IbFault, IbFaultKind

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ("xid79", "storm", "degrading", "fabric", "slurm", "dead-node")
#: the reason NHC (Slurm's usual HealthCheckProgram) writes when it drains a node
NHC_REASON = "NHC: GPU 2 ECC double bit errors (check_nv_healthmon)"


@dataclass
class Timeline:
    out: Callable[[str], None]
    start: float = field(default_factory=time.monotonic)
    seen: dict[str, int] = field(default_factory=dict)
    last: dict[str, float] = field(default_factory=dict)

    def say(self, text: str) -> None:
        self.out(f"[{time.monotonic() - self.start:6.1f}s] {text}")

    def remediations(self, items: list[dict[str, Any]]) -> None:
        for item in sorted(items, key=lambda i: i["metadata"]["name"]):
            st = item.get("status") or {}
            node = item["spec"]["node"]
            hist = st.get("history") or []
            n = self.seen.get(item["metadata"]["name"], 0)
            for h in hist[n:]:
                prev = self.last.get(node)
                took = f" (after {h['at'] - prev:.1f}s)" if prev is not None else ""
                self.last[node] = h["at"]
                trig = h["trigger"]
                self.say(f"{node}: {h['from']} → {h['to']}  [{trig}]{took}")
            if len(hist) > n:
                blocked = st.get("blocked")
                if blocked:
                    self.say(f"{node}: held by {blocked['guardrail']}: {blocked['message']}")
            self.seen[item["metadata"]["name"]] = len(hist)


def _phase(items: list[dict[str, Any]], node: str) -> str:
    """The phase of ``node``'s latest remediation in ``items`` ("" if none)."""
    mine = [i for i in items if i["spec"]["node"] == node]
    return str((mine[-1].get("status") or {}).get("phase", "")) if mine else ""


def _replaced(s: DemoStack, tl: Timeline, bad: str,
              sn: str) -> Callable[[], Awaitable[bool]]:
    """A predicate: ``bad``'s remediation is in Repair and Slurm node ``sn`` serves, undrained,
    from another Node (the slurmd pod's mirror of Slurm)."""
    async def done() -> bool:
        items = await s.remediations()
        tl.remediations(items)
        if _phase(items, bad) != "Repair":
            return False
        pod = {slurm_name(p): p for p in await s.pods()}.get(sn)
        st = pod_state(pod) if pod else None
        return bool(pod and st and pod["spec"].get("nodeName") != bad and not st.drain)

    return done


async def _scenario_xid79(s: DemoStack, tl: Timeline) -> bool:
    assert s.slurm is not None
    assert s.sim is not None
    bad = "node-02"
    sn, job = await s.run_job(bad, ticks=100, name="train")
    tl.say(f"job {job} running on Slurm node {sn} (on {bad}); it ends in ~20s")
    s.sim.xid(bad, 3, 79)
    tl.say(f"inject: XID 79 (GPU fell off the bus) on {bad} GPU 3")

    async def done() -> bool:
        items = await s.remediations()
        tl.remediations(items)
        if _phase(items, bad) != "Repair":
            return False
        pods = {slurm_name(p): p for p in await s.pods()}
        pod = pods.get(sn)
        st = pod_state(pod) if pod else None
        if not (pod and st and pod["spec"].get("nodeName") != bad and st.base == "IDLE"
                and not st.drain):
            return False
        real = await s.slurm_state(sn)  # Slurm itself, not the operator's copy on the pod
        return bool(real and real.base == "IDLE" and not real.drain and real.registered)

    await s.wait(done, 240, f"{bad} replaced and {sn} idle and undrained")
    items = [i for i in await s.remediations() if i["spec"]["node"] == bad]
    st = items[-1]["status"]
    pod = {slurm_name(p): p for p in await s.pods()}[sn]
    tl.say(f"Slurm node {sn} now runs on {pod['spec']['nodeName']} (spare {st['spare']}, "
           f"same NVLink domain), idle and undrained; {bad} handed to repair")
    real = await s.slurm_state(sn)
    tl.say(f"scontrol show node {sn}: {real.base if real else '?'}"
           f"{'+' + '+'.join(sorted(real.flags)) if real and real.flags else ''}, "
           f"slurmd -Z on pod IP {s.slurm.dynamic_nodes.get(sn, '?')}; pod "
           f"{pod['metadata']['name']} recreated by the slurm-operator, bound to "
           f"{pod['spec']['nodeName']}")
    tl.say(f"job {job}: {await asyncio.to_thread(s.slurm.job_state, job) or 'finished'} "
           "(it ran to completion: nothing was evicted while it ran)")
    for step in st["ledger"]:
        dur = (step.get("finishedAt") or 0) - step["startedAt"]
        tl.say(f"  step {step['step']:<18} {dur:6.1f}s  {step.get('detail', '')}")
    return True


async def _scenario_storm(s: DemoStack, tl: Timeline) -> bool:
    assert s.sim is not None
    bad = ["node-00", "node-01", "node-04", "node-05", "node-06"]
    for i, n in enumerate(bad):
        s.sim.xid(n, i, 48)
    tl.say(f"inject: XID 48 (double-bit ECC) on {len(bad)} nodes within a second: "
           "a storm is likelier a detector or driver problem than five dead GPUs")

    async def settled() -> bool:
        items = await s.remediations()
        tl.remediations(items)
        phases = {i["spec"]["node"]: (i.get("status") or {}).get("phase") for i in items}
        held = [n for n, p in phases.items() if p in ("Failed", "Degrading")]
        replaced = [n for n, p in phases.items() if p == "Repair"]
        return len(phases) == len(bad) and len(held) >= 3 and len(replaced) >= 1

    await s.wait(settled, 180, "the storm to be held by the guardrails while one node is "
                               "replaced")
    tl.say("where the storm stands: one node replaced from a warm spare, the rest reported "
           "and untouched until the breaker closes or an operator acts")
    for item in await s.remediations():
        st = item.get("status") or {}
        tl.say(f"  {item['spec']['node']}: {st.get('phase')}"
               + (f", held by {st['blocked']['guardrail']}" if st.get("blocked") else "")
               + (f", replaced by {st['spare']}" if st.get("spare") else ""))
    return True


async def _scenario_degrading(s: DemoStack, tl: Timeline) -> bool:
    assert s.slurm is not None
    assert s.sim is not None
    bad = "node-05"
    sn, job = await s.run_job(bad, ticks=3000, name="ckpt")
    tl.say(f"job {job} running on {sn} (on {bad}); it checkpoints and exits on USR1")
    s.sim.ecc_sbe(bad, 6, count=5000, rate=200)
    tl.say(f"inject: single-bit ECC errors climbing on {bad} GPU 6")

    async def done() -> bool:
        items = await s.remediations()
        tl.remediations(items)
        return _phase(items, bad) == "Repair"

    await s.wait(done, 240, f"{bad} checkpointed and replaced")
    ckpt = s.slurm.jobdir / f"ckpt-{job}"
    tl.say(f"job {job}: {ckpt.read_text().strip() if ckpt.exists() else 'no checkpoint?!'}")
    return ckpt.exists()


async def _scenario_fabric(s: DemoStack, tl: Timeline) -> bool:
    assert s.ib is not None
    bad, device = "node-06", "mlx5_1"
    sn, job = await s.run_job(bad, ticks=100, name="allreduce")
    tl.say(f"job {job} running on Slurm node {sn} (on {bad}); it ends in ~20s")
    s.ib.inject(IbFault(bad, IbFaultKind.PORT_DOWN, device))
    tl.say(f"inject: InfiniBand port {device}/1 of {bad} down (state DOWN, link Disabled, "
           "link_downed +1); mlx5_0 stays up")

    await s.wait(_replaced(s, tl, bad, sn), 240, f"{bad} replaced and {sn} undrained")
    item = [i for i in await s.remediations() if i["spec"]["node"] == bad][-1]
    incident = item["spec"].get("incident") or {}
    tl.say(f"NodeRemediation {item['metadata']['name']}: {incident.get('summary', '?')}")
    parts = sorted({json.dumps(e.get("part")) for e in incident.get("evidence", [])})
    tl.say(f"evidence parts: {', '.join(parts)}; replaced by {item['status'].get('spare')}")
    return f"device {device} port 1" in str(incident.get("summary", ""))


async def _scenario_slurm(s: DemoStack, tl: Timeline) -> bool:
    assert s.slurm is not None
    bad = "node-01"
    sn = await s.slurm_node_on(bad)
    await asyncio.to_thread(s.slurm.run, ["scontrol", "update", f"nodename={sn}", "state=drain",
                                          f"reason={NHC_REASON}"])
    tl.say(f"inject: NHC drains Slurm node {sn} (on {bad}): {NHC_REASON!r}")

    async def held() -> bool:
        items = [i for i in await s.remediations() if i["spec"]["node"] == bad]
        tl.remediations(items)
        st = (items[-1].get("status") or {}) if items else {}
        return "someone else" in str(st.get("reason", ""))

    await s.wait(held, 120, f"an incident on {bad} whose swap holds for NHC's drain")
    item = [i for i in await s.remediations() if i["spec"]["node"] == bad][-1]
    tl.say(f"NodeRemediation {item['metadata']['name']}: "
           f"{(item['spec'].get('incident') or {}).get('summary', '?')}")
    tl.say(f"  held: {item['status'].get('reason')}")
    real = await s.slurm_state(sn)
    tl.say(f"scontrol show node {sn}: reason {real.reason if real else '?'!r} (NHC's, untouched)")
    await asyncio.to_thread(s.slurm.run, ["scontrol", "update", f"nodename={sn}",
                                          "state=undrain"])
    tl.say(f"the owner (NHC, or an admin after a look) clears its drain on {sn}")

    await s.wait(_replaced(s, tl, bad, sn), 240, f"{bad} replaced and {sn} serving from a spare")
    item = [i for i in await s.remediations() if i["spec"]["node"] == bad][-1]
    tl.say(f"Slurm node {sn} serves from {item['status'].get('spare')}; {bad} handed to repair")
    return NHC_REASON in str((item["spec"].get("incident") or {}).get("summary", ""))


async def _scenario_dead_node(s: DemoStack, tl: Timeline) -> bool:
    assert s.slurm is not None
    bad = "node-02"
    sn, job = await s.run_job(bad, ticks=3000, name="train")
    tl.say(f"job {job} running on Slurm node {sn} (on {bad})")
    tl.say(f"inject: {bad} dies outright: its kubelet stops heartbeating, its slurmd and job "
           "are killed, nobody runs the pod's preStop")
    announced: set[str] = set()

    def said(items: list[dict[str, Any]]) -> None:
        tl.remediations(items)
        st = (items[-1].get("status") or {}) if items else {}
        death = st.get("death") or {}
        if death and "dead" not in announced:
            announced.add("dead")
            tl.say(f"{bad} is dead: {'; '.join(death.get('witnesses') or [])}")
            tl.say("no checkpoint, drain or eviction (nobody can answer them); nothing "
                   "irreversible before a fencing provider says the machine is off")
            tl.say(f"the admin fences it: kubectl annotate node {bad} healer.io/fenced="
                   "'demo: the machine is powered off (BMC)'")

    run = await dead_node(s, bad, said=said)
    st = run.record["status"]
    death = run.death
    tl.say(f"fenced by {death.get('provider')} ({death.get('fencedBy')}); jobs lost: "
           f"{death.get('lostJobs', '?')}")
    pod = {slurm_name(p): p for p in await s.pods()}[sn]
    tl.say(f"Slurm node {sn} now runs on {pod['spec']['nodeName']} (spare {st['spare']}): the "
           f"operator recreated pod {pod['metadata']['name']} once kube-controller-manager's "
           "pod garbage collector removed the old one (out-of-service taint)")
    real = await s.slurm_state(sn)
    tl.say(f"scontrol show node {sn}: {real.base if real else '?'}"
           f"{'+' + '+'.join(sorted(real.flags)) if real and real.flags else ''}, "
           f"job {job}: {await asyncio.to_thread(s.slurm.job_state, job) or 'gone'}")
    for step in st["ledger"]:
        dur = (step.get("finishedAt") or 0) - step["startedAt"]
        tl.say(f"  step {step['step']:<20} {dur:6.1f}s  {step.get('detail', '')}")
    tl.say(f"heartbeat lost -> dead {run.declared - run.killed:.1f}s; dead -> replacement "
           f"serving {run.dead_to_serving:.1f}s (the fence's own {run.fence_wait:.1f}s "
           f"excluded); heartbeat lost -> serving {run.heartbeat_to_serving:.1f}s")
    return (st["spare"] == "spare-a" and bool(real and real.base == "IDLE" and not real.drain)
            and str(job) in death.get("lostJobs", ""))


async def run_demo(scenario: str = "xid79", *, keep: bool = False,
                   out: Callable[[str], None] = print,
                   operator_version: str = DEFAULT_VERSION) -> int:
    if scenario not in SCENARIOS:
        out(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
        return 2
    if operator_version not in SUPPORTED_VERSIONS:
        out(f"unknown slurm-operator version {operator_version!r}; choose one of "
            f"{', '.join(SUPPORTED_VERSIONS)}")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="healer-demo-"))
    out(f"healer demo ({scenario}, slurm-operator {operator_version}, Slurm "
        f"{SLURM} with its real slurmrestd): starting the local real stack in "
        f"{workdir}")
    dead = scenario == "dead-node"
    stack = DemoStack(workdir, out, operator_version=operator_version,
                      node_grace=DEAD_NODE_GRACE if dead else None)
    ok = False
    try:
        await stack.start()
        extra = {"fabric": (ROOT / "policies" / "examples" / "infiniband.yaml",),
                 "slurm": (ROOT / "policies" / "examples" / "slurm-detector.yaml",),
                 }.get(scenario, ())
        stack.start_healer(act_policies(workdir / "policies", *extra, dead=dead),
                           slurm_state_interval=2.0 if dead else 10.0)
        await stack.wait(lambda: _http_ok(stack.port), 60, "healer /readyz")
        await stack.wait(lambda: _telemetry_fresh(stack.port), 60,
                         "healer to see fresh telemetry from every node")
        names = " + ".join(["policies/default.yaml", *(f"policies/examples/{e.name}"
                                                        for e in extra)])
        out(f"  healer running ({names} with mode: act, pollInterval: 2s), "
            f"metrics on http://127.0.0.1:{stack.port}/metrics")
        tl = Timeline(out)
        run = {"xid79": _scenario_xid79, "storm": _scenario_storm,
               "degrading": _scenario_degrading, "fabric": _scenario_fabric,
               "slurm": _scenario_slurm, "dead-node": _scenario_dead_node}[scenario]
        ok = await run(stack, tl)
        tl.say("result: " + ("OK" if ok else "FAILED"))
    except ConfigError as e:
        out(f"demo failed: {e}")
    finally:
        await stack.stop()
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0 if ok else 1


async def _http_get(port: int, path: str) -> tuple[int, str]:
    """A tiny GET against healer's own HTTP server (status 0: not listening yet)."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return 0, ""
    writer.write(f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n".encode())
    await writer.drain()
    raw = await reader.read()
    writer.close()
    head, _, body = raw.decode(errors="replace").partition("\r\n\r\n")
    parts = head.split(" ", 2)
    return (int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else 0), body


async def _http_ok(port: int) -> bool:
    return (await _http_get(port, "/readyz"))[0] == 200


async def _telemetry_fresh(port: int) -> bool:
    """healer has polled Prometheus and sees every node's telemetry fresh."""
    status, body = await _http_get(port, "/metrics")
    return status == 200 and 'healer_telemetry_stale_nodes{source="dcgm"} 0.0' in body
