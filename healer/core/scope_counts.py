"""The counts behind the guardrails, per scope: what :class:`healer.core.capacity.FleetIndex`
keeps for the fleet, each policy and each NodeSet (members, unavailable nodes by cause,
replaced nodes, per failure-domain value), and the small sorted tables of incident times it
keeps for the breaker. Pure."""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass, field

from healer.core.model import NodeView, PastIncident
from healer.core.nodesets import NodeSetRules
from healer.core.rules import Guardrails, Policy

__all__ = ["REPLACED", "Entry", "NodeEntry", "Placed", "ScopeCounts", "domain_keys",
           "drop_incident", "entry_time", "remove_entry"]

Entry = tuple[float, str, str]  # (opened_at, node, incident id), for the breaker

#: The placement of a node a spare replaced (in its scopes, but not a member).
REPLACED = "replaced"


@dataclass(slots=True)
class ScopeCounts:
    """One scope's population: members, unavailable nodes (with causes, counted per cause),
    replaced nodes, counts per failure domain."""

    policy: Policy | NodeSetRules | None  # None: the fleet
    keys: tuple[str, ...]  # the failure-domain label keys counted
    members: set[str] = field(default_factory=set)
    down: dict[str, str] = field(default_factory=dict)  # node -> cause
    causes: dict[str, int] = field(default_factory=dict)
    replaced: set[str] = field(default_factory=set)
    # key -> value -> [members, unavailable]
    domains: dict[str, dict[str, list[int]]] = field(default_factory=dict)

    def add(self, view: NodeView, cause: str, sign: int) -> None:
        """Count (``sign`` 1) or uncount (-1) ``view`` with ``cause`` ("" = available,
        :data:`REPLACED` = replaced, not a member)."""
        name = view.name
        if cause == REPLACED:
            if sign > 0:
                self.replaced.add(name)
            else:
                self.replaced.discard(name)
            return
        down = bool(cause)
        if sign > 0:
            self.members.add(name)
            if down:
                self.down[name] = cause
        else:
            self.members.discard(name)
            if self.down.pop(name, None) is None:
                down = False
        if down:
            n = self.causes.get(cause, 0) + sign
            if n:
                self.causes[cause] = n
            else:
                del self.causes[cause]
        for key in self.keys:
            value = view.labels.get(key)
            if value is None:
                continue
            counts = self.domains.setdefault(key, {}).setdefault(value, [0, 0])
            counts[0] += sign
            counts[1] += sign if down else 0
            if counts[0] == 0:
                del self.domains[key][value]


@dataclass(frozen=True, slots=True)
class NodeEntry:
    view: NodeView
    selected_by: tuple[int, ...]  # indices of the policies that select it
    spare: bool
    nodeset: str = ""  # the NodeSet it belongs to


@dataclass(frozen=True, slots=True)
class Placed:
    """Where a node was counted (to take it out again): its view then, its scopes, cause."""

    view: NodeView
    scopes: tuple[int, ...]
    cause: str


def domain_keys(guardrails: Guardrails) -> tuple[str, ...]:
    """The failure-domain label keys a scope's guardrails count by, once each."""
    return tuple(dict.fromkeys(fd.key for fd in guardrails.failure_domains))


def entry_time(entry: Entry) -> float:
    return entry[0]


def remove_entry(entries: list[Entry], entry: Entry) -> None:
    i = bisect_left(entries, entry)
    if i < len(entries) and entries[i] == entry:
        del entries[i]


def drop_incident(table: dict[str, dict[str, PastIncident]], key: str, incident_id: str) -> None:
    bucket = table.get(key)
    if bucket is not None:
        bucket.pop(incident_id, None)
        if not bucket:
            del table[key]
