"""Fleet bookkeeping shared by every driver of the engine (runtime, simulator, backtest).

Pure helpers: which records are open, what the guardrails see.
A driver that keeps a :class:`~healer.core.capacity.FleetIndex` up to date asks it for views;
:func:`budget_view` builds one from scratch, for drivers that hold the fleet in plain maps.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import replace

from healer.core.budget import BudgetView, SlurmView
from healer.core.capacity import FleetIndex
from healer.core.capacity import open_remediation as open_remediation
from healer.core.capacity import past_incident as past_incident
from healer.core.model import NodeRecord, NodeView
from healer.core.phases import Phase
from healer.core.rules import PolicySet


def budget_view(policies: PolicySet, nodes: Mapping[str, NodeView],
                open_records: Iterable[NodeRecord], history: Iterable[NodeRecord],
                *, paused: bool = False,
                paused_nodes: frozenset[str] = frozenset(),
                slurm: Mapping[str, str] | None = None,
                slurm_view: SlurmView = SlurmView.OFF) -> BudgetView:
    """What the guardrails see: ``open_records`` (one per node, not released) and ``history``
    (every record kept, open or closed, for the breaker and the retry budgets). Suspicions are
    not incidents and count for nothing. Only ``paused_nodes`` are paused node by node.
    ``slurm``: node → why Slurm will not start jobs there; ``slurm_view``: the feed's state.

    Builds a :class:`FleetIndex` from scratch: O(fleet x policies)."""
    index = FleetIndex(policies)
    for view in nodes.values():
        index.set_node(view)
    for node, cause in (slurm or {}).items():
        index.set_slurm(node, cause)
    index.set_slurm_view(slurm_view)
    for rec in open_records:
        if rec.phase is not Phase.SUSPECT:
            index.set_open(open_remediation(rec), rec.incident.id)
    for rec in history:
        if rec.phase is not Phase.SUSPECT:
            index.add_incident(past_incident(rec))
    return replace(index.view(paused=paused), paused_nodes=paused_nodes)

