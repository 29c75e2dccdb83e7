"""A Kubernetes label selector (``matchLabels`` and ``matchExpressions``), compiled: what a
policy, a NodeSet and a spare pool select nodes with. Pure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class LabelSelector:
    match_labels: Mapping[str, str] = field(default_factory=dict)
    # (key, operator, values) with operator In | NotIn | Exists | DoesNotExist
    match_expressions: tuple[tuple[str, str, frozenset[str]], ...] = ()

    def matches(self, labels: Mapping[str, str]) -> bool:
        for k, v in self.match_labels.items():
            if labels.get(k) != v:
                return False
        for key, op, values in self.match_expressions:
            present = key in labels
            if op == "In" and (not present or labels[key] not in values):
                return False
            if op == "NotIn" and present and labels[key] in values:
                return False
            if op == "Exists" and not present:
                return False
            if op == "DoesNotExist" and present:
                return False
        return True

    def to_query(self) -> str:
        """The selector as a Kubernetes ``labelSelector`` query string."""
        parts = [f"{k}={v}" for k, v in sorted(self.match_labels.items())]
        for key, op, values in self.match_expressions:
            vs = ",".join(sorted(values))
            parts.append({"In": f"{key} in ({vs})", "NotIn": f"{key} notin ({vs})",
                          "Exists": key, "DoesNotExist": f"!{key}"}[op])
        return ",".join(parts)
