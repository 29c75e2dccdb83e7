"""Topology: the Slinky annotation on a replacement node."""

from __future__ import annotations

from healer.adapters.kube.nodes import KubeNodes
from healer.core.topology import slinky_topology_spec
from healer.ports import HookResult, StepOutcome

TOPOLOGY_ANNOTATION = "topology.slinky.slurm.net/spec"


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
