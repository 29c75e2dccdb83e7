"""``healer demo``: the whole story on the local real stack.

Starts, on loopback: kube-apiserver + etcd + kube-controller-manager + kube-scheduler + kwok
(fake GPU Nodes that look alive), a real Slurm 22.05 (slurmctld + one slurmd per Slurm node),
the Slinky operator emulator (a NodeSet of slurmd pods mirrored into that Slurm), the DCGM
exporter simulator scraped by a real Prometheus, and healer itself (``healer.app.run``, the same
code as ``healer run``) with the shipped default policies switched to ``mode: act``.

The fleet: 8 GPU nodes in two NVLink domains (node-00..03 in nvl-a, node-04..07 in nvl-b) and
two warm spares (spare-a in nvl-a, spare-b in nvl-b); a NodeSet ``gpu`` (StatefulSet mode, 8
replicas) runs Slurm nodes gpu-0..gpu-7 on them. Scenarios:

* ``xid79`` (``make demo``): a job runs on node-02 when its GPU 3 reports XID 79 (fell off the
  bus). healer drains the Slurm node (no checkpoint: the GPU is gone), waits until Slurm reports
  it drained, cordons node-02, claims spare-a (same NVLink domain), moves the slurmd there,
  annotates topology, undrains, and hands node-02 to repair.
* ``storm``: five nodes report fatal XIDs within seconds; the breaker and the concurrency limit
  let one remediation through and hold the rest (reported, not touched).
* ``degrading``: single-bit ECC errors climb on node-05 while a checkpointable job runs there;
  healer signals USR1, the job writes its checkpoint and exits, then the flow replaces the node.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

from healer.adapters.kube.client import make_api_client
from healer.adapters.kube.crd import GROUP, PLURAL, VERSION
from healer.adapters.slinky import pod_state, slurm_name
from healer.app import run as run_healer
from healer.devstack.kube import KubeStack, fake_node
from healer.devstack.net import free_port
from healer.devstack.prometheus import LocalPrometheus
from healer.devstack.slurm import LocalSlurm
from healer.errors import ConfigError
from healer.settings import (
    HttpSettings,
    KubeSettings,
    LeaderSettings,
    Settings,
    SlurmSettings,
    TelemetrySettings,
)
from healer.sim.dcgm import DcgmFleet, DcgmSim, make_node
from healer.sim.slinky import SlinkyEmulator, install

ROOT = Path(__file__).resolve().parent.parent
DOMAIN = "accelerator.topograph.run/domain"
NODESET_LABEL = "slinky.slurm.net/nodeset"
SCENARIOS = ("xid79", "storm", "degrading")
TRAP_JOB = """
trap 'echo "checkpoint written $(date +%s)" >> "$OUTDIR/ckpt-$SLURM_JOB_ID"; exit 0' USR1
for _ in $(seq 1 {ticks}); do sleep 0.2; done
"""


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


class DemoStack:
    """Everything the demo starts, and stops again (in reverse order)."""

    def __init__(self, workdir: Path, out: Callable[[str], None]) -> None:
        self.dir = workdir
        self.out = out
        self.kube: KubeStack | None = None
        self.slurm: LocalSlurm | None = None
        self.dcgm: DcgmFleet | None = None
        self.sim: DcgmSim | None = None
        self.prom: LocalPrometheus | None = None
        self.api: client.ApiClient | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.gpu_nodes = [f"node-{i:02d}" for i in range(8)]
        self.spares = ["spare-a", "spare-b"]
        self.port = free_port()

    async def start(self) -> None:
        t0 = time.monotonic()
        self.kube = KubeStack(self.dir / "kube", controllers=True, kwok=True)
        await asyncio.to_thread(self.kube.start)
        self.out(f"  control plane up ({time.monotonic() - t0:.1f}s): {self.kube.server}")
        self.slurm = LocalSlurm(self.dir / "slurm", nodes=[f"gpu-{i}" for i in range(8)])
        await asyncio.to_thread(self.slurm.start)
        self.out(f"  Slurm 22.05 up: slurmctld + 8 slurmd (gpu-0..gpu-7), "
                 f"SLURM_CONF={self.slurm.conf}")
        self.sim = DcgmSim([make_node(n, 8) for n in self.gpu_nodes + self.spares])
        self.dcgm = DcgmFleet(self.sim)
        addresses = await self.dcgm.start()
        self.prom = LocalPrometheus(self.dir / "prometheus", list(addresses.values()),
                                    scrape_interval="1s")
        await asyncio.to_thread(self.prom.start)
        # every exporter scraped at least once: an XID in a GPU's very first sample would be
        # taken as history (healer cannot tell when it happened), not as a new fault
        await asyncio.to_thread(self.prom.wait_for_series,
                                f"count(up == 1) == {len(addresses)}", 60.0)
        self.out(f"  DCGM exporter simulator: {len(addresses)} exporters; Prometheus "
                 f"{self.prom.url} scraping them every 1s")
        self.api = await make_api_client(str(self.kube.kubeconfig))
        await self._fleet()

    async def _fleet(self) -> None:
        assert self.api is not None
        core = client.CoreV1Api(self.api)
        for i, n in enumerate(self.gpu_nodes):
            dom, leaf = ("nvl-a", "leaf-1") if i < 4 else ("nvl-b", "leaf-2")
            await core.create_node(fake_node(n, labels={  # type: ignore[arg-type]
                "nvidia.com/gpu.present": "true", NODESET_LABEL: "gpu", DOMAIN: dom,
                "fabric.topograph.run/tier-0": leaf, "fabric.topograph.run/tier-1": "spine-1"}))
        for n, dom, leaf in (("spare-a", "nvl-a", "leaf-1"), ("spare-b", "nvl-b", "leaf-2")):
            await core.create_node(fake_node(n, labels={  # type: ignore[arg-type]
                "nvidia.com/gpu.present": "true", "healer.io/role": "spare", DOMAIN: dom,
                "fabric.topograph.run/tier-0": leaf, "fabric.topograph.run/tier-1": "spine-1"},
                taints=[{"key": "healer.io/spare", "value": "true", "effect": "NoSchedule"}]))
        await core.create_namespace({"metadata": {"name": "slurm"}})  # type: ignore[arg-type]
        await core.create_namespace({"metadata": {"name": "healer-system"}})  # type: ignore[arg-type]
        await install(self.api)
        nodeset = {"apiVersion": "slinky.slurm.net/v1beta1", "kind": "NodeSet",
                   "metadata": {"name": "gpu", "namespace": "slurm"},
                   "spec": {"controllerRef": {"name": "slurm"}, "replicas": 8,
                            "scalingMode": "StatefulSet",
                            "template": {"spec": {"nodeSelector": {NODESET_LABEL: "gpu"}}}}}
        await client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            "slinky.slurm.net", "v1beta1", "slurm", "nodesets", nodeset)
        assert self.slurm is not None
        slurm = self.slurm

        async def slurmd(node: str, running: bool) -> None:
            if running:
                await asyncio.to_thread(slurm.start_slurmd, node)
            else:
                await asyncio.to_thread(slurm.kill_slurmd, node)

        emu = SlinkyEmulator(self.api, namespace="slurm", slurm_env=slurm.env(),
                             on_slurmd=slurmd, resync=1.0)
        self.tasks.append(asyncio.create_task(emu.run(), name="slinky-emulator"))
        await self.wait(self._slurmd_pods_idle, 120, "8 slurmd pods Running and idle in Slurm")

    async def pods(self) -> list[dict[str, Any]]:
        assert self.api is not None
        raw = await client.CoreV1Api(self.api).list_namespaced_pod(
            "slurm", label_selector="app.kubernetes.io/name=slurmd")
        return [self.api.sanitize_for_serialization(p) for p in raw.items
                if not p.metadata.deletion_timestamp]

    async def _slurmd_pods_idle(self) -> bool:
        pods = await self.pods()
        return len(pods) == 8 and all(pod_state(p).base == "IDLE" and
                                      (p.get("spec") or {}).get("nodeName") for p in pods)

    async def slurm_node_on(self, k8s_node: str) -> str:
        for p in await self.pods():
            if p["spec"].get("nodeName") == k8s_node:
                return slurm_name(p)
        raise ConfigError(f"no slurmd pod on {k8s_node}")

    async def run_job(self, k8s_node: str, ticks: int, name: str) -> tuple[str, int]:
        """Start :data:`TRAP_JOB` (``ticks`` ticks of 0.2 s) on the Slurm node that runs on
        ``k8s_node``; returns that Slurm node and the job id once the job runs."""
        assert self.slurm is not None
        sn = await self.slurm_node_on(k8s_node)
        job = await asyncio.to_thread(self.slurm.submit, TRAP_JOB.format(ticks=ticks), sn,
                                      name=name)
        await asyncio.to_thread(self.slurm.wait_job, job, ("RUNNING",), 30)
        return sn, job

    async def wait(self, pred: Callable[[], Any], limit: float, what: str) -> None:
        deadline = time.monotonic() + limit
        while True:
            if await pred():
                return
            if time.monotonic() > deadline:
                raise ConfigError(f"demo: timed out after {limit:g}s waiting for {what}")
            await asyncio.sleep(0.25)

    def start_healer(self, policies: Path) -> None:
        assert self.kube is not None
        assert self.prom is not None
        assert self.slurm is not None
        settings = Settings(
            policies=(str(policies),), log_level="info", log_json=True, shutdown_grace=2,
            log_file=str(self.dir / "healer.log"),
            kube=KubeSettings(kubeconfig=str(self.kube.kubeconfig), namespace="healer-system",
                              install_crd=True),
            leader=LeaderSettings(enabled=False),
            slurm=SlurmSettings(driver="slinky", nodeset_namespace="slurm", nodeset="gpu",
                                slurm_conf=str(self.slurm.conf)),
            telemetry=TelemetrySettings(prometheus_url=self.prom.url, poll_interval=1.0),
            http=HttpSettings(host="127.0.0.1", port=self.port))
        self.tasks.append(asyncio.create_task(run_healer(settings), name="healer"))

    async def remediations(self) -> list[dict[str, Any]]:
        assert self.api is not None
        with contextlib.suppress(client.exceptions.ApiException):
            raw = await client.CustomObjectsApi(self.api).list_cluster_custom_object(
                GROUP, VERSION, PLURAL)
            return list(raw["items"])
        return []

    async def stop(self) -> None:
        for t in reversed(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.api is not None:
            await self.api.close()
        if self.prom is not None:
            await asyncio.to_thread(self.prom.stop)
        if self.dcgm is not None:
            await self.dcgm.stop()
        if self.slurm is not None:
            await asyncio.to_thread(self.slurm.stop)
        if self.kube is not None:
            await asyncio.to_thread(self.kube.stop)


def _act_policies(dest: Path) -> Path:
    """The shipped default policies, switched from observe to act, polling at a demo's pace."""
    dest.mkdir(parents=True, exist_ok=True)
    docs = list(yaml.safe_load_all((ROOT / "policies" / "default.yaml").read_text()))
    for doc in docs:
        if doc and doc.get("kind") == "RemediationPolicy":
            doc["spec"]["mode"] = "act"
            doc["spec"].setdefault("steps", {})["pollInterval"] = "2s"
    (dest / "default.yaml").write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return dest


