"""The topology step (KubeTopology) on the real kube-apiserver, with kwok Nodes, the Slinky
operator emulator (healer.sim.slinky) over a real Slurm, and a test double of topograph's API.

The emulator is driven one pass at a time (``reconcile_once``), so each test decides exactly
when "the operator" has copied the Node's annotation to the slurmd pod.
"""

from __future__ import annotations

import contextlib
import dataclasses
import secrets
import socket
from collections.abc import AsyncIterator, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from healer.adapters.kube.hooks import TOPOLOGY_ANNOTATION, KubeTopology
from healer.adapters.kube.nodes import KubeNodes
from healer.adapters.slinky import SlinkyPods
from healer.adapters.slurm.scontrol import ScontrolDriver
from healer.adapters.topograph import TopographClient
from healer.devstack.kube import KubeStack, fake_node
from healer.devstack.slurm import LocalSlurm
from healer.errors import TransientError
from healer.obs.http import serve
from healer.ports import SlurmNodeState, StepOutcome
from healer.sim.slinky import GROUP, PLURAL, VERSION, SlinkyEmulator, install
from tests.integration.slurm_fixtures import running_slurm
from tests.integration.waiting import wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(180)]

SLURM_NODE = "topo-0"  # pod topo-0 of the StatefulSet-mode NodeSet "topo"
CLUSTER = "slurm"
POOL = "healer-test/topology-pool"
TIERS = {"fabric.topograph.run/tier-0": "leaf3", "fabric.topograph.run/tier-1": "spine1"}
SPEC = "default:spine1:leaf3"


@pytest.fixture(scope="module")
def topo_slurm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalSlurm]:
    with running_slurm(tmp_path_factory.mktemp("topology-slurm"), nodes=(SLURM_NODE,),
                         gpus_per_node=1, cpus_per_node=2) as cluster:
        yield cluster


class Slurm2505:
    """Slurm as healer reads it on Slurm >= 25.05: the real Slurm's node state (scontrol) with
    the topology string the emulated operator pushed (``SlinkyEmulator.topology``; the local
    Slurm 22.05 has no ``topology_str``). ``frozen`` makes it report a stale value."""

    def __init__(self, driver: ScontrolDriver, emu: SlinkyEmulator) -> None:
        self.driver = driver
        self.emu = emu
        self.frozen: str | None = None

    async def state(self, node: str) -> SlurmNodeState:
        st = await self.driver.state(node)
        topo = self.frozen if self.frozen is not None else self.emu.topology.get(node, "")
        return dataclasses.replace(st, topology=topo)


@dataclass
class World:
    api: client.ApiClient
    namespace: str
    emu: SlinkyEmulator
    scontrol: ScontrolDriver
    suffix: str
    nodes: list[str] = field(default_factory=list)

    @property
    def core(self) -> client.CoreV1Api:
        return client.CoreV1Api(self.api)

    async def node(self, name: str, *, pool: bool = True,
                   labels: Mapping[str, str] | None = None) -> str:
        full = f"{name}-{self.suffix}"
        all_labels = {**({POOL: self.namespace} if pool else {}), **(labels or {})}
        await self.core.create_node(fake_node(full, labels=all_labels))  # type: ignore[arg-type]
        self.nodes.append(full)
        return full

    async def patch_node(self, name: str, body: dict[str, Any]) -> None:
        await self.core.patch_node(name, body,
                                   _content_type="application/merge-patch+json")  # type: ignore[call-arg]

    async def node_annotation(self, name: str) -> str | None:
        n = await self.core.read_node(name)
        return (n.metadata.annotations or {}).get(TOPOLOGY_ANNOTATION)

    async def nodeset(self) -> None:
        body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "NodeSet",
                "metadata": {"name": "topo"},
                "spec": {"controllerRef": {"name": CLUSTER}, "replicas": 1,
                         "scalingMode": "StatefulSet",
                         "template": {"spec": {"nodeSelector": {POOL: self.namespace}}}}}
        await client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            GROUP, VERSION, self.namespace, PLURAL, body)

    async def pod_on(self, host: str, *, within: float = 60.0) -> dict[str, Any]:
        """Reconcile (the operator's passes) until the slurmd pod runs on ``host``."""
        pods = SlinkyPods(self.api, self.namespace)

        async def probe() -> dict[str, Any] | None:
            await self.emu.reconcile_once()
            for p in await pods.pods():
                if (p.get("spec") or {}).get("nodeName") == host and \
                        (p.get("status") or {}).get("phase") == "Running":
                    return p
            return None

        got: dict[str, Any] | None = await wait_for(
            probe, timeout=within,
            description=f"the slurmd pod of {SLURM_NODE} Running on {host}")
        assert got is not None
        return got

    def topology(self, **kw: Any) -> KubeTopology:
        kw.setdefault("slurm", self.scontrol)
        return KubeTopology(KubeNodes(self.api), pods=SlinkyPods(self.api, self.namespace), **kw)


