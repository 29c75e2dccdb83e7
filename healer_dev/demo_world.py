"""The world ``make demo`` runs in (:mod:`healer_dev.demo`), started and stopped in one place.

On loopback: kube-apiserver + etcd + kube-controller-manager + kube-scheduler + kwok
(:class:`~healer_dev.devstack.kube.KubeStack`), a real Slurm 26.05 from its Debian root that
admits dynamic nodes (:class:`~healer_dev.devstack.slurm.LocalSlurm`), SchedMD's real
slurm-operator talking to that Slurm's real slurmrestd, and the kwok pod runtime that runs a real
``slurmd -Z`` per Running slurmd pod (:class:`~healer_dev.devstack.slinky_stack.SlinkyStack`),
the DCGM exporter simulator scraped by a real Prometheus, and healer itself
(``healer.app.run``, the code of ``healer run``).

The fleet: 8 kwok GPU Nodes (``nvidia.com/gpu: 8`` each) in two NVLink domains (node-00..03 in
nvl-a, node-04..07 in nvl-b), two tainted warm spares (spare-a in nvl-a, spare-b in nvl-b), and
a NodeSet ``gpu`` (8 replicas, 8 GPUs per slurmd) whose pods ``gpu-0`` .. ``gpu-7`` the real
scheduler spreads one per GPU Node (the operator adds no affinity: the GPU requests do it).
Each pod's slurmd registers itself in Slurm under the pod's name.
"""

from __future__ import annotations

import asyncio
import base64
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes_asyncio import client

from healer.adapters.kube.client import make_api_client
from healer.adapters.kube.crd import GROUP, PLURAL, VERSION
from healer.adapters.slinky import pod_state, slurm_name
from healer.app import run as run_healer
from healer.core.slurm_drivers import SlurmDriverKind
from healer.core.vocabulary import (
    FENCED_ANNOTATION,
    ROLE_LABEL,
    SPARE_ROLE,
    SPARE_TAINT,
    TAINT_EFFECT,
    TAINT_VALUE,
)
from healer.errors import ConfigError
from healer.ports import SlurmNodeState
from healer.settings import (
    HttpSettings,
    KubeSettings,
    LeaderSettings,
    Settings,
    SlurmSettings,
    TelemetrySettings,
)
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import fake_node
from healer_dev.devstack.net import free_port
from healer_dev.devstack.operator import (
    DEFAULT_VERSION,
    build_info,
    ensure_built,
    has_webhook,
    nodeset,
    operator_dir,
)
from healer_dev.devstack.prometheus import LocalPrometheus
from healer_dev.devstack.slinky_stack import SlinkyStack
from healer_dev.devstack.slurm import LocalSlurm
from healer_dev.devstack.slurm_root import SlurmVersion
from healer_dev.devstack.slurm_root import root_built as slurm_root_built
from healer_dev.sim.dcgm import DcgmSim, make_node
from healer_dev.sim.dcgm_server import DcgmFleet
from healer_dev.sim.infiniband import InfinibandSim

ROOT = Path(__file__).resolve().parent.parent

__all__ = ["DEAD_AFTER", "DEAD_NODE_GRACE", "DOMAIN", "NAMESPACE", "NODESET", "NODESET_LABEL",
           "TRAP_JOB", "DeadNodeRun", "DemoStack", "act_policies", "dead_node", "healer_ready"]

DOMAIN = "accelerator.topograph.run/domain"
NODESET_LABEL = "slinky.slurm.net/nodeset"
NAMESPACE = "slurm"  # the Slurm cluster's namespace (Controller, RestApi, NodeSet)
NODESET = "gpu"
GPUS = 8
#: the Slurm the demo runs: what Slinky 1.x needs (slurmrestd v0.0.44), with its real slurmrestd
SLURM = SlurmVersion.V26_05
TOKEN_SECRET = "healer-slurm-token"
TRAP_JOB = """
trap 'echo "checkpoint written $(date +%s)" >> "$OUTDIR/ckpt-$SLURM_JOB_ID"; exit 0' USR1
for _ in $(seq 1 {ticks}); do sleep 0.2; done
"""


#: kube-controller-manager's --node-monitor-grace-period in the dead-node scenario and bench
#: (kwok's Leases last as long; Slurm's SlurmdTimeout here is 10 s)
DEAD_NODE_GRACE = 10.0
#: the default policy's deadNode.deadAfter there
DEAD_AFTER = "5s"


