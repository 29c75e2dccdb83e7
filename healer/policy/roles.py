"""Across documents: a node is a warm spare or a serving node, never both; every NodeSet serves.

A node that matches a spare selector is a warm spare: never remediated, left out of the
guardrails' populations, claimable for any NodeSet. So a ``SlurmNodeSet`` whose nodes all
match a spare selector (its own, another NodeSet's, the fleet's: the same labels, two NodeSets
naming each other's nodes as spares, a node selector equal to the fleet's spare label) would
switch remediation off for the whole NodeSet, and a spare selector whose spares are all nodes
of a NodeSet would hand serving nodes out as spares. A node belongs to the first NodeSet, by
name, that selects it, so a NodeSet whose selector can match only nodes of an earlier one
serves nothing. A policy that can select only spares never acts. Each of these is decided from
the selectors alone (:mod:`healer.core.selector_logic`) and is an error naming both documents;
what the selectors pick on a live cluster is ``healer validate --kubeconfig``'s
(:mod:`healer.selection`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from healer.core import rules as core
from healer.core.nodesets import NodeSetRules
from healer.core.selector_logic import implies
from healer.core.vocabulary import ROLE_LABEL, SPARE_ROLE
from healer.errors import Problem

__all__ = ["Located", "check_roles"]

LineOf = Callable[[tuple[str | int, ...]], int]


@dataclass(frozen=True, slots=True)
class Located:
    """A compiled document and where it is: its file, its start (``file:line``) and the line
    of any of its fields."""

    file: str
    where: str
    line_of: LineOf


@dataclass(frozen=True, slots=True)
class _Spares:
    selector: core.LabelSelector
    what: str  # how a message names it
    at: Located | None  # None: the default, no document
    path: tuple[str, ...] = ("spec", "spareSelector")


def _spare_selectors(fleet: tuple[core.FleetRules, Located] | None,
                     nodesets: Sequence[tuple[NodeSetRules, Located]]) -> list[_Spares]:
    if fleet is None:
        out = [_Spares(core.FleetRules().spare_selector,
                       f"the fleet's default spareSelector ({ROLE_LABEL}={SPARE_ROLE}; there "
                       "is no FleetGuardrails document)", None)]
    else:
        out = [_Spares(fleet[0].spare_selector,
                       f"the fleet's spareSelector (FleetGuardrails at {fleet[1].where})",
                       fleet[1])]
    out.extend(_Spares(ns.spare_selector, f"the spareSelector of SlurmNodeSet {ns.name!r} "
                                          f"(at {at.where})", at)
               for ns, at in nodesets if ns.spare_selector is not None)
    return out


def check_roles(policies: Sequence[tuple[core.Policy, Located]],
                fleet: tuple[core.FleetRules, Located] | None,
                nodesets: Sequence[tuple[NodeSetRules, Located]],
                problems: list[Problem]) -> None:
    """Append a problem for every overlap the module docstring names."""
    spares = _spare_selectors(fleet, nodesets)
    never_both = ("a node is a warm spare or a serving node, never both: give spares a label "
                  "the NodeSet's nodeSelector excludes")
    for ns, at in nodesets:
        field = ("spec", "nodeSelector")
        for sp in spares:
            if implies(ns.selector, sp.selector):
                problems.append(Problem(
                    at.file, at.line_of(field), "spec.nodeSelector",
                    f"every node of SlurmNodeSet {ns.name!r} is also a warm spare of {sp.what}: "
                    f"its nodes would never be remediated, left out of the guardrails and "
                    f"claimable as spares; {never_both}"))
            elif implies(sp.selector, ns.selector):
                where = sp.at if sp.at is not None else at
                path = sp.path if sp.at is not None else field
                problems.append(Problem(
                    where.file, where.line_of(path), ".".join(path),
                    f"every warm spare of {sp.what} is also a node of SlurmNodeSet "
                    f"{ns.name!r} (at {at.where}): serving nodes would be claimed as spares; "
                    f"{never_both}"))
    ordered = sorted(nodesets, key=lambda n: n[0].name)
    for i, (later, at) in enumerate(ordered):
        for first, first_at in ordered[:i]:
            if implies(later.selector, first.selector):
                problems.append(Problem(
                    at.file, at.line_of(("spec", "nodeSelector")), "spec.nodeSelector",
                    f"SlurmNodeSet {later.name!r} serves no node: every node its nodeSelector "
                    f"matches belongs to SlurmNodeSet {first.name!r} (at {first_at.where}, "
                    f"cluster {first.cluster!r}), the first by name that selects it"))
                break
    for p, at in policies:
        for sp in spares:
            if implies(p.selector, sp.selector):
                problems.append(Problem(
                    at.file, at.line_of(("spec", "nodeSelector")), "spec.nodeSelector",
                    f"policy {p.name!r} can select only warm spares of {sp.what}, which are "
                    "never remediated: it would never act"))
                break
