"""Dead nodes through the real runtime on fakes and a manual clock (issue 20): the controller
declares a node dead when Kubernetes and Slurm agree, fences it on a provider's word only
(woken by the Node's change, not a poll), taints it out of service, swaps it; holds it without
one; a Node deleted by the cloud fences it; a new spare wakes a held node on the event that
created it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from healer.core import rules as cp
from healer.core.model import FenceProvider, NodeCondition, NodeView, Taint
from healer.core.phases import Phase
from healer.core.slurm_signals import finding_signal, next_finding
from healer.core.vocabulary import FENCED_ANNOTATION, OUT_OF_SERVICE_BY, OUT_OF_SERVICE_TAINT
from healer_dev.testing import fake_ports
from tests.builders import GPU_LABELS, policies, policy
from tests.component.test_controller import DOMAIN, Harness, fleet, make

STEPS = cp.Steps(poll_interval=5)


def dead_policy(providers: set[FenceProvider] | None = None,
                deadline: float = 600) -> cp.PolicySet:
    fencing = cp.Fencing(providers=frozenset(providers or {FenceProvider.MANUAL,
                                                           FenceProvider.NODE_DELETED}),
                         deadline=deadline)
    return policies(policy(steps=STEPS, dead=cp.DeadNode(enabled=True, after=30,
                                                         fencing=fencing)))


async def die(h: Harness, node: str) -> None:
    """What Kubernetes and Slurm say of a node that died: Ready Unknown, NOT_RESPONDING."""
    now = h.clock.now()
    h.fakes["nodes"].set_condition(  # type: ignore[attr-defined]
        node, NodeCondition("Ready", "Unknown", "NodeStatusUnknown", last_transition=now))
    found = next_finding(None, base="DOWN", flags=frozenset({"NOT_RESPONDING"}),
                         reason="Not responding", now=now)
    await h.ctl.on_signals([finding_signal(node, found, now)])


def record(h: Harness, node: str) -> Any:
    recs = [r for r, _ in h.store.objects.values() if r.node == node]
    return recs[-1]


def steps(h: Harness, node: str) -> list[str]:
    return [s.step for s in record(h, node).ledger]


async def test_a_dead_node_is_fenced_on_a_word_then_tainted_and_swapped() -> None:
    h = await make(dead_policy())
    nodes: Any = h.fakes["nodes"]
    try:
        await die(h, "gpu-1")
        await h.run(40)
        assert h.phase("gpu-1") is Phase.DEAD
        rec = record(h, "gpu-1")
        assert rec.death is not None
        assert not rec.death.fenced
        assert OUT_OF_SERVICE_TAINT not in {t.key for t in nodes.node("gpu-1").taints}
        fencing: Any = h.fakes["fencing"]
        polls = fencing.count("fence")
        # an admin says it is off: the Node's change wakes the fence step, no poll needed
        nodes.set("gpu-1", annotations={FENCED_ANNOTATION: "ops: PSU dead"})
        await h.run(1, step=0.5)
        assert fencing.count("fence") > polls
        await h.run(60)
        assert h.phase("gpu-1") is Phase.REPAIR
        rec = record(h, "gpu-1")
        assert rec.death is not None
        assert rec.death.provider is FenceProvider.MANUAL
        targets = [t.target for t in rec.history]
        assert targets[targets.index(Phase.DEAD) + 1] is Phase.OUT_OF_SERVICE, targets
        assert "drain" not in steps(h, "gpu-1")
        view: NodeView = nodes.node("gpu-1")
        assert OUT_OF_SERVICE_TAINT in {t.key for t in view.taints}
        assert view.annotations[OUT_OF_SERVICE_BY] == rec.incident.id
        assert view.unschedulable
        assert h.fakes["workload"].moves[rec.incident.id] == 1  # type: ignore[attr-defined]
        assert rec.spare == "spare-a"
        # back from repair: the out-of-service taint comes off only once it is Ready again
        nodes.set("gpu-1", annotations={"healer.io/repair-result": "passed"})
        await h.run(30)
        assert h.phase("gpu-1") is Phase.REPAIR
        assert OUT_OF_SERVICE_TAINT in {t.key for t in nodes.node("gpu-1").taints}
        nodes.set_condition("gpu-1", NodeCondition("Ready", "True",
                                                   last_transition=h.clock.now()))
        await h.run(30)
        assert h.phase("gpu-1") is Phase.DONE
        assert OUT_OF_SERVICE_TAINT not in {t.key for t in nodes.node("gpu-1").taints}
    finally:
        await h.close()


async def test_without_a_fence_it_is_held_and_nothing_irreversible_happens() -> None:
    h = await make(dead_policy(deadline=120))
    nodes: Any = h.fakes["nodes"]
    try:
        await die(h, "gpu-1")
        await h.run(200)
        assert h.phase("gpu-1") is Phase.HELD_FOR_FENCING
        assert not {"cordon", "claim-spare", "out-of-service"} & set(steps(h, "gpu-1"))
        assert OUT_OF_SERVICE_TAINT not in {t.key for t in nodes.node("gpu-1").taints}
        assert "HeldForFencing" in h.fakes["events"].reasons("gpu-1")  # type: ignore[attr-defined]
        # it answers again: back to normal, nothing to undo
        nodes.set_condition("gpu-1", NodeCondition("Ready", "True",
                                                   last_transition=h.clock.now()))
        await h.ctl.on_signals([finding_signal("gpu-1", None, h.clock.now())])
        await h.run(30)
        assert h.phase("gpu-1") is Phase.DONE
        assert record(h, "gpu-1").outcome == "recovered"
    finally:
        await h.close()


async def test_a_node_the_cloud_deleted_is_fenced_and_its_spare_chosen_as_it_was() -> None:
    h = await make(dead_policy())
    nodes: Any = h.fakes["nodes"]
    try:
        await die(h, "gpu-2")  # NVLink domain b
        await h.run(40)
        assert h.phase("gpu-2") is Phase.DEAD
        nodes.delete("gpu-2")
        await h.run(60)
        rec = record(h, "gpu-2")
        assert rec.death is not None
        assert rec.death.provider is FenceProvider.NODE_DELETED
        assert rec.spare == "spare-b"  # its domain's, from the labels it had
        assert h.phase("gpu-2") is Phase.DONE
        assert rec.outcome == "replaced"
        assert not {"cordon", "out-of-service", "mark-repair"} & set(steps(h, "gpu-2"))
    finally:
        await h.close()


async def test_a_spare_created_while_a_node_is_held_wakes_it_on_that_event() -> None:
    """Issue 20 item 0: a warm spare *created* (not relabelled) while a remediation is
    HeldForCapacity wakes it at once, not on the 300 s backstop."""
    fakes = fake_ports([v for v in fleet() if "spare" not in v.name])
    h = await make(fakes=fakes)
    try:
        await h.xid("gpu-0")
        await h.run(60)
        assert h.phase("gpu-0") is Phase.HELD_FOR_CAPACITY
        labels: Mapping[str, str] = GPU_LABELS | {DOMAIN: "a", "healer.io/role": "spare"}
        fakes["nodes"].add(NodeView("spare-new", labels, {}, False,  # type: ignore[attr-defined]
                                    (Taint("healer.io/spare", "true", "NoSchedule"),)))
        await h.run(10, step=1)  # well under the backstop
        assert h.phase("gpu-0") in (Phase.SWAPPING, Phase.ANNOTATING, Phase.UNDRAINING,
                                    Phase.REPAIR)
        assert record(h, "gpu-0").spare == "spare-new"
    finally:
        await h.close()