@pytest.fixture
async def world(kube_stack: KubeStack, kube_api: client.ApiClient, namespace: str,
                topo_slurm: LocalSlurm) -> AsyncIterator[World]:
    await install(kube_api)
    emu = SlinkyEmulator(kube_api, namespace=namespace, slurm_env=topo_slurm.env(),
                         cluster=CLUSTER)
    w = World(kube_api, namespace, emu, ScontrolDriver(env=topo_slurm.env()),
              namespace.rsplit("-", 1)[-1])
    try:
        yield w
    finally:
        await emu.aclose()
        for n in w.nodes:
            with contextlib.suppress(Exception):
                await w.core.delete_node(n)


# -- labels source ---------------------------------------------------------------------------


async def test_verified_done_after_the_operator_copies_the_annotation(world: World) -> None:
    a = await world.node("a", labels=TIERS)
    await world.nodeset()
    await world.pod_on(a)
    topo = world.topology()
    r = await topo.annotate("inc-1", a, SLURM_NODE)
    assert r.outcome is StepOutcome.PENDING  # written, but the operator has not run since
    assert "has not propagated" in r.detail
    assert f"{world.namespace}/{SLURM_NODE}" in r.detail
    assert await world.node_annotation(a) == SPEC
    await world.emu.reconcile_once()
    r = await topo.annotate("inc-1", a, SLURM_NODE)
    assert r.outcome is StepOutcome.DONE, r.detail
    assert r.data["topology"] == SPEC
    assert r.data["checks"] == "placement,pod"
    assert "Slurm does not report the topology of topo-0" in r.detail  # Slurm 22.05
    # Slurm >= 25.05 reports what the operator pushed: checked too
    r = await world.topology(slurm=Slurm2505(world.scontrol, world.emu)).annotate(
        "inc-1", a, SLURM_NODE)
    assert r.outcome is StepOutcome.DONE
    assert r.data["checks"] == "placement,pod,slurm"


async def test_pending_while_the_pod_is_elsewhere_until_it_moves(world: World) -> None:
    a = await world.node("a")
    b = await world.node("b", pool=False, labels=TIERS)
    await world.nodeset()
    pod = await world.pod_on(a)
    topo = world.topology()
    r = await topo.annotate("inc-1", b, SLURM_NODE)
    assert r.outcome is StepOutcome.PENDING
    assert r.detail == (f"placement: the slurmd pod {world.namespace}/{SLURM_NODE} of Slurm "
                        f"node {SLURM_NODE} runs on {a}, not on {b}")
    # the move: only b may host the NodeSet now; the operator recreates the deleted pod there
    await world.patch_node(a, {"metadata": {"labels": {POOL: None}}})
    await world.patch_node(b, {"metadata": {"labels": {POOL: world.namespace}}})
    await world.core.delete_namespaced_pod(pod["metadata"]["name"], world.namespace,
                                           grace_period_seconds=0)
    await world.pod_on(b)
    await world.emu.reconcile_once()
    r = await topo.annotate("inc-1", b, SLURM_NODE)
    assert r.outcome is StepOutcome.DONE, r.detail
    assert r.data["topology"] == SPEC


async def test_pending_while_slurm_reports_another_topology(world: World) -> None:
    a = await world.node("a", labels=TIERS)
    await world.nodeset()
    await world.pod_on(a)
    slurm = Slurm2505(world.scontrol, world.emu)
    slurm.frozen = "default:spine0:leaf0"
    topo = world.topology(slurm=slurm)
    await topo.annotate("inc-1", a, SLURM_NODE)
    await world.emu.reconcile_once()
    r = await topo.annotate("inc-1", a, SLURM_NODE)
    assert r.outcome is StepOutcome.PENDING
    assert r.detail == (f"Slurm reports topology default:spine0:leaf0 for {SLURM_NODE}, the "
                        f"annotation on {a} says {SPEC}: waiting for the operator to push it")
    slurm.frozen = None
    assert (await topo.annotate("inc-1", a, SLURM_NODE)).outcome is StepOutcome.DONE


