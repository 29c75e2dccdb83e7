"""Fixtures for the Slinky emulator tests (:mod:`healer.sim.slinky`).

* ``slinky_slurm`` (session): a real Slurm 22.05 whose node names are the slurmd pods' Slurm
  names: ``worker-0``/``worker-1`` (a StatefulSet-mode NodeSet ``worker``) and ``dgx-a``,
  ``dgx-b``, ``dgx-c`` (DaemonSet mode: named after Kubernetes Nodes ``dgx-a.<suffix>`` ...).
* ``slinky_cluster`` (function): that cluster reset (no jobs, every node idle, no comments);
  ``dgx-c`` is a Slurm node that does not exist yet (FUTURE, no slurmd) until the emulator
  starts its slurmd, as a DaemonSet-mode spare would.
* ``rig`` (function): the NodeSet CRD installed, a running :class:`SlinkyEmulator` for the
  test's namespace (its ``on_slurmd`` starts/kills the real slurmd; ``rig.gate`` can hold
  slurmd start-ups), helpers to make kwok Nodes (deleted afterwards) and NodeSets, and to read
  Slurm and the pods.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio import client

from healer.adapters.slinky import SlinkyPods, pod_state
from healer.adapters.slurm.parse import parse_node_line
from healer.devstack.kube import KubeStack, fake_node
from healer.devstack.slurm import LocalSlurm
from healer.errors import ConfigError, NotFoundError
from healer.ports import SlurmNodeState
from healer.sim.slinky import GROUP, PLURAL, VERSION, SlinkyEmulator, install
from tests.integration.slurm_fixtures import running_slurm
from tests.integration.waiting import wait_for

SLURM_NODES = ("worker-0", "worker-1", "dgx-a", "dgx-b", "dgx-c")
#: Slurm nodes that do not exist until a slurmd registers them (DaemonSet-mode spares)
ABSENT = ("dgx-c",)
CLUSTER = "slurm"
POOL = "healer-test/pool"


@pytest.fixture(scope="session")
def slinky_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    with running_slurm(tmp_path_factory.mktemp("slinky-slurm"), nodes=SLURM_NODES,
                         gpus_per_node=2, cpus_per_node=2) as cluster:
        yield cluster


@pytest.fixture
def slinky_cluster(slinky_slurm: LocalSlurm) -> LocalSlurm:
    s = slinky_slurm
    try:
        for node in ABSENT:  # register it again so reset() can see every node idle
            s.start_slurmd(node, wait=True)
        s.reset()
        for node in SLURM_NODES:
            s.run(["scontrol", "update", f"nodename={node}", "comment="])
        for node in ABSENT:
            s.kill_slurmd(node)
            s.run(["scontrol", "update", f"nodename={node}", "state=future"])
    except ConfigError as e:
        pytest.fail(f"the local Slurm cluster could not be reset:\n{e}", pytrace=False)
    return s


@dataclass
class Rig:
    """One test's world: a namespace, its emulator, its Nodes, the real Slurm."""

    api: client.ApiClient
    namespace: str
    slurm: LocalSlurm
    emu: SlinkyEmulator
    gate: asyncio.Event
    suffix: str
    nodes: list[str] = field(default_factory=list)
    slurmd_calls: list[tuple[str, bool]] = field(default_factory=list)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def pool(self) -> dict[str, str]:
        """The labels a Node needs to host this test's slurmd pods."""
        return {POOL: self.namespace}

    # -- Kubernetes ------------------------------------------------------------------------

    async def node(self, name: str, *, pool: bool = True, labels: Mapping[str, str] | None = None,
                   annotations: Mapping[str, str] | None = None,
                   taints: Sequence[Mapping[str, str]] = (), dotted: bool = False) -> str:
        """A kwok Node ``<name>-<suffix>`` (``<name>.<suffix>`` with ``dotted``)."""
        full = f"{name}.{self.suffix}" if dotted else f"{name}-{self.suffix}"
        all_labels = {**(self.pool if pool else {}), **(labels or {})}
        await self.core.create_node(fake_node(  # type: ignore[arg-type]
            full, labels=all_labels, annotations=annotations, taints=taints))
        self.nodes.append(full)
        return full

    async def patch_node(self, name: str, body: dict[str, Any]) -> None:
        await self.core.patch_node(name, body,
                                   _content_type="application/merge-patch+json")  # type: ignore[call-arg]

    async def cordon(self, name: str, reason: str | None = None) -> None:
        """``kubectl cordon``, after writing the cordon-reason annotation when given."""
        if reason is not None:
            await self.patch_node(name, {"metadata": {"annotations": {
                "nodeset.slinky.slurm.net/node-cordon-reason": reason}}})
        await self.patch_node(name, {"spec": {"unschedulable": True}})

    async def uncordon(self, name: str) -> None:
        await self.patch_node(name, {"spec": {"unschedulable": None}})

    async def read_node(self, name: str) -> dict[str, Any]:
        return dict(self.api.sanitize_for_serialization(await self.core.read_node(name)))

    async def nodeset(self, name: str, *, mode: str = "StatefulSet", replicas: int = 2,
                      extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeSet",
                "metadata": {"name": name},
                "spec": {"controllerRef": {"name": CLUSTER}, "replicas": replicas,
                         "scalingMode": mode,
                         "template": {"metadata": {"labels": {"healer-test/role": "gpu"}},
                                      "spec": {"nodeSelector": self.pool}},
                         **(extra or {})}}
        co = client.CustomObjectsApi(self.api)
        out = await co.create_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                       body)
        self.emu.kick()
        return dict(out)

    async def nodeset_status(self, name: str) -> dict[str, Any]:
        co = client.CustomObjectsApi(self.api)
        obj = await co.get_namespaced_custom_object(GROUP, VERSION, self.namespace, PLURAL,
                                                    name)
        return dict(obj.get("status") or {})

    # -- pods ------------------------------------------------------------------------------

    async def pods(self) -> list[dict[str, Any]]:
        return await SlinkyPods(self.api, self.namespace).pods()

    async def pod(self, slurm_node: str) -> dict[str, Any]:
        return await SlinkyPods(self.api, self.namespace).by_slurm_name(slurm_node)

    async def pod_state(self, slurm_node: str) -> SlurmNodeState:
        return pod_state(await self.pod(slurm_node))

    async def wait_pod(self, slurm_node: str, check: Any, *, within: float = 60.0,
                       description: str = "") -> dict[str, Any]:
        """Wait until the live pod of ``slurm_node`` satisfies ``check(pod)``."""
        async def probe() -> dict[str, Any] | None:
            try:
                pod = await self.pod(slurm_node)
            except NotFoundError:
                return None
            return pod if check(pod) else None

        got = await wait_for(probe, timeout=within, description=description or
                             f"the slurmd pod of {slurm_node}")
        assert got is not None
        return got

    async def ready(self, *slurm_nodes: str, within: float = 60.0) -> dict[str, dict[str, Any]]:
        """Wait until every named slurmd pod runs and its conditions show Slurm idle."""
        out = {}
        for n in slurm_nodes:
            out[n] = await self.wait_pod(
                n, lambda p: (p.get("status") or {}).get("phase") == "Running"
                and pod_state(p).base == "IDLE" and pod_state(p).registered
                and not pod_state(p).drain, within=within,
                description=f"the slurmd pod of {n} Running with Slurm idle")
        return out

    # -- Slurm -----------------------------------------------------------------------------

    async def slurm_state(self, node: str) -> SlurmNodeState | None:
        """``scontrol show node`` (None while the node does not exist, e.g. FUTURE)."""
        r = await asyncio.to_thread(self.slurm.run, ["scontrol", "show", "node", node, "-o"],
                                    check=False)
        if r.returncode != 0:
            return None
        return parse_node_line(r.stdout.strip().splitlines()[0])

    async def wait_slurm(self, node: str, check: Any, *, within: float = 60.0,
                         description: str = "") -> SlurmNodeState:
        async def probe() -> SlurmNodeState | None:
            st = await self.slurm_state(node)
            return st if st is not None and check(st) else None

        got = await wait_for(probe, timeout=within, description=description or
                             f"Slurm node {node}")
        assert got is not None
        return got

    async def scontrol(self, *args: str) -> None:
        await asyncio.to_thread(self.slurm.run, ["scontrol", *args])

    def updates_of(self, node: str) -> list[tuple[str, ...]]:
        """The scontrol updates the emulator made to ``node``."""
        return [argv for _, argv in self.emu.history if f"nodename={node}" in argv]


