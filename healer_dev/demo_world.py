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
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client

from healer.adapters.kube.client import make_api_client
from healer.adapters.kube.crd import GROUP, PLURAL, VERSION
from healer.adapters.slinky import pod_state, slurm_name
from healer.app import run as run_healer
from healer.core.vocabulary import ROLE_LABEL, SPARE_ROLE, SPARE_TAINT, TAINT_EFFECT, TAINT_VALUE
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
from healer_dev.devstack.kube import KubeStack, fake_node
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
from healer_dev.sim.dcgm import DcgmFleet, DcgmSim, make_node
from healer_dev.sim.infiniband import InfinibandSim

__all__ = ["DOMAIN", "NAMESPACE", "NODESET", "NODESET_LABEL", "TRAP_JOB", "DemoStack"]

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


class DemoStack:
    """Everything the demo starts, and stops again (in reverse order)."""

    def __init__(self, workdir: Path, out: Callable[[str], None], *,
                 operator_version: str = DEFAULT_VERSION) -> None:
        self.dir = workdir
        self.out = out
        self.operator_version = operator_version
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
        self.kube = KubeStack(self.dir / "kube", controllers=True, kwok=True)
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

    def start_healer(self, policies: Path) -> None:
        assert self.kube is not None
        assert self.prom is not None
        assert self.slinky is not None
        settings = Settings(
            policies=(str(policies),), log_level="info", log_json=True, shutdown_grace=2,
            log_file=str(self.dir / "healer.log"),
            kube=KubeSettings(kubeconfig=str(self.kube.kubeconfig), namespace="healer-system",
                              install_crd=True),
            leader=LeaderSettings(enabled=False),
            slurm=SlurmSettings(driver="slinky", nodeset_namespace=NAMESPACE, nodeset=NODESET,
                                slurmrestd_url=f"http://127.0.0.1:{self.slinky.restd_port}",
                                token_secret=f"{NAMESPACE}/{TOKEN_SECRET}:SLURM_JWT"),
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