async def test_without_a_nodeset_placement_is_not_checked(world: World) -> None:
    a = await world.node("a", labels=TIERS)
    r = await world.topology().annotate("inc-1", a, SLURM_NODE)
    assert r.outcome is StepOutcome.DONE
    assert "no Slinky slurmd pods (no NodeSet)" in r.detail
    assert r.data["topology"] == SPEC
    assert await world.node_annotation(a) == SPEC
    r = await world.topology().annotate("inc-1", a, "not-in-slurm")
    assert r.outcome is StepOutcome.PENDING
    assert r.detail == "Slurm does not know node not-in-slurm yet"


# -- topograph source ------------------------------------------------------------------------


@dataclass
class TopographDouble:
    """A TEST DOUBLE of NVIDIA topograph's documented API (docs/api.md), not topograph:

    * ``POST /v1/generate`` with ``{provider, engine, nodes}``: the engine must be ``slinky``
      with the parameters its docs call required (``namespace``, ``podSelector``,
      ``topologyConfigmapName``, ``topologyConfigPath``), else 400 with the reason; answers
      202 with a request id. Requests are merged as with ``requestAggregationDelay``: they are
      processed together when the test calls :meth:`release`.
    * Processing, as the slinky engine with ``useDynamicNodes: true`` does: for every Node that
      runs a Ready pod matched by ``podSelector`` in ``namespace`` (and matches
      ``nodeSelector``), write ``topology.slinky.slurm.net/spec`` = ``default:<switches from the
      top>`` from the "provider's" answer (:attr:`model`), only when it changed. (The topology
      ConfigMap is left out.)
    * ``GET /v1/topology?uid=``: 202 while pending, 200 once processed, 404 for an unknown id;
      ``GET /healthz``: 200.
    """

    api: client.ApiClient
    model: dict[str, list[str]] = field(default_factory=dict)  # node → switches, closest first
    url: str = ""
    posts: int = 0
    pending: dict[str, dict[str, Any]] = field(default_factory=dict)
    done: set[str] = field(default_factory=set)
    errors: list[str] = field(default_factory=list)

    async def generate(self, request: web.Request) -> web.Response:
        self.posts += 1
        body = await request.json()
        engine = body.get("engine") or {}
        params = engine.get("params") or {}
        if engine.get("name") != "slinky":
            return web.Response(status=400, text=f"unsupported engine {engine.get('name')!r}")
        for key in ("namespace", "podSelector", "topologyConfigmapName", "topologyConfigPath"):
            if not params.get(key):
                return web.Response(status=400, text=f"slinky engine: missing parameter {key}")
        uid = secrets.token_hex(8)
        self.pending[uid] = params
        return web.Response(status=202, text=uid)

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="OK")

    async def topology(self, request: web.Request) -> web.Response:
        uid = request.query.get("uid", "")
        if uid in self.done:
            return web.Response(status=200, text="OK")
        if uid in self.pending:
            return web.Response(status=202, text="request is being processed")
        return web.Response(status=404, text=f"no data for request ID {uid}")

    async def release(self) -> None:
        """The aggregation delay is over: process every pending request (merged)."""
        batch, self.pending = self.pending, {}
        for params in {repr(sorted(p.items())): p for p in batch.values()}.values():
            await self._process(params)
        self.done |= set(batch)

    async def _process(self, params: Mapping[str, Any]) -> None:
        core = client.CoreV1Api(self.api)
        match = params["podSelector"].get("matchLabels") or {}
        selector = ",".join(f"{k}={v}" for k, v in match.items())
        pods = await core.list_namespaced_pod(params["namespace"], label_selector=selector)
        hosts = {p.spec.node_name for p in pods.items if p.spec.node_name and any(
            c.type == "Ready" and c.status == "True" for c in (p.status.conditions or []))}
        for host in sorted(hosts):
            node = await core.read_node(host)
            labels = node.metadata.labels or {}
            if any(labels.get(k) != v for k, v in (params.get("nodeSelector") or {}).items()):
                continue
            switches = self.model.get(host)
            if not switches or not params.get("useDynamicNodes"):
                continue
            spec = ":".join(["default", *reversed(switches)])
            if (node.metadata.annotations or {}).get(TOPOLOGY_ANNOTATION) != spec:
                await core.patch_node(host, {"metadata": {"annotations": {
                    TOPOLOGY_ANNOTATION: spec}}},
                    _content_type="application/merge-patch+json")  # type: ignore[call-arg]


