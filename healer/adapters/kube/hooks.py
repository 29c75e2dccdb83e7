"""Kubernetes-side hooks: topology annotation and the repair hand-off label contract."""

from __future__ import annotations

from healer.adapters.kube.nodes import KubeNodes
from healer.adapters.kube.spares import REPAIR_LABEL, REPAIR_RESULT
from healer.core.topology import slinky_topology_spec
from healer.ports import HookResult, StepOutcome

TOPOLOGY_ANNOTATION = "topology.slinky.slurm.net/spec"
REPAIR_INCIDENT = "healer.io/repair-incident"


class KubeTopology:
    """Writes ``topology.slinky.slurm.net/spec`` from the node's topograph labels, then reads
    it back; the Slinky operator copies it into the Slurm node's topology."""

    def __init__(self, nodes: KubeNodes, topology_name: str = "default") -> None:
        self.nodes = nodes
        self.topology_name = topology_name

    async def annotate(self, incident: str, node: str, slurm_node: str) -> HookResult:
        view = await self.nodes.get(node)
        spec = slinky_topology_spec(view, self.topology_name)
        if not spec:
            return HookResult(StepOutcome.DONE, "node has no topology labels",
                              {"topology": ""})
        if view.annotations.get(TOPOLOGY_ANNOTATION) != spec:
            await self.nodes.patch_metadata(node, annotations={TOPOLOGY_ANNOTATION: spec})
        back = await self.nodes.get(node)
        if back.annotations.get(TOPOLOGY_ANNOTATION) != spec:
            return HookResult(StepOutcome.PENDING, "topology annotation not visible yet")
        return HookResult(StepOutcome.DONE, "", {"topology": spec})


class LabelRepair:
    """The repair hand-off contract: healer labels the node ``healer.io/repair=pending`` (and
    notes the incident); whoever repairs it (a person, a ticketing system, a repair Job)
    annotates ``healer.io/repair-result=passed|failed``. A stale result from an earlier repair
    is removed when the hand-off starts."""

    def __init__(self, nodes: KubeNodes) -> None:
        self.nodes = nodes

    async def hand_off(self, incident: str, node: str, hook: str) -> HookResult:
        view = await self.nodes.get(node)
        if view.annotations.get(REPAIR_INCIDENT) == incident:
            return HookResult(StepOutcome.DONE)  # already handed off for this incident
        await self.nodes.patch_metadata(node, labels={REPAIR_LABEL: "pending"},
                                        annotations={REPAIR_INCIDENT: incident,
                                                     REPAIR_RESULT: None})
        return HookResult(StepOutcome.DONE)