def act_policies(dest: Path, *extra: Path, dead: bool = False) -> Path:
    """The shipped default policies (and ``extra`` policy files), switched from observe to act,
    polling at a demo's pace; with ``dead``, declaring a node dead after :data:`DEAD_AFTER` of
    NotReady (the dead-node scenario's pace; the rest as shipped)."""
    dest.mkdir(parents=True, exist_ok=True)
    for src in (ROOT / "policies" / "default.yaml", *extra):
        docs = list(yaml.safe_load_all(src.read_text()))
        for doc in docs:
            if doc and doc.get("kind") == "RemediationPolicy":
                doc["spec"]["mode"] = "act"
                doc["spec"].setdefault("steps", {})["pollInterval"] = "2s"
                if dead and doc["spec"].get("deadNode") is not None:
                    doc["spec"]["deadNode"]["deadAfter"] = DEAD_AFTER
        (dest / src.name).write_text(yaml.safe_dump_all(docs, sort_keys=False))
    return dest


async def healer_ready(port: int) -> bool:
    """healer's own ``/readyz`` answers 200."""
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
    except OSError:
        return False
    writer.write(b"GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
    await writer.drain()
    raw = await reader.read()
    writer.close()
    return raw.startswith((b"HTTP/1.0 200", b"HTTP/1.1 200"))


class DemoStack:
    """Everything the demo starts, and stops again (in reverse order)."""

    def __init__(self, workdir: Path, out: Callable[[str], None], *,
                 operator_version: str = DEFAULT_VERSION,
                 node_grace: float | None = None) -> None:
        self.dir = workdir
        self.out = out
        self.operator_version = operator_version
        #: kube-controller-manager's node grace and kwok's Lease (None: the defaults): the
        #: dead-node scenario and the bench set it short (:data:`DEAD_NODE_GRACE`)
        self.node_grace = node_grace
        self.kube: KubeStack | None = None
        self.slurm: LocalSlurm | None = None
        self.slinky: SlinkyStack | None = None
        self.dcgm: DcgmFleet | None = None
        self.sim: DcgmSim | None = None
        self.ib: InfinibandSim | None = None  # node-exporter's infiniband series, same exporters
        self.prom: LocalPrometheus | None = None
        self.api: client.ApiClient | None = None
        self.tasks: list[asyncio.Task[Any]] = []
        self.gpu_nodes = [f"node-{i:02d}" for i in range(8)]
        self.spares = ["spare-a", "spare-b"]
        self.port = free_port()

    async def start(self) -> None:
        v = self.operator_version
        t0 = time.monotonic()
        if not (operator_dir(v) / "manager").exists():
            self.out(f"  building SchedMD's slurm-operator {v} from the Go module proxy "
                     "(once; about 10 minutes on 2 cores) ...")
        await asyncio.to_thread(ensure_built, (v,))
        self.out("  slurm-operator (SchedMD, the real manager"
                 + (" + pod-binding webhook" if has_webhook(v) else "") + "): "
                 + build_info(v).replace("\n", ", "))
        self.kube = KubeStack(self.dir / "kube", controllers=True, kwok=True,
                              node_grace=self.node_grace)
        await asyncio.to_thread(self.kube.start)
        self.out(f"  control plane up ({time.monotonic() - t0:.1f}s): {self.kube.server}")
        if not slurm_root_built(SLURM):
            self.out("  building the Slurm 26.05 root from Debian with mmdebstrap (once; under "
                     "a minute here) ...")
        self.slurm = LocalSlurm(self.dir / "slurm", nodes=(), gpus_per_node=GPUS,
                                max_dynamic_nodes=16, version=SLURM)
        await asyncio.to_thread(self.slurm.start)
        self.out(f"  Slurm {self.slurm.release} up (Debian {SLURM.suite}, run from "
                 f"its root): slurmctld, no static nodes (slurmds register dynamically), "
                 f"SLURM_CONF={self.slurm.conf}")
        t1 = time.monotonic()
        self.slinky = SlinkyStack(self.kube, self.slurm, workdir=self.dir / "slinky",
                                  version=v)
        await asyncio.to_thread(self.slinky.start)  # may wait for another stack's lock
        await asyncio.to_thread(self.slinky.add_cluster, NAMESPACE)
        self.out(f"  slurm-operator {v} running out of cluster ({time.monotonic() - t1:.1f}s), "
                 f"talking v0.0.44 to Slurm {self.slurm.release}'s real slurmrestd (JWT) on "
                 f"127.0.0.1:{self.slinky.restd_port}; Controller + RestApi in namespace "
                 f"{NAMESPACE}")
        self.sim = DcgmSim([make_node(n, GPUS) for n in self.gpu_nodes + self.spares])
        self.ib = InfinibandSim(self.gpu_nodes + self.spares).attach(self.sim)
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
        assert self.slinky is not None
        core = client.CoreV1Api(self.api)
        gpus = {"nvidia.com/gpu": str(GPUS)}
        for i, n in enumerate(self.gpu_nodes):
            dom, leaf = ("nvl-a", "leaf-1") if i < 4 else ("nvl-b", "leaf-2")
            await core.create_node(fake_node(n, capacity=gpus, labels={  # type: ignore[arg-type]
                "nvidia.com/gpu.present": "true", NODESET_LABEL: NODESET, DOMAIN: dom,
                "fabric.topograph.run/tier-0": leaf, "fabric.topograph.run/tier-1": "spine-1"}))
        for n, dom, leaf in (("spare-a", "nvl-a", "leaf-1"), ("spare-b", "nvl-b", "leaf-2")):
            await core.create_node(fake_node(n, capacity=gpus, labels={  # type: ignore[arg-type]
                "nvidia.com/gpu.present": "true", ROLE_LABEL: SPARE_ROLE, DOMAIN: dom,
                "fabric.topograph.run/tier-0": leaf, "fabric.topograph.run/tier-1": "spine-1"},
                taints=[{"key": SPARE_TAINT, "value": TAINT_VALUE, "effect": TAINT_EFFECT}]))
        await core.create_namespace({"metadata": {"name": "healer-system"}})  # type: ignore[arg-type]
        # healer's job backend (slurmrestd) authenticates with a JWT read from this Secret
        token = base64.b64encode(self.slinky.token().encode()).decode()
        await core.create_namespaced_secret(NAMESPACE, {  # type: ignore[arg-type]
            "metadata": {"name": TOKEN_SECRET}, "data": {"SLURM_JWT": token}})
        body = nodeset(NAMESPACE, NODESET, "slurm", replicas=len(self.gpu_nodes),
                       node_selector={NODESET_LABEL: NODESET}, gpus=GPUS)
        await client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            "slinky.slurm.net", "v1beta1", NAMESPACE, "nodesets", body)
        t0 = time.monotonic()
        await self.wait(self._slurmd_pods_idle, 180,
                        "8 slurmd pods Running, one per GPU Node, and idle in Slurm")
        self.out(f"  NodeSet {NODESET}: 8 slurmd pods gpu-0..gpu-7 scheduled one per GPU Node, "
                 f"their slurmds registered in Slurm, IDLE on the pods' conditions "
                 f"({time.monotonic() - t0:.1f}s)")

    async def pods(self) -> list[dict[str, Any]]:
        assert self.api is not None
        raw = await client.CoreV1Api(self.api).list_namespaced_pod(
            NAMESPACE, label_selector="app.kubernetes.io/name=slurmd")
        return [self.api.sanitize_for_serialization(p) for p in raw.items
                if not p.metadata.deletion_timestamp]

    async def _slurmd_pods_idle(self) -> bool:
        pods = await self.pods()
        hosts = {(p.get("spec") or {}).get("nodeName") for p in pods}
        if not (len(pods) == len(self.gpu_nodes) and hosts == set(self.gpu_nodes)
                and all(pod_state(p).registered and pod_state(p).base == "IDLE" for p in pods)):
            return False
        for p in pods:  # and Slurm itself agrees (the conditions are the operator's copy)
            st = await self.slurm_state(slurm_name(p))
            if st is None or st.base != "IDLE" or st.drain or not st.registered:
                return False
        return True

    async def slurm_state(self, name: str) -> SlurmNodeState | None:
        """Slurm's own view of node ``name`` (``scontrol show node``); None if it has none."""
        assert self.slurm is not None
        try:
            return await asyncio.to_thread(self.slurm.node_state, name)
        except (ConfigError, subprocess.SubprocessError, IndexError):
            return None

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

    async def kill_node(self, node: str) -> list[str]:
        """``node`` dies outright: its kubelet stops heartbeating, its slurmd (and its jobs)
        are killed; nothing runs its preStop (:meth:`SlinkyStack.kill_node`)."""
        assert self.slinky is not None
        return await asyncio.to_thread(self.slinky.kill_node, node)

    async def annotate(self, node: str, annotations: dict[str, str]) -> None:
        assert self.api is not None
        await client.CoreV1Api(self.api).patch_node(node, {"metadata": {
            "annotations": annotations}})

    def start_healer(self, policies: Path, *, slurm_state_interval: float = 10.0) -> None:
        assert self.kube is not None
        assert self.prom is not None
        assert self.slinky is not None
        settings = Settings(
            policies=(str(policies),), log_level="info", log_json=True, shutdown_grace=2,
            log_file=str(self.dir / "healer.log"),
            kube=KubeSettings(kubeconfig=str(self.kube.kubeconfig), namespace="healer-system",
                              install_crd=True),
            leader=LeaderSettings(enabled=False),
            slurm=SlurmSettings(driver=SlurmDriverKind.SLINKY, nodeset_namespace=NAMESPACE,
                                nodeset=NODESET,
                                slurmrestd_url=f"http://127.0.0.1:{self.slinky.restd_port}",
                                token_secret=f"{NAMESPACE}/{TOKEN_SECRET}:SLURM_JWT",
                                state_interval=slurm_state_interval),
            telemetry=TelemetrySettings(prometheus_url=self.prom.url, poll_interval=1.0),
            http=HttpSettings(host="127.0.0.1", port=self.port))
        self.tasks.append(asyncio.create_task(run_healer(settings), name="healer"))

    async def remediations(self) -> list[dict[str, Any]]:
        assert self.api is not None
        try:
            raw = await client.CustomObjectsApi(self.api).list_cluster_custom_object(
                GROUP, VERSION, PLURAL)
        except client.exceptions.ApiException:
            return []
        return list(raw["items"])

    async def stop(self) -> None:
        """healer first, then Prometheus and the exporters, then the operator (before the
        slurmds it watches), the pod runtime and slurmrestd, Slurm, and the control plane."""
        for t in reversed(self.tasks):
            t.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        if self.api is not None:
            await self.api.close()
        if self.prom is not None:
            await asyncio.to_thread(self.prom.stop)
        if self.dcgm is not None:
            await self.dcgm.stop()
        if self.slinky is not None:
            await asyncio.to_thread(self.slinky.stop)
        if self.slurm is not None:
            await asyncio.to_thread(self.slurm.stop)
        if self.kube is not None:
            await asyncio.to_thread(self.kube.stop)