def host_of(pod: dict[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


async def two_workers(rig: Rig, *, spare: bool = False) -> tuple[str, str, str]:
    """Nodes a and b with the NodeSet's labels (+ a spare without them), NodeSet ``worker``
    (2 replicas), both slurmd pods Running and idle. Returns (host of worker-0, host of
    worker-1, spare or "")."""
    await rig.node("a")
    await rig.node("b")
    spare_name = await rig.node("spare", pool=False) if spare else ""
    await rig.nodeset("worker", replicas=2)
    pods = await rig.ready("worker-0", "worker-1")
    return host_of(pods["worker-0"]), host_of(pods["worker-1"]), spare_name


@pytest.fixture
async def rig(kube_stack: KubeStack, kube_api: client.ApiClient, namespace: str,
              slinky_cluster: LocalSlurm) -> AsyncIterator[Rig]:
    await install(kube_api)
    gate = asyncio.Event()
    gate.set()
    lock = threading.Lock()  # one LocalSlurm operation at a time (they run in threads)
    calls: list[tuple[str, bool]] = []

    def act(node: str, running: bool) -> None:
        with lock:
            if running:
                slinky_cluster.start_slurmd(node, wait=True)
            else:
                slinky_cluster.kill_slurmd(node)

    async def on_slurmd(node: str, running: bool) -> None:
        if running:
            await gate.wait()
        await asyncio.to_thread(act, node, running)
        calls.append((node, running))

    emu = SlinkyEmulator(kube_api, namespace=namespace, slurm_env=slinky_cluster.env(),
                         cluster=CLUSTER, resync=0.5, on_slurmd=on_slurmd)
    rig = Rig(kube_api, namespace, slinky_cluster, emu, gate, namespace.rsplit("-", 1)[-1],
              slurmd_calls=calls)
    task = asyncio.create_task(emu.run())
    try:
        yield rig
    finally:
        gate.set()
        for _ in range(3):  # cancel until it is really gone (never hang the teardown)
            task.cancel()
            done, _pending = await asyncio.wait({task}, timeout=10)
            if done:
                break
        assert task.done(), "the Slinky emulator did not stop when cancelled"
        if not task.cancelled():
            task.result()  # run() only ends by cancellation: surface anything else
        await asyncio.to_thread(lock.acquire)  # a slurmd start still running in a thread
        lock.release()
        core = client.CoreV1Api(kube_api)
        for n in rig.nodes:
            with contextlib.suppress(Exception):
                await core.delete_node(n)
