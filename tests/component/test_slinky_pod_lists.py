"""How many slurmd pods a Slinky drain and undrain read (issue 24 item 3): the executor gives
the driver the Kubernetes node beside the Slurm name, so each read is one Node's pods,
filtered by the API server (``spec.nodeName``), never every slurmd pod of the fleet.

Measured with a counting fake of the pod LIST (the real API server's filtering by
``spec.nodeName`` is what the fake does; the flows tests drain through the real operator).
Before: a drain made 2 LISTs of every slurmd pod (Kubernetes node → Slurm name, then Slurm
name → pod), an undrain 3; after: the same LISTs, each returning one Node's pods.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, cast

from healer.adapters.slinky import SLURMD_SELECTOR, SlinkyDriver
from healer.core import actions as a
from healer.core.model import StepOutcome
from healer.runtime.executor import Executor, Ports
from healer_dev.testing import fake_ports
from tests.builders import node

FLEET = 50
NAMESPACE = "slurm"


def _pod(i: int) -> dict[str, Any]:
    return {"metadata": {"name": f"gpu-{i}", "namespace": NAMESPACE,
                         "labels": {"app.kubernetes.io/name": "slurmd",
                                    "app.kubernetes.io/instance": "gpu"}},
            "spec": {"nodeName": f"n{i}", "hostname": f"gpu-{i}"},
            "status": {"conditions": [{"type": "SlurmNodeStateIdle", "status": "True"}]}}


@dataclass
class CountingPods:
    """``CoreV1Api.list_namespaced_pod`` over a fleet of slurmd pods, counting each LIST and
    the pods it returned; filters by ``spec.nodeName`` as the API server does."""

    pods: list[dict[str, Any]]
    lists: list[tuple[str, int]] = field(default_factory=list)  # (field selector, pods)

    async def list_namespaced_pod(self, namespace: str, *, label_selector: str,
                                  field_selector: str = "") -> dict[str, Any]:
        assert namespace == NAMESPACE
        assert label_selector == SLURMD_SELECTOR
        items = self.pods
        if field_selector:
            key, _, value = field_selector.partition("=")
            assert key == "spec.nodeName"
            items = [p for p in items if p["spec"]["nodeName"] == value]
        self.lists.append((field_selector, len(items)))
        return {"items": items}


class NodeSetSpecs:
    async def get_namespaced_custom_object(self, *args: str) -> dict[str, Any]:
        return {"spec": {"updateStrategy": {"type": "RollingUpdate",
                                            "rollingUpdate": {"maxUnavailable": 1}}}}


class KnownOperator:
    async def v1_1(self) -> bool | None:
        return True


def _executor() -> tuple[Executor, CountingPods]:
    fakes = fake_ports([node(f"n{i}") for i in range(FLEET)])
    pods = CountingPods([_pod(i) for i in range(FLEET)])
    driver = SlinkyDriver(cast(Any, object()), fakes["nodes"], namespace=NAMESPACE,
                          nodeset="gpu", capabilities=cast(Any, KnownOperator()))
    driver.pods.core = cast(Any, pods)
    driver.nodesets.co = cast(Any, NodeSetSpecs())
    fakes.update(slurm=driver, slurm_names=driver.pods.slurm_name_on)
    return Executor(Ports(**fakes)), pods


async def test_a_slinky_drain_reads_only_the_drained_nodes_pods() -> None:
    ex, pods = _executor()
    [t] = await ex.run(a.DrainSlurm("inc-1", "n7", reason="healer: XID 79"), None)
    assert t.result is not None
    assert t.result.status is StepOutcome.DONE, t.result
    assert dict(t.result.data)["slurmNode"] == "gpu-7"
    assert pods.lists == [("spec.nodeName=n7", 1), ("spec.nodeName=n7", 1)]
    assert (await ex.p.nodes.get("n7")).unschedulable  # the cordon the operator drains on


async def test_a_slinky_undrain_reads_only_the_nodes_pods() -> None:
    ex, pods = _executor()
    await ex.run(a.DrainSlurm("inc-1", "n7", reason="healer: XID 79"), None)
    pods.lists.clear()
    await ex.run(a.UndrainSlurm("inc-1", "n7", target="n7"), None)
    assert pods.lists
    assert all(sel == "spec.nodeName=n7" for sel, _ in pods.lists), pods.lists
    assert all(n == 1 for _, n in pods.lists), pods.lists
    assert not (await ex.p.nodes.get("n7")).unschedulable


async def test_a_slurm_name_not_on_the_given_node_is_found_among_every_pod() -> None:
    """A Slurm name given with a Node it no longer runs on (it moved): the driver still finds
    its pod, at the cost of one LIST of every slurmd pod."""
    ex, pods = _executor()
    [t] = await ex.run(a.DrainSlurm("inc-1", "n7", slurm_node="gpu-8",
                                    reason="healer: XID 79"), None)
    assert t.result is not None
    assert t.result.status is StepOutcome.DONE, t.result
    assert pods.lists == [("spec.nodeName=n7", 1), ("", FLEET)]
    assert (await ex.p.nodes.get("n8")).unschedulable
