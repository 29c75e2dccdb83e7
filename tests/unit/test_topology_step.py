"""The topology step's decisions (healer.adapters.topology_step.KubeTopology) with small
fakes of its ports, the topograph client against a local HTTP server, and the slurmrestd
``topology`` field."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from healer.adapters.slurm.parse import parse_node_json
from healer.adapters.topograph import (
    RequestState,
    RequestStatus,
    TopographClient,
    check_request,
    load_request,
)
from healer.adapters.topology_step import KubeTopology, same_topology
from healer.core.actions import ClaimSpare
from healer.core.model import NodeView, Placement, StepOutcome
from healer.core.topology import (
    TOPOLOGY_ANNOTATION,
    placement,
    placement_data,
    placement_of,
    rank_spares,
    same_domain_spares,
)
from healer.errors import ConfigError, NotFoundError, PermanentError, TransientError
from healer.obs.http import serve
from healer.ports import SlurmNodeState
from healer.runtime.executor import Executor, Ports
from healer_dev.testing import FakeNodes, fake_ports

TIERS = {"fabric.topograph.run/tier-0": "leaf1", "fabric.topograph.run/tier-1": "spine1"}
SPEC = "default:spine1:leaf1"


def pod(name: str, host: str, *, spec: str | None = None, hostname: str = "") -> dict[str, Any]:
    ann = {TOPOLOGY_ANNOTATION: spec} if spec is not None else {}
    return {"metadata": {"name": name, "namespace": "slurm", "annotations": ann,
                         "labels": {"app.kubernetes.io/name": "slurmd"}},
            "spec": {"nodeName": host, "hostname": hostname or name}}


@dataclass
class Pods:
    items: list[dict[str, Any]] = field(default_factory=list)

    async def pods(self) -> list[dict[str, Any]]:
        return [json.loads(json.dumps(p)) for p in self.items]

    def copy_annotation(self, nodes: FakeNodes) -> None:
        """What the Slinky operator does each reconcile."""
        for p in self.items:
            spec = nodes.node(p["spec"]["nodeName"]).annotations.get(TOPOLOGY_ANNOTATION)
            if spec is None:
                p["metadata"]["annotations"].pop(TOPOLOGY_ANNOTATION, None)
            else:
                p["metadata"]["annotations"][TOPOLOGY_ANNOTATION] = spec


@dataclass
class Slurm:
    topology: dict[str, str] = field(default_factory=dict)
    known: set[str] = field(default_factory=lambda: {"worker-0"})

    async def state(self, node: str) -> SlurmNodeState:
        if node not in self.known:
            raise NotFoundError(f"no Slurm node {node}")
        return SlurmNodeState(node, "IDLE", topology=self.topology.get(node, ""))


@dataclass
class Topograph:
    """A TopographAPI fake: ``answers`` are the successive statuses of the request."""

    nodes: FakeNodes
    writes: dict[str, str] = field(default_factory=dict)
    answers: list[RequestStatus] = field(default_factory=list)
    posts: int = 0
    refuse: str = ""
    down: bool = False

    async def generate(self) -> str:
        if self.down:
            raise TransientError("topograph at http://topograph:49021: topograph is unreachable")
        if self.refuse:
            raise PermanentError(self.refuse)
        self.posts += 1
        return f"req-{self.posts}"

    async def status(self, uid: str) -> RequestStatus:
        st = self.answers.pop(0) if self.answers else RequestStatus(RequestState.DONE)
        if st.state is RequestState.DONE:
            for n, spec in self.writes.items():
                self.nodes.set(n, annotations={TOPOLOGY_ANNOTATION: spec})
        return st


def world(*, labels: Mapping[str, str] = TIERS) -> tuple[FakeNodes, Pods, Slurm]:
    nodes = FakeNodes([NodeView("spare", dict(labels)), NodeView("bad", dict(TIERS))])
    return nodes, Pods([pod("worker-0", "spare")]), Slurm()


# -- labels mode -----------------------------------------------------------------------------


async def test_labels_mode_writes_then_waits_for_the_operator_then_is_done() -> None:
    nodes, pods, slurm = world()
    topo = KubeTopology(nodes, pods=pods, slurm=slurm)
    r = await topo.annotate("inc-1", "spare", "worker-0")
    assert r.outcome is StepOutcome.PENDING
    assert "has not propagated" in r.detail
    assert "worker-0" in r.detail
    assert nodes.node("spare").annotations[TOPOLOGY_ANNOTATION] == SPEC
    pods.copy_annotation(nodes)
    r = await topo.annotate("inc-1", "spare", "worker-0")
    assert r.outcome is StepOutcome.DONE
    assert dict(r.data) == {"topology": SPEC, "source": "labels", "slurmNode": "worker-0",
                            "checks": "placement,pod,registration",
                            "operatorCopiesTopology": "true"}
    assert "Slurm does not report the topology" in r.detail


async def test_a_pod_elsewhere_is_pending_with_where_it_runs() -> None:
    nodes, pods, slurm = world()
    pods.items = [pod("worker-0", "bad", spec=SPEC)]
    r = await KubeTopology(nodes, pods=pods, slurm=slurm).annotate("inc-1", "spare", "worker-0")
    assert r.outcome is StepOutcome.PENDING
    assert "placement" in r.detail
    assert "runs on bad, not on spare" in r.detail


async def test_an_unscheduled_or_missing_pod_is_pending() -> None:
    nodes, pods, slurm = world()
    pods.items = [pod("worker-0", ""), pod("worker-1", "bad")]
    topo = KubeTopology(nodes, pods=pods, slurm=slurm)
    r = await topo.annotate("inc-1", "spare", "worker-0")
    assert r.outcome is StepOutcome.PENDING
    assert "is not scheduled yet" in r.detail
    r = await topo.annotate("inc-1", "spare", "worker-7")
    assert r.outcome is StepOutcome.PENDING
    assert r.detail == "no slurmd pod for Slurm node worker-7 yet"


async def test_without_a_slurm_node_name_the_pod_on_the_node_is_used() -> None:
    nodes, pods, slurm = world()
    nodes.set("spare", annotations={TOPOLOGY_ANNOTATION: SPEC})
    pods.copy_annotation(nodes)
    r = await KubeTopology(nodes, pods=pods, slurm=slurm).annotate("inc-1", "spare", "")
    assert r.outcome is StepOutcome.DONE
    assert r.data["slurmNode"] == "worker-0"
    r = await KubeTopology(nodes, pods=pods, slurm=slurm).annotate("inc-1", "bad", "")
    assert r.outcome is StepOutcome.PENDING
    assert r.detail == "no slurmd pod on bad yet"


async def test_a_stale_copy_on_the_pod_is_pending() -> None:
    nodes, pods, slurm = world()
    pods.items = [pod("worker-0", "spare", spec="default:spine9:leaf9")]
    r = await KubeTopology(nodes, pods=pods, slurm=slurm).annotate("inc-1", "spare", "worker-0")
    assert r.outcome is StepOutcome.PENDING
    assert "it has default:spine9:leaf9" in r.detail


async def test_slurm_topology_must_match_when_reported() -> None:
    nodes, pods, slurm = world()
    nodes.set("spare", annotations={TOPOLOGY_ANNOTATION: SPEC})
    pods.copy_annotation(nodes)
    topo = KubeTopology(nodes, pods=pods, slurm=slurm)
    slurm.topology["worker-0"] = "default:spine9:leaf9"
    r = await topo.annotate("inc-1", "spare", "worker-0")
    assert r.outcome is StepOutcome.PENDING
    assert "Slurm reports topology default:spine9:leaf9 for worker-0" in r.detail
    slurm.topology["worker-0"] = f" {SPEC} "
    r = await topo.annotate("inc-1", "spare", "worker-0")
    assert r.outcome is StepOutcome.DONE
    assert r.data["checks"] == "placement,pod,registration,slurm"
    assert r.detail == ""
    slurm.known.clear()
    r = await topo.annotate("inc-1", "spare", "worker-0")
    assert r.outcome is StepOutcome.PENDING
    assert "Slurm does not know node worker-0" in r.detail


async def test_without_slinky_pods_placement_is_skipped_and_said() -> None:
    nodes, _, slurm = world()
    for pods in (None, Pods([])):
        r = await KubeTopology(nodes, pods=pods, slurm=slurm).annotate("i", "spare", "worker-0")
        assert r.outcome is StepOutcome.DONE
        assert "no Slinky slurmd pods" in r.detail
        assert r.data["checks"] == "registration"
        assert r.data["topology"] == SPEC


async def test_a_node_without_labels_verifies_what_it_carries() -> None:
    nodes, pods, slurm = world(labels={})
    r = await KubeTopology(nodes, pods=pods, slurm=slurm).annotate("i", "spare", "worker-0")
    assert r.outcome is StepOutcome.DONE
    assert r.data["topology"] == ""
    assert "node has no topology labels" in r.detail
    nodes.set("spare", annotations={TOPOLOGY_ANNOTATION: "default:b1"})
    r = await KubeTopology(nodes, pods=pods, slurm=slurm).annotate("i", "spare", "worker-0")
    assert r.outcome is StepOutcome.PENDING  # the operator has not copied it yet
    pods.copy_annotation(nodes)
    r = await KubeTopology(nodes, pods=pods, slurm=slurm).annotate("i", "spare", "worker-0")
    assert r.outcome is StepOutcome.DONE
    assert r.data["topology"] == "default:b1"
    assert nodes.node("spare").annotations[TOPOLOGY_ANNOTATION] == "default:b1"


def test_same_topology_ignores_order_and_blanks() -> None:
    assert same_topology("a:b1, t2:s1:s0", "t2:s1:s0,a:b1")
    assert not same_topology("default:b1", "default:b2")
    assert not same_topology("default:b1", "")


# -- topograph mode --------------------------------------------------------------------------


async def test_topograph_mode_posts_once_waits_then_verifies() -> None:
    nodes, pods, slurm = world(labels={})
    tg = Topograph(nodes, writes={"spare": "default:b7"},
                   answers=[RequestStatus(RequestState.RUNNING)] * 2)
    topo = KubeTopology(nodes, pods=pods, slurm=slurm, topograph=tg)
    for _ in range(2):
        r = await topo.annotate("inc-1", "spare", "worker-0")
        assert r.outcome is StepOutcome.PENDING
        assert "waiting for topograph request req-1" in r.detail
    assert tg.posts == 1
    assert TOPOLOGY_ANNOTATION not in nodes.node("spare").annotations
    r = await topo.annotate("inc-1", "spare", "worker-0")  # done: topograph wrote it
    assert r.outcome is StepOutcome.PENDING
    assert "has not propagated" in r.detail
    assert nodes.node("spare").annotations[TOPOLOGY_ANNOTATION] == "default:b7"
    pods.copy_annotation(nodes)
    slurm.topology["worker-0"] = "default:b7"
    r = await topo.annotate("inc-1", "spare", "worker-0")
    assert r.outcome is StepOutcome.DONE, r.detail
    assert r.data["topology"] == "default:b7"
    assert r.data["source"] == "topograph"
    assert r.data["checks"] == "placement,pod,registration,slurm"
    assert tg.posts == 1
    await topo.annotate("inc-2", "spare", "worker-0")
    assert tg.posts == 2  # once per incident


async def test_topograph_mode_never_computes_from_labels() -> None:
    nodes, pods, slurm = world()  # the spare has fabric labels
    tg = Topograph(nodes)  # completes without writing anything
    r = await KubeTopology(nodes, pods=pods, slurm=slurm, topograph=tg).annotate(
        "inc-1", "spare", "worker-0")
    assert r.outcome is StepOutcome.PENDING
    assert "completed without annotating it" in r.detail
    assert "useDynamicNodes" in r.detail
    assert TOPOLOGY_ANNOTATION not in nodes.node("spare").annotations


async def test_topograph_unknown_or_failed_request_is_sent_again() -> None:
    nodes, pods, slurm = world()
    tg = Topograph(nodes, answers=[RequestStatus(RequestState.UNKNOWN),
                                   RequestStatus(RequestState.FAILED, "HTTP 500: aws: throttled"),
                                   RequestStatus(RequestState.RUNNING)])
    topo = KubeTopology(nodes, pods=pods, slurm=slurm, topograph=tg)
    r = await topo.annotate("inc-1", "spare", "worker-0")
    assert r.outcome is StepOutcome.PENDING
    assert "does not know request req-1" in r.detail
    r = await topo.annotate("inc-1", "spare", "worker-0")
    assert r.outcome is StepOutcome.PENDING
    assert "request req-2 failed: HTTP 500: aws: throttled" in r.detail
    r = await topo.annotate("inc-1", "spare", "worker-0")
    assert "req-3" in r.detail
    assert tg.posts == 3


async def test_topograph_refusal_fails_and_unreachable_is_transient() -> None:
    nodes, pods, slurm = world()
    tg = Topograph(nodes, refuse="topograph ... refused the request: HTTP 400: bad engine")
    topo = KubeTopology(nodes, pods=pods, slurm=slurm, topograph=tg)
    r = await topo.annotate("inc-1", "spare", "worker-0")
    assert r.outcome is StepOutcome.FAILED
    assert "HTTP 400: bad engine" in r.detail
    tg.refuse, tg.down = "", True
    with pytest.raises(TransientError, match="unreachable"):
        await topo.annotate("inc-1", "spare", "worker-0")
    assert topo.requests == {}  # nothing was sent: the next attempt POSTs


# -- the topograph client against a local server ---------------------------------------------


@dataclass
class Server:
    url: str = ""
    answers: list[tuple[int, str]] = field(default_factory=list)
    status_answers: list[tuple[int, str]] = field(default_factory=list)
    seen: list[tuple[str, dict[str, str], bytes]] = field(default_factory=list)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    s = Server()

    async def generate(request: web.Request) -> web.Response:
        s.seen.append(("POST", dict(request.headers), await request.read()))
        status, text = s.answers.pop(0) if s.answers else (202, "uid-1")
        return web.Response(status=status, text=text)

    async def topology(request: web.Request) -> web.Response:
        s.seen.append(("GET", dict(request.query), b""))
        status, text = s.status_answers.pop(0) if s.status_answers else (200, "ok")
        return web.Response(status=status, text=text)

    app = web.Application()
    app.router.add_post("/v1/generate", generate)
    app.router.add_get("/v1/topology", topology)
    runner = await serve(app, "127.0.0.1", 0)
    s.url = f"http://127.0.0.1:{runner.addresses[0][1]}/"
    try:
        yield s
    finally:
        await runner.cleanup()


BODY = {"provider": {"name": "test", "params": {}},
        "engine": {"name": "slinky", "params": {"namespace": "slurm", "useDynamicNodes": True}}}


async def test_client_posts_the_body_unchanged_and_returns_the_id(server: Server) -> None:
    tc = TopographClient(server.url, BODY, backoff=0.01)
    assert await tc.generate() == "uid-1"
    method, headers, body = server.seen[0]
    assert method == "POST"
    assert headers["Content-Type"] == "application/json"
    assert json.loads(body) == BODY


async def test_client_retries_5xx_and_maps_4xx_with_the_body(server: Server) -> None:
    tc = TopographClient(server.url, BODY, backoff=0.01, attempts=3)
    server.answers = [(503, "busy"), (500, "oops"), (202, "uid-9")]
    assert await tc.generate() == "uid-9"
    server.answers = [(503, "busy")] * 3
    with pytest.raises(TransientError, match="HTTP 503: busy"):
        await tc.generate()
    server.answers = [(400, "engine slinky: missing parameter topologyConfigmapName")]
    with pytest.raises(PermanentError, match="refused the request: HTTP 400: engine slinky: "
                                             "missing parameter topologyConfigmapName"):
        await tc.generate()
    assert len([s for s in server.seen if s[0] == "POST"]) == 7  # no retry of the 400


async def test_client_reads_request_status(server: Server) -> None:
    tc = TopographClient(server.url, BODY, backoff=0.01)
    server.status_answers = [(202, "pending"), (404, "no data for request ID x"),
                             (500, "slinky engine: forbidden"), (503, "busy"), (200, "done")]
    got = [await tc.status("x") for _ in range(4)]
    assert [s.state for s in got] == [RequestState.RUNNING, RequestState.UNKNOWN,
                                      RequestState.FAILED, RequestState.DONE]
    assert got[2].detail == "HTTP 500: slinky engine: forbidden"
    assert server.seen[0] == ("GET", {"uid": "x"}, b"")


async def test_client_unreachable_is_transient_and_names_the_url() -> None:
    tc = TopographClient("http://127.0.0.1:9", BODY, backoff=0.01, attempts=2, timeout=2)
    with pytest.raises(TransientError, match=r"topograph at http://127.0.0.1:9: POST "
                                             r"/v1/generate: topograph is unreachable"):
        await tc.generate()
    assert "creds" not in repr(tc)
    assert "test" not in repr(tc)


def test_load_request(tmp_path: Path) -> None:
    f = tmp_path / "req.json"
    f.write_text(json.dumps(BODY))
    assert load_request(f) == BODY
    with pytest.raises(ConfigError, match="cannot read"):
        load_request(tmp_path / "missing.json")
    f.write_text("[1]")
    with pytest.raises(ConfigError, match="must be a JSON object"):
        load_request(f)
    f.write_text("{")
    with pytest.raises(ConfigError, match="is not JSON"):
        load_request(f)
    with pytest.raises(ConfigError, match="engine 'k8s' does not annotate Nodes"):
        check_request({"engine": {"name": "k8s"}})
    with pytest.raises(ConfigError, match="useDynamicNodes is false"):
        check_request({"engine": {"name": "slinky", "params": {"useDynamicNodes": False}}})
    check_request({"provider": {"name": "aws"}})  # the engine from topograph's own config


def test_client_needs_a_url() -> None:
    with pytest.raises(ConfigError, match="--topograph-url"):
        TopographClient("", BODY)


# -- slurmrestd's node topology --------------------------------------------------------------


def test_slurmrestd_node_topology_is_parsed() -> None:
    base = {"name": "worker-0", "state": ["IDLE"]}
    assert parse_node_json({**base, "topology": "default:s1:l1"}).topology == "default:s1:l1"
    assert parse_node_json(base).topology == ""
    assert parse_node_json({**base, "topology": None}).topology == ""
    assert parse_node_json({**base, "topology": {"odd": 1}}).topology == ""


# -- how far the claimed spare is (issue 12: reported; swap.requireSameDomain) ---------------

DOM = "accelerator.topograph.run/domain"


def _gpu(name: str, dom: str | None, leaf: str, spare: bool = False) -> NodeView:
    labels = {"fabric.topograph.run/tier-0": leaf, "fabric.topograph.run/tier-1": "spine1"}
    if dom is not None:
        labels[DOM] = dom
    if spare:
        labels["healer.io/role"] = "spare"
    return NodeView(name, labels)


def test_placement_says_which_domain_and_tier() -> None:
    bad = _gpu("node-02", "nvl-a", "leaf1")
    assert placement(bad, _gpu("spare-a", "nvl-a", "leaf9")) == Placement("domain", "nvl-a",
                                                                        "nvl-a", "")
    far = placement(bad, _gpu("spare-b", "nvl-b", "leaf2"))
    assert far == Placement("tier-1", "nvl-a", "nvl-b", "spine1")
    assert not far.same_domain
    assert placement(bad, _gpu("spare-c", "nvl-c", "leaf1")).level == "tier-0"
    assert placement(bad, NodeView("spare-x", {})) == Placement("any", "nvl-a", "", "")
    assert placement_of(lambda k: placement_data(far).get(k, "")) == far
    assert placement_of(lambda k: "") is None
    # two nodes without a domain label are in the same (no) domain
    assert placement(_gpu("n", None, "leaf1"), _gpu("s", None, "leaf1")).same_domain


def test_same_domain_spares_keeps_only_the_domain() -> None:
    bad = _gpu("node-02", "nvl-a", "leaf1")
    spares = [_gpu("spare-b", "nvl-b", "leaf1"), _gpu("spare-a", "nvl-a", "leaf3")]
    assert [s.name for s in rank_spares(bad, spares)] == ["spare-a", "spare-b"]
    assert [s.name for s in same_domain_spares(bad, spares)] == ["spare-a"]
    assert same_domain_spares(bad, spares[:1]) == []


def _executor(nodes: list[NodeView]) -> tuple[Executor, dict[str, Any]]:
    fakes = fake_ports(nodes)
    return Executor(Ports(**fakes)), fakes


async def test_claim_reports_a_spare_from_another_domain() -> None:
    ex, _ = _executor([_gpu("node-02", "nvl-a", "leaf1"),
                       _gpu("spare-b", "nvl-b", "leaf2", spare=True)])
    (t,) = await ex.run(ClaimSpare("inc-1", "node-02"), None)
    assert t.result is not None
    assert t.result.status is StepOutcome.DONE
    assert dict(t.result.data) == {"spare": "spare-b", "match": "tier-1", "nodeDomain": "nvl-a",
                                   "spareDomain": "nvl-b", "switch": "spine1"}


async def test_require_same_domain_leaves_the_other_domain_alone() -> None:
    ex, fakes = _executor([_gpu("node-02", "nvl-a", "leaf1"),
                           _gpu("spare-b", "nvl-b", "leaf1", spare=True)])
    (t,) = await ex.run(ClaimSpare("inc-1", "node-02", same_domain=True), None)
    assert t.result is not None
    assert t.result.status is StepOutcome.UNAVAILABLE
    assert "NVLink domain nvl-a" in t.result.error
    assert "requireSameDomain" in t.result.error
    # nothing was claimed: the other domain's spare is still in the pool
    spare = fakes["nodes"].node("spare-b")
    assert spare.labels.get("healer.io/role") == "spare"
    assert "healer.io/claimed-by" not in spare.annotations
    fakes["nodes"].add(_gpu("spare-a", "nvl-a", "leaf5", spare=True))
    (t,) = await ex.run(ClaimSpare("inc-1", "node-02", same_domain=True), None)
    assert t.result is not None
    assert t.result.status is StepOutcome.DONE
    assert t.result.get("spare") == "spare-a"
    assert t.result.get("match") == "domain"
