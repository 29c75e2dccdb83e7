"""What Kubernetes label selectors can match, decided from the selectors alone. Pure.

A selector (``matchLabels`` and ``matchExpressions`` with In, NotIn, Exists, DoesNotExist) is a
conjunction of constraints, one set per label key. For one key the nodes it allows are either
"absent" or some values, and those values are a finite set (``=``, ``In``) or every value but a
finite set (``NotIn``), so the questions the policy loader asks are decidable exactly, with no
node at hand:

* :func:`satisfiable`: can any node match it (``a=1`` with ``a In (2)`` cannot);
* :func:`implies`: does every node that matches ``a`` match ``b`` too (``{pool: a, gpu: h100}``
  implies ``{pool: a}``); a selector that matches nothing implies every selector;
* :func:`conflict`: the first key on which a selector can match nothing, for the message.

Used to refuse configurations that silently switch remediation off (a NodeSet whose nodes are
all warm spares, a NodeSet that serves nothing because an earlier one takes every node it
selects): :mod:`healer.policy.roles`.
"""

from __future__ import annotations

from dataclasses import dataclass

from healer.core.rules import LabelSelector

__all__ = ["conflict", "implies", "satisfiable"]


@dataclass(frozen=True, slots=True)
class _Key:
    """The states one key may be in under a selector: ``absent`` allowed or not, and its
    values: ``values`` when finite (``cofinite`` False), else every value but ``values``."""

    absent: bool = True
    values: frozenset[str] = frozenset()
    cofinite: bool = True  # True with values=() : any value

    def empty(self) -> bool:
        return not self.absent and not self.cofinite and not self.values

    def within(self, other: _Key) -> bool:
        """Every state allowed here is allowed by ``other``."""
        if self.absent and not other.absent:
            return False
        if not self.cofinite:
            return (self.values.isdisjoint(other.values) if other.cofinite
                    else self.values <= other.values)
        return other.cofinite and other.values <= self.values


def _keys(sel: LabelSelector) -> dict[str, _Key]:
    out: dict[str, _Key] = {}

    def meet(key: str, op: str, values: frozenset[str]) -> None:
        k = out.get(key, _Key())
        if op in ("In", "="):
            vs = values if k.cofinite else values & k.values
            out[key] = _Key(False, vs - k.values if k.cofinite else vs, False)
        elif op == "NotIn":
            out[key] = (_Key(k.absent, k.values | values, True) if k.cofinite
                        else _Key(k.absent, k.values - values, False))
        elif op == "Exists":
            out[key] = _Key(False, k.values, k.cofinite)
        elif op == "DoesNotExist":
            out[key] = _Key(k.absent, frozenset(), False)

    for key, value in sel.match_labels.items():
        meet(key, "=", frozenset({value}))
    for key, op, values in sel.match_expressions:
        meet(key, op, values)
    return out


def conflict(sel: LabelSelector) -> str:
    """The first key (sorted) on which ``sel`` can match no node; ``""`` if it is satisfiable."""
    for key, k in sorted(_keys(sel).items()):
        if k.empty():
            return key
    return ""


def satisfiable(sel: LabelSelector) -> bool:
    """Can any node's labels match ``sel``?"""
    return not conflict(sel)


def implies(a: LabelSelector, b: LabelSelector) -> bool:
    """Does every set of labels that matches ``a`` match ``b`` as well?"""
    ka, kb = _keys(a), _keys(b)
    if any(k.empty() for k in ka.values()):
        return True  # a matches nothing
    return all(ka.get(key, _Key()).within(kb_key) for key, kb_key in kb.items())
