"""Parts of a node that are not GPUs: what a telemetry series with ``per`` labels is about.

An InfiniBand HCA port (node-exporter's ``device="mlx5_0", port="1"``), a disk, a NIC: a metric
rule with ``per: [device, port]`` is judged per part, and its signals, the incident's evidence
and the summary Events show name the part.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True, order=True)
class PartRef:
    """One part of a node: the labels that tell its series apart, in the order the rule lists
    them, e.g. ``(("device", "mlx5_0"), ("port", "1"))``."""

    labels: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of(cls, labels: Mapping[str, Any]) -> PartRef:
        return cls(tuple((str(k), str(v)) for k, v in labels.items()))

    def describe(self) -> str:
        """``device mlx5_0 port 1``."""
        return " ".join(f"{k} {v}" for k, v in self.labels) or "node"