def _phase(items: list[dict[str, Any]], node: str) -> str:
    """The phase of ``node``'s latest remediation in ``items`` ("" if none)."""
    mine = [i for i in items if i["spec"]["node"] == node]
    return str((mine[-1].get("status") or {}).get("phase", "")) if mine else ""


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
        return bool(pod and st and pod["spec"].get("nodeName") != bad and st.base == "IDLE"
                    and not st.drain)

    await s.wait(done, 240, f"{bad} replaced and {sn} idle and undrained")
    items = [i for i in await s.remediations() if i["spec"]["node"] == bad]
    st = items[-1]["status"]
    pod = {slurm_name(p): p for p in await s.pods()}[sn]
    tl.say(f"Slurm node {sn} now runs on {pod['spec']['nodeName']} (spare {st['spare']}, "
           f"same NVLink domain), idle and undrained; {bad} handed to repair")
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


async def run_demo(scenario: str = "xid79", *, keep: bool = False,
                   out: Callable[[str], None] = print) -> int:
    if scenario not in SCENARIOS:
        out(f"unknown scenario {scenario!r}; choose one of {', '.join(SCENARIOS)}")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="healer-demo-"))
    out(f"healer demo ({scenario}): starting the local real stack in {workdir}")
    stack = DemoStack(workdir, out)
    ok = False
    try:
        await stack.start()
        stack.start_healer(_act_policies(workdir / "policies"))
        await stack.wait(lambda: _http_ok(stack.port), 60, "healer /readyz")
        await stack.wait(lambda: _telemetry_fresh(stack.port), 60,
                         "healer to see fresh telemetry from every node")
        out(f"  healer running (policies/default.yaml with mode: act, pollInterval: 2s), "
            f"metrics on http://127.0.0.1:{stack.port}/metrics")
        tl = Timeline(out)
        run = {"xid79": _scenario_xid79, "storm": _scenario_storm,
               "degrading": _scenario_degrading}[scenario]
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
