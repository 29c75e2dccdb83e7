"""The guardrails' numbers for a hand-built :class:`~healer.core.budget.BudgetView` (no
:class:`~healer.core.capacity.FleetIndex` behind it), by scanning the view: O(fleet) per
question. The index answers the same questions in O(1); the tests hold the two equal. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Set as AbstractSet

from healer.core.budget import (
    BudgetView,
    PastIncident,
    Scope,
    in_scope,
    nodeset_name,
    population,
    unavailable,
)
from healer.core.model import NodeView
from healer.core.nodesets import NodeSetRules
from healer.core.unavailability import claims_in_flight, replaced

__all__ = ["ScanFacts"]


class ScanFacts:
    """:class:`GuardrailFacts` of a hand-built view, by scanning it (O(fleet) per question)."""

    def __init__(self, view: BudgetView) -> None:
        self.view = view
        self._scopes: list[tuple[Scope, list[NodeView], dict[str, str]]] = []

    def _scope(self, policy: Scope) -> tuple[list[NodeView], dict[str, str]]:
        for pol, members, down in self._scopes:
            if pol is policy:
                return members, down
        members = population(self.view, policy)
        down = unavailable(self.view, members)
        self._scopes.append((policy, members, down))
        return members, down

    def members(self, policy: Scope) -> AbstractSet[str]:
        return {m.name for m in self._scope(policy)[0]}

    def population(self, policy: Scope) -> int:
        return len(self._scope(policy)[0])

    def unavailable(self, policy: Scope) -> int:
        return len(self._scope(policy)[1])

    def is_unavailable(self, policy: Scope, node: str) -> bool:
        return node in self._scope(policy)[1]

    def domain_unavailable(self, policy: Scope, key: str, value: str) -> int:
        members, down = self._scope(policy)
        return sum(1 for m in members if m.name in down and m.labels.get(key) == value)

    def causes(self, policy: Scope) -> Mapping[str, int]:
        out: dict[str, int] = {}
        for cause in self._scope(policy)[1].values():
            out[cause] = out.get(cause, 0) + 1
        return out

    def cause(self, policy: Scope, node: str) -> str:
        return self._scope(policy)[1].get(node, "")

    def replaced(self, policy: Scope) -> int:
        in_flight = {claims_in_flight(r) for r in self.view.open.values()}
        return sum(1 for n in self.view.nodes.values()
                   if replaced(self.view.open.get(n.name)) and n.name not in in_flight
                   and not self.view.policies.is_spare(n.labels)
                   and in_scope(self.view.policies, policy, n))

    def not_ready(self, policy: Scope,
                  domain: tuple[str, str] | None = None) -> Mapping[str, float]:
        out: dict[str, float] = {}
        for m in self._scope(policy)[0]:
            since = m.not_ready_since
            if since is not None and (domain is None or m.labels.get(domain[0]) == domain[1]):
                out[m.name] = since
        return out

    def returned(self, policy: Scope, since: float,
                 domain: tuple[str, str] | None = None) -> Mapping[str, float]:
        out: dict[str, float] = {}
        for m in self._scope(policy)[0]:
            t = m.ready_since
            if t is not None and t >= since and (
                    domain is None or m.labels.get(domain[0]) == domain[1]):
                out[m.name] = t
        return out

    def domain_members(self, policy: Scope, key: str, value: str) -> int:
        return sum(1 for m in self._scope(policy)[0] if m.labels.get(key) == value)

    def _tagged(self, scope: Scope, node: str, policy: str) -> bool:
        """Does a remediation or incident of ``node`` under ``policy`` count in ``scope``?"""
        if scope is None:
            return True
        if isinstance(scope, NodeSetRules):
            return nodeset_name(self.view.policies, self.view.nodes.get(node)) == scope.name
        return policy == scope.name

    def active(self, policy: Scope, excluding: str | None = None) -> int:
        return sum(1 for r in self.view.open.values()
                   if r.node != excluding and r.active and self._tagged(policy, r.node, r.policy))

    def has_incident(self, policy: Scope, incident: str) -> bool:
        return any(i.id == incident for i in self.view.incidents
                   if self._tagged(policy, i.node, i.policy))

    def breaker_times(self, policy: Scope, since: float,
                      now: float) -> list[tuple[float, str]]:
        return sorted((i.opened_at, i.node) for i in self.view.incidents
                      if self._tagged(policy, i.node, i.policy) and i.opened_at <= now)

    def incidents_on_node(self, node: str) -> Iterable[PastIncident]:
        return self.view.incidents

    def incidents_with_serial(self, serial: str) -> Iterable[PastIncident]:
        return self.view.incidents