@dataclass
class DeadNodeRun:
    """One dead node, from the heartbeat lost to the replacement serving (the record's times,
    seconds since the epoch)."""

    node: str
    slurm_node: str
    killed: float  # kwok stopped heartbeating, the slurmd and its job killed
    record: dict[str, Any]  # the NodeRemediation once the replacement serves

    @property
    def death(self) -> dict[str, Any]:
        return dict(self.record["status"].get("death") or {})

    @property
    def serving(self) -> float:
        """When healer undrained the replacement (it entered Repair)."""
        return float(next(h["at"] for h in self.record["status"]["history"]
                          if h["to"] == "Repair"))

    @property
    def declared(self) -> float:
        return float(self.death["declared"])

    @property
    def fence_wait(self) -> float:
        """How long the fencing provider took to answer (not healer's time)."""
        return float(self.death["fencedAt"]) - self.declared

    @property
    def dead_to_serving(self) -> float:
        """Dead verdict → replacement serving, less the fencing provider's own time."""
        return self.serving - self.declared - self.fence_wait

    @property
    def heartbeat_to_serving(self) -> float:
        """Heartbeat lost → replacement serving, less the fencing provider's own time."""
        return self.serving - self.killed - self.fence_wait


async def dead_node(s: DemoStack, node: str, *,
                    said: Callable[[list[dict[str, Any]]], None] = lambda _: None,
                    limit: float = 300) -> DeadNodeRun:
    """Kill ``node`` outright; once healer declares it dead, fence it as an admin would (the
    ``manual`` provider: ``healer.io/fenced``); return once its Slurm node serves, undrained,
    from another Node. ``said`` sees the NodeRemediations at every look."""
    sn = await s.slurm_node_on(node)
    killed = time.time()
    await s.kill_node(node)

    async def phase() -> str:
        items = [i for i in await s.remediations() if i["spec"]["node"] == node]
        said(items)
        return str((items[-1].get("status") or {}).get("phase", "")) if items else ""

    async def dead() -> bool:
        return await phase() in ("Dead", "HeldForFencing")

    await s.wait(dead, limit, f"{node} declared dead")
    await s.annotate(node, {FENCED_ANNOTATION: "demo: the machine is powered off (BMC)"})

    async def serving() -> bool:
        if await phase() != "Repair":
            return False
        pod = {slurm_name(p): p for p in await s.pods()}.get(sn)
        if pod is None or pod["spec"].get("nodeName") == node:
            return False
        real = await s.slurm_state(sn)
        return bool(real and real.registered and not real.drain and real.base == "IDLE")

    await s.wait(serving, limit, f"{sn} serving from a spare")
    items = [i for i in await s.remediations() if i["spec"]["node"] == node]
    return DeadNodeRun(node, sn, killed, items[-1])
