"""What a policy set selects on a given fleet: per NodeSet its nodes and its spares, and the
nodes that would be both. Pure (``healer validate --kubeconfig`` reads the Nodes,
:mod:`healer.selection`).

The policy loader refuses selectors that overlap by construction (:mod:`healer.policy.roles`);
labels can still make a node match both a NodeSet and a spare selector, or leave a NodeSet with
nothing to serve, and only the live fleet says so.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from healer.core.nodesets import NodeSetRules
from healer.core.rules import LabelSelector, PolicySet

__all__ = ["Census", "NodeSetCount", "census"]

#: At most this many node names are kept per finding (a message names a few, and counts all).
SHOWN = 5


@dataclass(slots=True)
class NodeSetCount:
    """One NodeSet on the fleet: ``selected`` nodes its selector matches, ``serving`` those it
    serves (it is the first by name to match them), ``spares`` the warm spares it may claim,
    ``also_spares`` serving nodes that some spare selector matches too (names, a few)."""

    nodeset: NodeSetRules
    selected: int = 0
    serving: int = 0
    spares: int = 0
    also_spares: int = 0
    examples: list[str] = field(default_factory=list)


@dataclass(slots=True)
class Census:
    nodes: int = 0
    fleet_spares: int = 0
    nodesets: list[NodeSetCount] = field(default_factory=list)
    policies: dict[str, int] = field(default_factory=dict)

    def problems(self) -> list[tuple[NodeSetRules, str]]:
        """(NodeSet, what is wrong) for each NodeSet the fleet contradicts."""
        out = []
        for c in self.nodesets:
            if c.also_spares:
                more = f" and {c.also_spares - len(c.examples)} more" if (
                    c.also_spares > len(c.examples)) else ""
                out.append((c.nodeset, f"{c.also_spares} node(s) of SlurmNodeSet "
                                       f"{c.nodeset.name!r} also match a spare selector "
                                       f"({', '.join(c.examples)}{more}): a node is a warm "
                                       "spare or a serving node, never both"))
            if c.selected and not c.serving:
                out.append((c.nodeset, f"SlurmNodeSet {c.nodeset.name!r} serves no node: the "
                                       f"{c.selected} node(s) its nodeSelector matches all "
                                       "belong to an earlier NodeSet (by name)"))
        return out


def _spare(sel: LabelSelector, labels: Mapping[str, str]) -> bool:
    return bool(sel.match_labels) and sel.matches(labels)


def census(policies: PolicySet, nodes: Iterable[tuple[str, Mapping[str, str]]]) -> Census:
    """Count what ``policies`` select among ``nodes`` (name and labels of each). O(nodes x
    (NodeSets + policies))."""
    out = Census(nodesets=[NodeSetCount(ns) for ns in policies.nodesets.items])
    by_name = {c.nodeset.name: c for c in out.nodesets}
    fleet = policies.fleet.spare_selector
    for name, labels in nodes:
        out.nodes += 1
        spare = policies.is_spare(labels)
        out.fleet_spares += _spare(fleet, labels)
        for p in policies.policies:
            if p.selector.matches(labels) and not spare:
                out.policies[p.name] = out.policies.get(p.name, 0) + 1
        owner = policies.nodesets.of(labels)
        for c in out.nodesets:
            ns = c.nodeset
            c.selected += ns.selector.matches(labels)
            c.spares += _spare(ns.spare_selector or fleet, labels)
        if owner is not None:
            c = by_name[owner.name]
            c.serving += 1
            if spare:
                c.also_spares += 1
                if len(c.examples) < SHOWN:
                    c.examples.append(name)
    for p in policies.policies:
        out.policies.setdefault(p.name, 0)
    return out
