"""Topology: which spare is closest to a failed node, and the Slinky topology string a node's
fabric labels imply. Pure; the labels are the ones NVIDIA topograph writes."""

from __future__ import annotations

from collections.abc import Iterable

from healer.core.model import NodeView

DOMAIN_LABEL = "accelerator.topograph.run/domain"
TIER_PREFIX = "fabric.topograph.run/tier-"
MAX_TIERS = 8


def tiers(node: NodeView) -> list[str]:
    """The node's switch at each fabric tier, closest (tier-0) first, up to the first gap."""
    out: list[str] = []
    for i in range(MAX_TIERS):
        v = node.labels.get(f"{TIER_PREFIX}{i}")
        if v is None:
            break
        out.append(v)
    return out


def closeness(bad: NodeView, spare: NodeView) -> tuple[int, str]:
    """Sort key: same NVLink (accelerator) domain first, then the lowest shared fabric tier,
    then anything; ties by name so the choice is deterministic."""
    dom = bad.labels.get(DOMAIN_LABEL)
    if dom and spare.labels.get(DOMAIN_LABEL) == dom:
        return (0, spare.name)
    bt, st = tiers(bad), tiers(spare)
    for i, (a, b) in enumerate(zip(bt, st, strict=False)):
        if a == b:
            return (1 + i, spare.name)
    return (1 + MAX_TIERS, spare.name)


def rank_spares(bad: NodeView, spares: Iterable[NodeView]) -> list[NodeView]:
    return sorted((s for s in spares if s.name != bad.name), key=lambda s: closeness(bad, s))


def match_level(bad: NodeView, spare: NodeView) -> str:
    rank = closeness(bad, spare)[0]
    if rank == 0:
        return "domain"
    if rank <= MAX_TIERS:
        return f"tier-{rank - 1}"
    return "any"


def slinky_topology_spec(node: NodeView, topology: str = "default") -> str:
    """``topology.slinky.slurm.net/spec`` for ``node``: ``<name>:<block>`` when the node is
    in an accelerator (NVLink) domain (block topology), else ``<name>:<sw_top>:...:<sw_0>``
    from its fabric tiers (tree topology, top switch first); empty if it has neither."""
    dom = node.labels.get(DOMAIN_LABEL)
    if dom:
        return f"{topology}:{dom}"
    t = tiers(node)
    if t:
        return ":".join([topology, *reversed(t)])
    return ""
