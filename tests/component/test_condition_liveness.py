"""A foreign detector's node condition (NPD-style) through the runtime on fakes: it drives a
remediation while its detector heartbeats, goes stale (unknown, never disruptive) when the
heartbeats stop, costs no evaluation per heartbeat, and where the spare comes from is
reported (or refused with ``swap.requireSameDomain``)."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import pytest

from healer.adapters.kube.crd import reason_of
from healer.core import rules as cp
from healer.core.model import NodeCondition, NodeView, Placement, Severity
from healer.core.phases import Phase
from healer_dev.testing import FakeNodes, fake_ports
from tests.builders import GPU_LABELS, policies, policy
from tests.component.test_controller import DOMAIN, Harness, fleet, make

NPD_RULE = cp.ConditionRule("npd-gpu-problem", Severity.FAILED, "GPUProblem",
                            frozenset({"True"}), re.compile("^(NVLinkDown|GpuLost)$"),
                            stale_after=1500)


def _ps(swap: cp.SwapStep | None = None) -> cp.PolicySet:
    return policies(policy(rules=(NPD_RULE,), steps=cp.Steps(poll_interval=5,
                                                             swap=swap or cp.SwapStep())))


def _npd(h: Harness, node: str, status: str, heartbeat: float, since: float | None = None,
         reason: str = "NVLinkDown") -> None:
    nodes: FakeNodes = h.fakes["nodes"]  # type: ignore[assignment]
    nodes.set_condition(node, NodeCondition(
        "GPUProblem", status, reason if status == "True" else "GPUIsFine",
        "NVLink 3 down (npd custom plugin)", since if since is not None else heartbeat,
        heartbeat))


@pytest.fixture
async def h() -> AsyncIterator[Harness]:
    harness = await make(_ps())
    yield harness
    await harness.close()


async def test_a_heartbeating_foreign_condition_drives_a_remediation(h: Harness) -> None:
    _npd(h, "gpu-1", "True", h.clock.now())
    await h.run(60)
    assert h.phase("gpu-1") is Phase.REPAIR
    rec = next(r for r, _ in h.store.objects.values() if r.node == "gpu-1")
    assert rec.spare == "spare-a"
    assert rec.spare_placement == Placement("domain", "a", "a", "")
    assert "npd-gpu-problem" in rec.incident.rules
    assert "NVLinkDown" in rec.incident.summary


async def test_a_stale_foreign_condition_is_unknown_and_takes_nothing(h: Harness) -> None:
    _npd(h, "gpu-1", "True", h.clock.now() - 1800, since=h.clock.now() - 3600)
    await h.run(60)
    assert h.phase("gpu-1") is Phase.HEALTHY
    assert not h.store.objects
    nodes: FakeNodes = h.fakes["nodes"]  # type: ignore[assignment]
    assert not nodes.node("gpu-1").unschedulable
    assert h.fakes["slurm"].log == []  # type: ignore[attr-defined]
    assert h.ctl.stale_conditions() == {"condition/GPUProblem": 1}


async def test_a_detector_that_stops_goes_stale_on_a_timer_not_a_poll(h: Harness) -> None:
    since = h.clock.now()
    _npd(h, "gpu-2", "False", since)
    await h.run(10)
    before = h.ctl.engine.evaluations
    for _ in range(20):  # the detector re-publishes every 60 s: no evaluation per heartbeat
        await h.clock.advance(60)
        _npd(h, "gpu-2", "False", h.clock.now(), since=since)
    await h.run(5)
    # a few timer evaluations (one per window at most), never one per heartbeat
    assert h.ctl.engine.evaluations - before <= 3
    assert h.ctl.stale_conditions() == {}
    # the detector dies: nothing arrives any more, the timer finds the condition stale
    await h.run(1500, step=60)
    assert h.ctl.stale_conditions() == {"condition/GPUProblem": 1}
    assert h.ctl.engine.last_state["gpu-2"].value == "stale"
    assert h.ctl.debug_state()["staleConditions"] == {"gpu-2": ["condition/GPUProblem"]}
    # it comes back: one heartbeat makes it fresh again at once
    _npd(h, "gpu-2", "False", h.clock.now(), since=since)
    await h.run(5)
    assert h.ctl.stale_conditions() == {}
    assert h.phase("gpu-2") is Phase.HEALTHY


async def test_a_spare_from_another_domain_is_reported() -> None:
    fakes = fake_ports([n for n in fleet() if n.name != "spare-a"])
    h = await make(_ps(), fakes=fakes)
    try:
        _npd(h, "gpu-1", "True", h.clock.now())
        await h.run(60)
        rec = next(r for r, _ in h.store.objects.values() if r.node == "gpu-1")
        assert rec.spare == "spare-b"
        assert rec.spare_placement is not None
        assert rec.spare_placement.level == "any"
        assert (rec.spare_placement.node_domain, rec.spare_placement.spare_domain) == ("a", "b")
        ev = [e for e in fakes["events"].events.values()  # type: ignore[attr-defined]
              if e[1] == "SpareFromOtherDomain"]
        assert len(ev) == 1
        node, _, etype, note = ev[0]
        assert (node, etype) == ("gpu-1", "Warning")
        assert "spare spare-b is in NVLink domain b, gpu-1 in a" in note
    finally:
        await h.close()


async def test_require_same_domain_holds_for_capacity_and_says_why() -> None:
    fakes = fake_ports([n for n in fleet() if n.name != "spare-a"])
    h = await make(_ps(cp.SwapStep(require_same_domain=True)), fakes=fakes)
    try:
        _npd(h, "gpu-1", "True", h.clock.now())
        await h.run(60)
        assert h.phase("gpu-1") is Phase.HELD_FOR_CAPACITY
        rec = next(r for r, _ in h.store.objects.values() if r.node == "gpu-1")
        assert not rec.spare
        assert reason_of(rec) == ("held for capacity: no free warm spare in NVLink domain a "
                                  "(swap.requireSameDomain: spares in other domains are not "
                                  "taken)")
        nodes: FakeNodes = fakes["nodes"]  # type: ignore[assignment]
        assert nodes.node("spare-b").labels.get("healer.io/role") == "spare"  # untouched
    finally:
        await h.close()


async def test_a_spare_from_another_domain_wakes_a_node_that_may_take_it() -> None:
    """Two nodes held for capacity; the older one requires its own domain. A spare appearing
    in a third domain wakes the one that may take it, at once (not the older one, which
    could not, leaving the other to the 5-minute backstop)."""
    strict = {"pin": "strict"}
    nodes = [NodeView("gpu-0", GPU_LABELS | strict | {DOMAIN: "a"}),
             NodeView("gpu-2", GPU_LABELS | {DOMAIN: "b"}),
             NodeView("spare-c", GPU_LABELS | {DOMAIN: "c"})]
    ps = policies(
        policy("strict", rules=(NPD_RULE,), priority=10, labels=GPU_LABELS | strict,
               steps=cp.Steps(poll_interval=5, swap=cp.SwapStep(require_same_domain=True))),
        policy("any", rules=(NPD_RULE,), steps=cp.Steps(poll_interval=5)))
    fakes = fake_ports(nodes)
    h = await make(ps, fakes=fakes)
    try:
        _npd(h, "gpu-0", "True", h.clock.now())
        await h.run(30)
        _npd(h, "gpu-2", "True", h.clock.now())
        await h.run(30)
        assert (h.phase("gpu-0"), h.phase("gpu-2")) == (Phase.HELD_FOR_CAPACITY,
                                                        Phase.HELD_FOR_CAPACITY)
        nodes_api: FakeNodes = fakes["nodes"]  # type: ignore[assignment]
        nodes_api.set("spare-c", labels={"healer.io/role": "spare"})
        await h.run(20)  # far less than the held nodes' backstop tick
        assert h.phase("gpu-2") is Phase.REPAIR
        rec = next(r for r, _ in h.store.objects.values() if r.node == "gpu-2")
        assert rec.spare == "spare-c"
        assert h.phase("gpu-0") is Phase.HELD_FOR_CAPACITY
    finally:
        await h.close()
