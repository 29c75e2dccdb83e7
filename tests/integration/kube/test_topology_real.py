"""The topology step (KubeTopology) on the real kube-apiserver with kwok Nodes, SchedMD's real
slurm-operator (healer_dev.devstack.slinky_stack) over a real Slurm 26.05 and its slurmrestd,
and a test double of topograph's API.

The operator copies the Node's ``topology.slinky.slurm.net/spec`` to the slurmd pod from v1.1:
in its pod-binding webhook (the annotation is there when the pod is bound) and in every NodeSet
sync (the annotation changed later; the sync also sends it to Slurm as ``topology_str``, which
Slurm 26.05 keeps and ``scontrol`` reports as the node's ``Topology=``; the switches exist in
the LocalSlurm's topology.yaml). v1.0 never copies it: healer's capability probe
(:class:`OperatorCapabilities`, from the NodeSet CRD) must keep the step from waiting for a
copy that cannot come.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web
from kubernetes_asyncio import client

from healer.adapters.kube.nodes import KubeNodes
from healer.adapters.slinky import OperatorCapabilities, SlinkyPods
from healer.adapters.slurm.scontrol import ScontrolDriver
from healer.adapters.topograph import TopographClient
from healer.adapters.topology_step import KubeTopology
from healer.core.topology import TOPOLOGY_ANNOTATION
from healer.errors import TransientError
from healer.obs.http import serve
from healer.ports import StepOutcome
from healer_dev.devstack.slinky_stack import SlinkyStack
from tests.integration.slinky.conftest import POOL, Rig, host_of, serving
from tests.integration.waiting import wait_for

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(240)]

TIERS = {"fabric.topograph.run/tier-0": "leaf3", "fabric.topograph.run/tier-1": "spine1"}
SPEC = "default:spine1:leaf3"
V1_0 = pytest.mark.parametrize("operator_version", ["v1.0.0"], indirect=True)


def ready(pod: Mapping[str, Any]) -> bool:
    """The pod's Ready condition (the pod runtime sets it once its slurmd registered; what
    topograph's slinky engine selects pods by): the operator's conditions can show the Slurm
    node before it."""
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


@dataclass
class World:
    rig: Rig
    scontrol: ScontrolDriver
    slurm_node: str = ""

    @property
    def api(self) -> client.ApiClient:
        return self.rig.api

    @property
    def namespace(self) -> str:
        return self.rig.namespace

    @property
    def core(self) -> client.CoreV1Api:
        return self.rig.core

    async def node(self, name: str, *, pool: bool = True,
                   labels: Mapping[str, str] | None = None,
                   annotations: Mapping[str, str] | None = None) -> str:
        return await self.rig.node(name, pool=pool, labels=labels, annotations=annotations)

    async def patch_node(self, name: str, body: dict[str, Any]) -> None:
        await self.rig.patch_node(name, body)

    async def node_annotation(self, name: str) -> str | None:
        n = await self.core.read_node(name)
        return (n.metadata.annotations or {}).get(TOPOLOGY_ANNOTATION)

    async def nodeset(self) -> str:
        """A 1-replica NodeSet; returns the Slurm name of its pod."""
        ns = await self.rig.nodeset("topo", replicas=1)
        self.slurm_node = f"{ns}-0"
        return self.slurm_node

    async def pod_on(self, host: str, *, within: float = 150.0) -> dict[str, Any]:
        """Wait until the slurmd pod is Ready and serving on ``host`` (the operator mirrors
        Slurm into the pod on its re-list, every 30 s; after a long suite the first NodeSet of
        a module waited over 60 s once); on a timeout, say what the pod and the Node show."""
        try:
            return await self.rig.wait_pod(
                self.slurm_node, lambda p: host_of(p) == host and serving(p) and ready(p),
                within=within,
                description=f"the slurmd pod of {self.slurm_node} serving on {host}")
        except TimeoutError as e:
            pods = [(p["metadata"]["name"], host_of(p), (p.get("status") or {}).get("phase"),
                     [(c.get("type"), c.get("status")) for c in
                      (p.get("status") or {}).get("conditions") or []])
                    for p in await SlinkyPods(self.api, self.namespace).pods()]
            node = await self.core.read_node(host)
            raise AssertionError(
                f"{e}\npods: {pods}\nnode {host}: taints "
                f"{[(t.key, t.effect) for t in node.spec.taints or []]}, conditions "
                f"{[(c.type, c.status) for c in node.status.conditions or []]}") from None

    async def slurm_topology(self, name: str) -> str:
        return (await self.scontrol.state(name)).topology

    def topology(self, **kw: Any) -> KubeTopology:
        kw.setdefault("slurm", self.scontrol)
        kw.setdefault("copies_topology", OperatorCapabilities(self.api).copies_topology)
        return KubeTopology(KubeNodes(self.api), pods=SlinkyPods(self.api, self.namespace), **kw)

    async def done(self, topo: KubeTopology, node: str, *, within: float = 60.0,
                   incident: str = "inc-1") -> Any:
        """annotate() until DONE (the operator's sync copies within its requeue)."""
        async def probe() -> Any:
            r = await topo.annotate(incident, node, self.slurm_node)
            return r if r.outcome is StepOutcome.DONE else None

        return await wait_for(probe, timeout=within, interval=0.5,
                              description=f"topology of {self.slurm_node} on {node} DONE")


@pytest.fixture
async def world(kube_api: client.ApiClient, namespace: str, operator_version: str,
                slinky_cluster: SlinkyStack) -> AsyncIterator[World]:
    rig = Rig(kube_api, namespace, slinky_cluster, operator_version, secrets.token_hex(3))
    try:
        yield World(rig, ScontrolDriver(env=slinky_cluster.slurm.env()))
    finally:
        await rig.cleanup()


# -- labels source ---------------------------------------------------------------------------


async def test_verified_done_after_the_operator_copies_the_annotation(world: World) -> None:
    a = await world.node("a", labels=TIERS)
    name = await world.nodeset()
    await world.pod_on(a)
    topo = world.topology()
    r = await topo.annotate("inc-1", a, name)
    assert await world.node_annotation(a) == SPEC
    if r.outcome is StepOutcome.PENDING:  # written after the binding: the NodeSet sync copies
        assert "has not propagated" in r.detail
        assert f"{world.namespace}/{name}" in r.detail
    r = await world.done(topo, a, within=120)  # copied, then pushed to Slurm (topology_str)
    assert r.data["topology"] == SPEC
    assert r.data["checks"] == "placement,pod,registration,slurm"
    assert r.data["operatorCopiesTopology"] == "true"
    pod = await world.rig.pod(name)
    assert pod["metadata"]["annotations"][TOPOLOGY_ANNOTATION] == SPEC
    assert await world.slurm_topology(name) == SPEC  # Slurm 26.05's own view


async def test_binding_copies_an_annotation_that_is_already_there(world: World) -> None:
    a = await world.node("a", labels=TIERS, annotations={TOPOLOGY_ANNOTATION: SPEC})
    await world.nodeset()
    pod = await world.pod_on(a)
    assert pod["metadata"]["annotations"][TOPOLOGY_ANNOTATION] == SPEC  # the binding webhook
    r = await world.done(world.topology(), a, within=120)  # once Slurm has it too
    assert r.data["checks"] == "placement,pod,registration,slurm"


async def test_pending_while_the_pod_is_elsewhere_until_it_moves(world: World) -> None:
    a = await world.node("a")
    b = await world.node("b", pool=False, labels=TIERS)
    name = await world.nodeset()
    pod = await world.pod_on(a)
    topo = world.topology()
    r = await topo.annotate("inc-1", b, name)
    assert r.outcome is StepOutcome.PENDING
    assert r.detail == (f"placement: the slurmd pod {world.namespace}/{name} of Slurm "
                        f"node {name} runs on {a}, not on {b}")
    assert await world.node_annotation(b) == SPEC
    # the move: only b may host the NodeSet now; the operator recreates the deleted pod there
    # and the binding webhook copies b's annotation
    await world.patch_node(a, {"metadata": {"labels": {POOL: None}}})
    await world.patch_node(b, {"metadata": {"labels": {POOL: world.namespace}}})
    await world.core.delete_namespaced_pod(pod["metadata"]["name"], world.namespace)
    await world.pod_on(b)
    r = await world.done(topo, b, within=120)
    assert r.data["topology"] == SPEC
    assert r.data["checks"] == "placement,pod,registration,slurm"


async def test_pending_while_slurm_reports_another_topology(world: World) -> None:
    a = await world.node("a", labels=TIERS, annotations={TOPOLOGY_ANNOTATION: SPEC})
    name = await world.nodeset()
    await world.pod_on(a)
    topo = world.topology()
    await world.done(topo, a, within=120)
    # someone sets another topology in Slurm itself: healer waits for the operator to put
    # the annotation's back (its NodeSet sync compares Slurm's with the pod's). The operator
    # is stopped meanwhile: a sync of its own could put it back before healer reads it
    stack = world.rig.stack
    assert stack.operator is not None
    await asyncio.to_thread(stack.operator.stop)
    other = "default:spine2:leaf5"
    try:
        await asyncio.to_thread(stack.slurm.run, [
            "scontrol", "update", f"nodename={name}", f"topology={other}"])
        r = await topo.annotate("inc-1", a, name)
        assert r.outcome is StepOutcome.PENDING
        assert r.detail == (f"Slurm reports topology {other} for {name}, the annotation on "
                            f"{a} says {SPEC}: waiting for the operator to push it")
    finally:
        await asyncio.to_thread(stack.restart_operator)

    async def pushed() -> bool:
        return await world.slurm_topology(name) == SPEC

    await wait_for(pushed, timeout=120, description=f"the operator pushing {SPEC} for {name}")
    r = await world.done(topo, a)
    assert r.data["checks"] == "placement,pod,registration,slurm"


@V1_0
async def test_v1_0_never_copies_and_healer_does_not_wait_for_it(world: World) -> None:
    a = await world.node("a", labels=TIERS)
    name = await world.nodeset()
    pod = await world.pod_on(a)
    assert TOPOLOGY_ANNOTATION not in (pod["metadata"].get("annotations") or {})
    r = await world.topology().annotate("inc-1", a, name)
    assert r.outcome is StepOutcome.DONE, r.detail
    assert r.data["operatorCopiesTopology"] == "false"
    assert r.data["checks"] == "placement,registration"
    assert "nothing pushes it" in r.detail  # Slurm 26.05 keeps none for the node
    assert TOPOLOGY_ANNOTATION not in ((await world.rig.pod(name))["metadata"]
                                       .get("annotations") or {})


async def test_without_a_nodeset_placement_is_not_checked(world: World) -> None:
    a = await world.node("a", labels=TIERS)
    r = await world.topology(slurm=None).annotate("inc-1", a, "no-such-slurm-node")
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
    name = await world.nodeset()
    await world.pod_on(a)
    topograph.model[a] = ["leaf7", "spine2"]
    client_ = TopographClient(topograph.url, slinky_request(world.namespace), backoff=0.05)
    topo = world.topology(topograph=client_)
    for _ in range(2):
        r = await topo.annotate("inc-1", a, name)
        assert r.outcome is StepOutcome.PENDING
        assert "waiting for topograph request" in r.detail
    assert topograph.posts == 1  # once per incident
    assert await world.node_annotation(a) is None  # healer computed nothing from labels
    await topograph.release()
    assert await world.node_annotation(a) == "default:spine2:leaf7"
    r = await world.done(topo, a, within=120)  # the operator's sync copies it and pushes it
    assert dict(r.data) == {"topology": "default:spine2:leaf7", "source": "topograph",
                            "slurmNode": name, "checks": "placement,pod,registration,slurm",
                            "operatorCopiesTopology": "true"}
    assert topograph.posts == 1


async def test_topograph_refusal_fails_with_its_answer(world: World,
                                                       topograph: TopographDouble) -> None:
    a = await world.node("a")
    body = slinky_request(world.namespace)
    del body["engine"]["params"]["topologyConfigmapName"]
    topo = world.topology(topograph=TopographClient(topograph.url, body, backoff=0.05))
    r = await topo.annotate("inc-1", a, "topo-x-0")
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
        await topo.annotate("inc-1", a, "topo-x-0")
    assert str(e.value).startswith(f"topograph at {url}: POST /v1/generate: topograph is "
                                   "unreachable")
    assert topo.requests == {}  # nothing was accepted: the next attempt POSTs again
