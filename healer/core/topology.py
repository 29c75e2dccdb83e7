"""Topology: which spare is closest to a failed node, how far a chosen spare is from it
(:class:`Placement`, reported in the NodeRemediation and an Event), and the Slinky topology
string a node's fabric labels imply. Pure; the labels are the ones NVIDIA topograph writes."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from healer.core.model import NodeView, Placement

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


def same_domain(bad: NodeView, spare: NodeView) -> bool:
    """Is ``spare`` in ``bad``'s NVLink (accelerator) domain? Two nodes without a domain label
    count as the same (neither is in one); a labelled and an unlabelled one do not."""
    return (bad.labels.get(DOMAIN_LABEL) or "") == (spare.labels.get(DOMAIN_LABEL) or "")


def same_domain_spares(bad: NodeView, spares: Iterable[NodeView]) -> list[NodeView]:
    """``rank_spares`` restricted to the spares in ``bad``'s NVLink domain
    (``swap.requireSameDomain``)."""
    return [s for s in rank_spares(bad, spares) if same_domain(bad, s)]


def placement(bad: NodeView, spare: NodeView) -> Placement:
    """Where ``spare`` sits relative to ``bad`` (see :class:`Placement`)."""
    level = match_level(bad, spare)
    switch = ""
    if level.startswith("tier-"):
        i = int(level[len("tier-"):])
        t = tiers(spare)
        switch = t[i] if i < len(t) else ""
    return Placement(level, bad.labels.get(DOMAIN_LABEL) or "",
                     spare.labels.get(DOMAIN_LABEL) or "", switch)


def placement_data(p: Placement) -> dict[str, str]:
    """``p`` as a claim's step-result data (:func:`placement_of` reads it back)."""
    return {"match": p.level, "nodeDomain": p.node_domain, "spareDomain": p.spare_domain,
            "switch": p.switch}


def placement_of(get: Callable[[str], str]) -> Placement | None:
    """The placement a claim reported (``get`` reads its step-result data), if it did."""
    level = get("match")
    if not level:
        return None
    return Placement(level, get("nodeDomain"), get("spareDomain"), get("switch"))


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