@pytest.fixture
async def topograph(kube_api: client.ApiClient) -> AsyncIterator[TopographDouble]:
    double = TopographDouble(kube_api)
    app = web.Application()
    app.router.add_post("/v1/generate", double.generate)
    app.router.add_get("/v1/topology", double.topology)
    app.router.add_get("/healthz", double.healthz)
    runner = await serve(app, "127.0.0.1", 0)
    double.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield double
    finally:
        await runner.cleanup()


def slinky_request(namespace: str, **params: Any) -> dict[str, Any]:
    """What an operator would mount: the slinky engine annotating Nodes dynamically."""
    return {"provider": {"name": "test", "params": {}},
            "engine": {"name": "slinky", "params": {
                "namespace": namespace,
                "podSelector": {"matchLabels": {"app.kubernetes.io/component": "worker"}},
                "nodeSelector": {POOL: namespace},
                "topologyConfigmapName": "slurm-config",
                "topologyConfigPath": "topology.yaml",
                "plugin": "topology/tree",
                "useDynamicNodes": True, **params}}}


async def test_topograph_mode_waits_for_topograph_then_verifies(
        world: World, topograph: TopographDouble) -> None:
    a = await world.node("a", labels=TIERS)  # labels say spine1/leaf3: topograph says otherwise
    await world.nodeset()
    await world.pod_on(a)
    topograph.model[a] = ["leaf7", "spine2"]
    client_ = TopographClient(topograph.url, slinky_request(world.namespace), backoff=0.05)
    topo = world.topology(topograph=client_, slurm=Slurm2505(world.scontrol, world.emu))
    for _ in range(2):
        r = await topo.annotate("inc-1", a, SLURM_NODE)
        assert r.outcome is StepOutcome.PENDING
        assert "waiting for topograph request" in r.detail
    assert topograph.posts == 1  # once per incident
    assert await world.node_annotation(a) is None  # healer computed nothing from labels
    await topograph.release()
    assert await world.node_annotation(a) == "default:spine2:leaf7"
    r = await topo.annotate("inc-1", a, SLURM_NODE)
    assert r.outcome is StepOutcome.PENDING
    assert "has not propagated" in r.detail
    await world.emu.reconcile_once()
    r = await topo.annotate("inc-1", a, SLURM_NODE)
    assert r.outcome is StepOutcome.DONE, r.detail
    assert dict(r.data) == {"topology": "default:spine2:leaf7", "source": "topograph",
                            "slurmNode": SLURM_NODE, "checks": "placement,pod,slurm"}
    assert topograph.posts == 1


async def test_topograph_refusal_fails_with_its_answer(world: World,
                                                       topograph: TopographDouble) -> None:
    a = await world.node("a")
    body = slinky_request(world.namespace)
    del body["engine"]["params"]["topologyConfigmapName"]
    topo = world.topology(topograph=TopographClient(topograph.url, body, backoff=0.05))
    r = await topo.annotate("inc-1", a, SLURM_NODE)
    assert r.outcome is StepOutcome.FAILED
    assert r.detail == (f"topograph at {topograph.url}: POST /v1/generate refused the request: "
                        "HTTP 400: slinky engine: missing parameter topologyConfigmapName")
    assert topograph.posts == 1  # a 4xx is not retried


async def test_topograph_unreachable_is_transient(world: World) -> None:
    a = await world.node("a")
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}"
    topo = world.topology(topograph=TopographClient(url, slinky_request(world.namespace),
                                                    backoff=0.05, attempts=2))
    with pytest.raises(TransientError) as e:
        await topo.annotate("inc-1", a, SLURM_NODE)
    assert str(e.value).startswith(f"topograph at {url}: POST /v1/generate: topograph is "
                                   "unreachable")
    assert topo.requests == {}  # nothing was accepted: the next attempt POSTs again
