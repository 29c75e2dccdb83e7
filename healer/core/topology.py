"""Topology: which spare is closest to a failed node, how far a chosen spare is from it
(:class:`Placement`, reported in the NodeRemediation and an Event), and the Slinky topology
string a node's fabric labels imply. Pure. The labels read are a NodeSet's
:class:`TopologyKeys`; by default the ones NVIDIA topograph writes."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from healer.core.model import NodeView, Placement, StepKey

DOMAIN_LABEL = "accelerator.topograph.run/domain"
TIER_PREFIX = "fabric.topograph.run/tier-"
MAX_TIERS = 8
#: The Node annotation Slinky's slurm-operator (v1.1+) copies to the slurmd pod as its Slurm
#: topology (``slinky_topology_spec`` writes its value).
TOPOLOGY_ANNOTATION = "topology.slinky.slurm.net/spec"


@dataclass(frozen=True, slots=True)
class TopologyKeys:
    """The labels placement reads: the NVLink domain and the switch tiers (leaf first)."""

    domain: str = DOMAIN_LABEL
    tiers: tuple[str, ...] = tuple(f"{TIER_PREFIX}{i}" for i in range(MAX_TIERS))


TOPOGRAPH = TopologyKeys()


def tiers(node: NodeView, keys: TopologyKeys = TOPOGRAPH) -> list[str]:
    """The node's switch at each fabric tier, closest (tier-0) first, up to the first gap."""
    out: list[str] = []
    for key in keys.tiers:
        v = node.labels.get(key)
        if v is None:
            break
        out.append(v)
    return out


def closeness(bad: NodeView, spare: NodeView,
              keys: TopologyKeys = TOPOGRAPH) -> tuple[int, str]:
    """Sort key: same NVLink (accelerator) domain first, then the lowest shared fabric tier,
    then anything; ties by name so the choice is deterministic."""
    dom = bad.labels.get(keys.domain)
    if dom and spare.labels.get(keys.domain) == dom:
        return (0, spare.name)
    bt, st = tiers(bad, keys), tiers(spare, keys)
    for i, (a, b) in enumerate(zip(bt, st, strict=False)):
        if a == b:
            return (1 + i, spare.name)
    return (1 + MAX_TIERS, spare.name)


def rank_spares(bad: NodeView, spares: Iterable[NodeView],
                keys: TopologyKeys = TOPOGRAPH) -> list[NodeView]:
    return sorted((s for s in spares if s.name != bad.name),
                  key=lambda s: closeness(bad, s, keys))


def match_level(bad: NodeView, spare: NodeView, keys: TopologyKeys = TOPOGRAPH) -> str:
    rank = closeness(bad, spare, keys)[0]
    if rank == 0:
        return "domain"
    if rank <= MAX_TIERS:
        return f"tier-{rank - 1}"
    return "any"


def same_domain(bad: NodeView, spare: NodeView, keys: TopologyKeys = TOPOGRAPH) -> bool:
    """Is ``spare`` in ``bad``'s NVLink (accelerator) domain? Two nodes without a domain label
    count as the same (neither is in one); a labelled and an unlabelled one do not."""
    return (bad.labels.get(keys.domain) or "") == (spare.labels.get(keys.domain) or "")


def same_domain_spares(bad: NodeView, spares: Iterable[NodeView],
                       keys: TopologyKeys = TOPOGRAPH) -> list[NodeView]:
    """``rank_spares`` restricted to the spares in ``bad``'s NVLink domain
    (``swap.requireSameDomain``)."""
    return [s for s in rank_spares(bad, spares, keys) if same_domain(bad, s, keys)]


def placement(bad: NodeView, spare: NodeView, keys: TopologyKeys = TOPOGRAPH) -> Placement:
    """Where ``spare`` sits relative to ``bad`` (see :class:`Placement`)."""
    level = match_level(bad, spare, keys)
    switch = ""
    if level.startswith("tier-"):
        i = int(level[len("tier-"):])
        t = tiers(spare, keys)
        switch = t[i] if i < len(t) else ""
    return Placement(level, bad.labels.get(keys.domain) or "",
                     spare.labels.get(keys.domain) or "", switch)


def placement_data(p: Placement) -> dict[str, str]:
    """``p`` as a claim's step-result data (:func:`placement_of` reads it back)."""
    return {StepKey.MATCH: p.level, StepKey.NODE_DOMAIN: p.node_domain,
            StepKey.SPARE_DOMAIN: p.spare_domain, StepKey.SWITCH: p.switch}


def placement_of(get: Callable[[StepKey], str]) -> Placement | None:
    """The placement a claim reported (``get`` reads its step-result data), if it did."""
    level = get(StepKey.MATCH)
    if not level:
        return None
    return Placement(level, get(StepKey.NODE_DOMAIN), get(StepKey.SPARE_DOMAIN),
                     get(StepKey.SWITCH))


def slinky_topology_spec(node: NodeView, topology: str = "default",
                         keys: TopologyKeys = TOPOGRAPH) -> str:
    """``topology.slinky.slurm.net/spec`` for ``node``: ``<name>:<block>`` when the node is
    in an accelerator (NVLink) domain (block topology), else ``<name>:<sw_top>:...:<sw_0>``
    from its fabric tiers (tree topology, top switch first); empty if it has neither."""
    dom = node.labels.get(keys.domain)
    if dom:
        return f"{topology}:{dom}"
    t = tiers(node, keys)
    if t:
        return ":".join([topology, *reversed(t)])
    return ""
