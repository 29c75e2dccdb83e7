"""Helpers for tests against SchedMD's real slurm-operator on the local stack
(:mod:`healer_dev.devstack.slinky_stack`, fixtures in :mod:`tests.integration.slinky_fixtures`).

``rig`` (function): the test's namespace with its Slurm cluster objects (``slinky_cluster``), on
the operator version the test asked for (``operator_version``, indirect parametrize), and
helpers to make kwok Nodes (8 GPUs each, so one slurmd fits a Node; deleted afterwards) and
NodeSets (unique names: one Slurm serves every namespace), and to read the slurmd pods
(:class:`healer.adapters.slinky.SlinkyPods`) and Slurm (``scontrol``).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytest
from kubernetes_asyncio import client

from healer.adapters.slinky import SlinkyPods, pod_state
from healer.adapters.slurm.parse import parse_node_line
from healer.errors import NotFoundError
from healer.ports import SlurmNodeState
from healer_dev.devstack.kwok import fake_node
from healer_dev.devstack.operator import GROUP, VERSION, nodeset
from healer_dev.devstack.slinky_stack import SlinkyStack
from tests.integration.slinky_fixtures import unique_nodeset
from tests.integration.waiting import wait_for

CLUSTER = "slurm"
POOL = "healer-test/pool"
GPUS = 8
CORDON_REASON = "nodeset.slinky.slurm.net/node-cordon-reason"
POD_CORDON = "nodeset.slinky.slurm.net/pod-cordon"
POD_PROTECT = "nodeset.slinky.slurm.net/pod-protect"
OPERATOR = "slurm-operator: "

PodCheck = Callable[[dict[str, Any]], bool]


def host_of(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("nodeName") or "")


def carries_slurms_refusal(text: str, slurm_says: str, *, namespace: str, pod: str) -> bool:
    """Whether ``text`` carries Slurm's own reason for refusing a registration (``slurm_says``),
    or the reason SchedMD's operator (1.0, 1.1) wrote over it in its one race: its undrain
    checks the node on its cached view of Slurm, and reads a node not there yet as drained and
    its own (``tolerateError``), so on a node that has just registered it may ask slurmrestd to
    undrain it, with ``Pod (<namespace>/<pod>) has been uncordoned``. Slurm keeps the DRAIN of
    an ``INVALID_REG`` node and takes the new reason. Seen once in a whole-suite run."""
    return slurm_says in text or \
        f"slurm-operator: Pod ({namespace}/{pod}) has been uncordoned" in text


def labels_of(pod: Mapping[str, Any]) -> dict[str, str]:
    return dict((pod.get("metadata") or {}).get("labels") or {})


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict((obj.get("metadata") or {}).get("annotations") or {})


def serving(pod: Mapping[str, Any]) -> bool:
    """Running, and its conditions show a registered, idle, undrained Slurm node."""
    st = pod_state(pod)
    return (pod.get("status") or {}).get("phase") == "Running" and st.base == "IDLE" \
        and st.registered and not st.drain


@dataclass
class Rig:
    """One test's world on the real operator: its namespace, Nodes and NodeSets."""

    api: client.ApiClient
    namespace: str
    stack: SlinkyStack
    version: str
    suffix: str
    nodes: list[str] = field(default_factory=list)
    nodesets: list[str] = field(default_factory=list)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    @property
    def pool(self) -> dict[str, str]:
        """The labels a Node needs to host this test's slurmd pods."""
        return {POOL: self.namespace}

    @property
    def v1_1(self) -> bool:
        return not self.version.startswith("v1.0.")

    # -- Kubernetes ------------------------------------------------------------------------

    async def node(self, name: str, *, pool: bool = True, labels: Mapping[str, str] | None = None,
                   annotations: Mapping[str, str] | None = None,
                   taints: Sequence[Mapping[str, str]] = (), dotted: bool = False) -> str:
        """A kwok Node ``<name>-<suffix>`` with 8 GPUs (``n<suffix>-<name>.example`` with
        ``dotted``: a DaemonSet-mode pod's Slurm name is the Node name up to the first dot)."""
        full = f"n{self.suffix}-{name}.example" if dotted else f"{name}-{self.suffix}"
        all_labels = {**(self.pool if pool else {}), **(labels or {})}
        await self.core.create_node(fake_node(  # type: ignore[arg-type]
            full, labels=all_labels, annotations=annotations, taints=taints,
            capacity={"nvidia.com/gpu": str(GPUS)}))
        self.nodes.append(full)
        return full

    async def patch_node(self, name: str, body: dict[str, Any]) -> None:
        await self.core.patch_node(name, body,
                                   _content_type="application/merge-patch+json")  # type: ignore[call-arg]

    async def cordon(self, name: str, reason: str | None = None) -> None:
        """``kubectl cordon``, after writing the cordon-reason annotation when given."""
        if reason is not None:
            await self.patch_node(name, {"metadata": {"annotations": {CORDON_REASON: reason}}})
        await self.patch_node(name, {"spec": {"unschedulable": True}})

    async def uncordon(self, name: str) -> None:
        await self.patch_node(name, {"metadata": {"annotations": {CORDON_REASON: None}},
                                     "spec": {"unschedulable": None}})

    async def read_node(self, name: str) -> dict[str, Any]:
        return dict(self.api.sanitize_for_serialization(await self.core.read_node(name)))

    async def nodeset(self, prefix: str, *, replicas: int = 2, mode: str = "StatefulSet",
                      update_strategy: Mapping[str, Any] | None = None,
                      node_selector: Mapping[str, str] | None = None,
                      extra_conf: str = "") -> str:
        """Create a NodeSet ``<prefix><hex>`` on this test's pool; returns its name."""
        name = unique_nodeset(prefix)
        obj = nodeset(self.namespace, name, CLUSTER, replicas=replicas,
                      node_selector=node_selector or self.pool,
                      scaling_mode=mode if self.v1_1 else None,
                      update_strategy=update_strategy, gpus=GPUS,
                      labels={"healer-test/role": "gpu"}, extra_conf=extra_conf)
        op = self.stack.operator
        assert op is not None, "the slurm-operator is not running"
        await asyncio.to_thread(op.apply, [obj])
        self.nodesets.append(name)
        return name

    async def nodeset_obj(self, name: str) -> dict[str, Any]:
        co = client.CustomObjectsApi(self.api)
        return dict(await co.get_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                          "nodesets", name))

    # -- pods ------------------------------------------------------------------------------

    async def pods(self) -> list[dict[str, Any]]:
        return await SlinkyPods(self.api, self.namespace).pods()

    async def pod(self, slurm_node: str) -> dict[str, Any]:
        return await SlinkyPods(self.api, self.namespace).by_slurm_name(slurm_node)

    async def pod_state(self, slurm_node: str) -> SlurmNodeState:
        return pod_state(await self.pod(slurm_node))

    async def wait_pod(self, slurm_node: str, check: PodCheck, *, within: float = 60.0,
                       description: str = "") -> dict[str, Any]:
        """Wait until the live pod of ``slurm_node`` satisfies ``check(pod)``."""
        async def probe() -> dict[str, Any] | None:
            try:
                pod = await self.pod(slurm_node)
            except NotFoundError:
                return None
            return pod if check(pod) else None

        got: dict[str, Any] | None = await wait_for(
            probe, timeout=within, interval=0.1,
            description=description or f"the slurmd pod of {slurm_node}")
        assert got is not None
        return got

    async def ready(self, *slurm_nodes: str, within: float = 60.0) -> dict[str, dict[str, Any]]:
        """Wait until every named slurmd pod runs and its conditions show Slurm idle."""
        out = {}
        for n in slurm_nodes:
            out[n] = await self.wait_pod(n, serving, within=within,
                                         description=f"the slurmd pod of {n} Running, Slurm idle")
        return out

    async def wait_pods(self, count: int, check: PodCheck = serving, *,
                        within: float = 60.0) -> list[dict[str, Any]]:
        """Wait until ``count`` slurmd pods of the namespace satisfy ``check``."""
        async def probe() -> list[dict[str, Any]] | None:
            pods = [p for p in await self.pods() if check(p)]
            return pods if len(pods) == count else None

        got: list[dict[str, Any]] | None = await wait_for(
            probe, timeout=within, interval=0.1,
            description=f"{count} slurmd pods in {self.namespace}")
        assert got is not None
        return got

    # -- Slurm -----------------------------------------------------------------------------

    async def slurm_state(self, node: str) -> SlurmNodeState | None:
        """``scontrol show node`` (None while Slurm has no such node)."""
        r = await asyncio.to_thread(self.stack.slurm.run,
                                    ["scontrol", "show", "node", node, "-o"], check=False)
        lines = r.stdout.strip().splitlines()
        if r.returncode != 0 or not lines:
            return None
        return parse_node_line(lines[0])

    async def slurm_show(self, node: str) -> str:
        r = await asyncio.to_thread(self.stack.slurm.run,
                                    ["scontrol", "show", "node", node, "-o"], check=False)
        return str(r.stdout)

    async def wait_slurm(self, node: str, check: Callable[[SlurmNodeState], bool], *,
                         within: float = 60.0, description: str = "") -> SlurmNodeState:
        async def probe() -> SlurmNodeState | None:
            st = await self.slurm_state(node)
            return st if st is not None and check(st) else None

        got: SlurmNodeState | None = await wait_for(
            probe, timeout=within, interval=0.1,
            description=description or f"Slurm node {node}")
        assert got is not None
        return got

    async def scontrol(self, *args: str) -> None:
        await asyncio.to_thread(self.stack.slurm.run, ["scontrol", *args])

    async def admin_drain(self, node: str, reason: str, *, within: float = 90.0) -> None:
        """Drain ``node`` as an admin would (``scontrol update state=drain``) and wait until the
        operator's view shows it: the pod's conditions carry the drain and ``reason``.

        SchedMD's operator (1.0, 1.1) can undo a drain made while one of its NodeSet syncs is
        under way: the sync's uncordon read the node before the drain, then undrains it with
        "Pod (…) has been uncordoned" (slurmctld's log showed the undo 7 ms after an admin's
        drain made just after the pods came up; seen once in a whole-suite run). The drain is
        made again only when Slurm shows it gone, which nothing else here does."""
        for _ in range(3):
            await self.scontrol("update", f"nodename={node}", "state=drain", f"reason={reason}")

            async def settled() -> str | None:
                st = await self.slurm_state(node)
                if st is not None and not st.drain:
                    return "undone"
                mirrored = await self.pod_state(node)
                return "held" if mirrored.drain and mirrored.reason == reason else None

            if await wait_for(settled, timeout=within, interval=0.2,
                              description=f"the admin's drain of {node} seen by the operator"
                              ) == "held":
                return
        raise AssertionError(f"the admin's drain of {node} was undone three times")

    # -- teardown --------------------------------------------------------------------------

    async def cleanup(self) -> None:
        """Delete the NodeSets and wait (bounded) for their pods to go, so that the pod
        runtime's preStop deletes their Slurm nodes (one Slurm, MaxNodeCount); then the
        Nodes."""
        co = client.CustomObjectsApi(self.api)
        for name in self.nodesets:
            with contextlib.suppress(Exception):
                await co.delete_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                         "nodesets", name)

        async def no_pods() -> bool:
            pods = await self.core.list_namespaced_pod(
                self.namespace, label_selector="app.kubernetes.io/name=slurmd")
            return not pods.items

        with contextlib.suppress(Exception):
            await until(no_pods, within=30, description="the slurmd pods gone")
        for n in self.nodes:
            with contextlib.suppress(Exception):
                await self.core.delete_node(n)


