"""What a poll knows of each node's scrape times: the stamps of its metric samples. Pure.

:class:`PollView` stamps a poll's metric samples: with the scrape time of their GPU when the
node's per-GPU rows are known this poll, else with the node's newest scrape time (its GPU count
matched its known GPUs, so none is missing); None when the node has no heartbeat (dropped).
In the first round the emission of a node without per-GPU rows is *deferred* to the follow-up
(``defers``), which fetches its rows: its signals carry their GPU's stamp and job labels. The
rows and summaries come from the freshness answers (:mod:`.nodes`).
"""

from __future__ import annotations

from healer.adapters.prometheus.freshness import NodeRows, NodeSummary
from healer.core.model import GpuRef
from healer.core.parts import PartRef


class PollView:
    """What a poll knows of each node's scrape times; see the module."""

    __slots__ = ("defer", "nodes", "rows")

    def __init__(self, rows: NodeRows, nodes: NodeSummary, *, defer: bool) -> None:
        self.rows = rows
        self.nodes = nodes
        self.defer = defer

    def defers(self, node: str) -> bool:
        """Whether this node's metric signals wait for its per-GPU rows (the follow-up)."""
        return self.defer and node not in self.rows and node in self.nodes

    def stamp(self, node: str, gpu: GpuRef | PartRef | None) -> float | None:
        """When this GPU (or node) was last scraped: the stamp of its metric samples.

        With per-GPU rows: a GPU is matched by its full identity, else by its index (a
        ``promql`` rule's result may lack the UUID); a node-level sample, or one of a part
        of the node (an HCA port), takes the node's newest scrape. Without: the node's
        newest scrape. None: no heartbeat now (exporter down, GPU missing), so the sample is
        not fresh data.
        """
        row = self.rows.get(node)
        if row is None:
            summary = self.nodes.get(node)
            return None if summary is None else float(summary[1])
        newest = row[1]
        if not isinstance(gpu, GpuRef) or (gpu.index < 0 and not gpu.uuid):
            return max(newest.values())
        exact = newest.get(gpu)
        if exact is not None:
            return exact
        if gpu.index >= 0:
            same = [ts for g, ts in newest.items() if g is not None and g.index == gpu.index]
            return max(same) if same else None
        return None
