"""A fleet of kwok nodes, policies and file-backed fakes for running the real daemon process."""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client

from healer.adapters.kube.crd import GROUP, PLURAL, VERSION
from healer.adapters.kube.store import ensure_crd
from healer.core.model import GpuRef, Signal, SignalKind
from healer_dev.devstack.kube import KubeStack
from healer_dev.devstack.kwok import fake_node
from healer_dev.devstack.net import free_port
from healer_dev.testing import FakeSlurm
from tests.builders import policy_yaml
from tests.integration.daemon_process import Daemon
from tests.integration.waiting import wait_for

DOMAIN = "accelerator.topograph.run/domain"



@dataclass
class Fleet:
    stack: KubeStack
    api: client.ApiClient
    tid: str
    dir: Path
    gpus: list[str]
    spares: list[str]
    slurm_path: Path
    signals: Path
    policies: Path
    daemons: list[Daemon] = field(default_factory=list)
    kubeconfig: Path | None = None

    @property
    def slurm(self) -> FakeSlurm:
        return FakeSlurm(path=self.slurm_path)

    def xid(self, node: str, code: int = 79, gpu: int = 3) -> None:
        sig = Signal(node, "file", SignalKind.XID, "DCGM_FI_DEV_XID_ERRORS", float(code),
                     time.time(), GpuRef(gpu, f"GPU-{node}-{gpu}", f"SN-{node}-{gpu}"))
        with open(self.signals, "a") as f:
            f.write(json.dumps({"node": node, **sig.to_dict()}) + "\n")

    def start(self, *extra: str, identity: str = "", leader: bool = False) -> Daemon:
        port = free_port()
        n = len(self.daemons)
        log = self.dir / f"daemon-{n}.log"
        argv = [sys.executable, "-m", "tests.integration.daemon.main",
                "--kubeconfig", str(self.kubeconfig or self.stack.kubeconfig),
                "--policies", str(self.policies), "--fake-slurm", str(self.slurm_path),
                "--signals", str(self.signals), "--http-host", "127.0.0.1",
                "--http-port", str(port), "--namespace", "healer-system",
                "--lease-name", f"healer-{self.tid}", "--log-format", "json",
                "--identity", identity or f"d{n}-{self.tid}", "--slurm-driver", "scontrol",
                "--lease-duration", "4", "--renew-deadline", "3", "--retry-period", "1",
                "--shutdown-grace", "2", *extra]
        if not leader:
            argv.append("--no-leader-election")
        d = Daemon.spawn(argv, port=port, log=log)
        self.daemons.append(d)
        return d

    async def ready(self, d: Daemon, deadline: float = 120) -> None:
        await d.ready(deadline)

    async def remediations(self, node: str) -> list[dict[str, Any]]:
        co = client.CustomObjectsApi(self.api)
        raw = await co.list_cluster_custom_object(GROUP, VERSION, PLURAL)
        return [i for i in raw["items"] if i["spec"]["node"] == node]

    async def phase(self, node: str) -> str:
        items = await self.remediations(node)
        return str((items[-1].get("status") or {}).get("phase", "")) if items else "Healthy"

    async def play_repair(self, node: str) -> bool:
        """Report the node repaired once healer handed it over; True once Done."""
        core = client.CoreV1Api(self.api)
        n = await core.read_node(node)
        labels = n.metadata.labels or {}
        ann = n.metadata.annotations or {}
        if labels.get("healer.io/repair") == "pending" and "healer.io/repair-result" not in ann \
                and await self.phase(node) == "Repair":
            await core.patch_node(node, {"metadata": {"annotations": {
                "healer.io/repair-result": "passed"}}})
        return await self.phase(node) == "Done"


@pytest.fixture
async def fleet(kube_stack: KubeStack, kube_api: client.ApiClient,
                tmp_path: Path) -> AsyncIterator[Fleet]:
    await ensure_crd(kube_api, install=True)
    core = client.CoreV1Api(kube_api)
    with contextlib.suppress(client.exceptions.ApiException):
        await core.create_namespace({"metadata": {"name": "healer-system"}})  # type: ignore[arg-type]
    tid = secrets.token_hex(3)
    gpus = [f"gpu-{tid}-{i}" for i in range(4)]
    spares = [f"spare-{tid}-a", f"spare-{tid}-b"]
    base = {"nvidia.com/gpu.present": "true", "healer-test": tid}
    for i, n in enumerate(gpus):
        await core.create_node(fake_node(n, labels=base | {DOMAIN: "a" if i < 2 else "b"}))  # type: ignore[arg-type]
    for n, dom in zip(spares, "ab", strict=True):
        await core.create_node(fake_node(  # type: ignore[arg-type]
            n, labels=base | {DOMAIN: dom, "healer.io/role": "spare"},
            taints=[{"key": "healer.io/spare", "value": "true", "effect": "NoSchedule"}]))

    async def ready() -> bool:
        ns = list((await core.list_node(label_selector=f"healer-test={tid}")).items)
        return len(ns) == 6 and all(any(c.type == "Ready" and c.status == "True"
                                        for c in n.status.conditions or []) for n in ns)

    await wait_for(ready, timeout=60, description="kwok nodes Ready")
    pol = tmp_path / "policies"
    pol.mkdir()
    (pol / "policy.yaml").write_text(policy_yaml(tid, name=f"fatal-{tid}"))
    slurm_path = tmp_path / "slurm.json"
    FakeSlurm(gpus, path=slurm_path)
    f = Fleet(kube_stack, kube_api, tid, tmp_path, gpus, spares, slurm_path,
              tmp_path / "signals.jsonl", pol)
    try:
        yield f
    finally:
        for d in f.daemons:
            d.kill9()
        co = client.CustomObjectsApi(kube_api)
        for n in gpus:
            for item in await f.remediations(n):
                with contextlib.suppress(client.exceptions.ApiException):
                    await co.delete_cluster_custom_object(GROUP, VERSION, PLURAL,
                                                          item["metadata"]["name"])
        for n in gpus + spares:
            with contextlib.suppress(client.exceptions.ApiException):
                await core.delete_node(n)