async def until(pred: Callable[[], Awaitable[bool]], *, within: float, interval: float = 0.2,
                description: str) -> None:
    """Wait until the async predicate holds (:func:`wait_for`, typed for bool predicates)."""
    ok: bool = await wait_for(pred, timeout=within, interval=interval, description=description)
    assert ok


def report(what: str, seconds: float) -> None:
    """A measured time, printed even without ``-s`` (terminal reporter) and kept in
    :data:`MEASURED`."""
    MEASURED.append((what, seconds))
    print(f"\n[measured] {what}: {seconds:.2f} s", flush=True)


MEASURED: list[tuple[str, float]] = []
NOTES: list[str] = []


def note(text: str) -> None:
    """An observation for the terminal summary."""
    NOTES.append(text)


def since(t0: float) -> float:
    return time.monotonic() - t0


@pytest.fixture
async def rig(kube_api: client.ApiClient, namespace: str, operator_version: str,
              slinky_cluster: SlinkyStack) -> AsyncIterator[Rig]:
    r = Rig(kube_api, namespace, slinky_cluster, operator_version, secrets.token_hex(3))
    try:
        yield r
    finally:
        await r.cleanup()


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if MEASURED:
        terminalreporter.section("Slinky timings (real operator)")
        for what, s in MEASURED:
            terminalreporter.write_line(f"{what}: {s:.2f} s")
    for text in NOTES:
        terminalreporter.write_line(text)
