"""Fleet bookkeeping shared by every driver of the engine (runtime, simulator, backtest).

Pure helpers: which records are open, what the guardrails see, when a verdict is worth a step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from healer.core.budget import BudgetView, OpenRemediation, PastIncident
from healer.core.health import Verdict
from healer.core.machine import counts_as_active, record_out_of_service
from healer.core.model import HealthState, NodeRecord, NodeView
from healer.core.phases import Phase
from healer.core.policy import PolicySet


def past_incident(rec: NodeRecord) -> PastIncident:
    return PastIncident(rec.incident.id, rec.node, rec.incident.opened_at, rec.policy,
                        tuple(g.serial for g in rec.incident.gpus if g.serial))


def open_remediation(rec: NodeRecord) -> OpenRemediation:
    return OpenRemediation(rec.node, rec.policy, Phase(rec.phase), rec.incident.opened_at,
                           rec.spare, record_out_of_service(rec), counts_as_active(rec))


def budget_view(policies: PolicySet, nodes: Mapping[str, NodeView],
                open_records: Iterable[NodeRecord], history: Iterable[NodeRecord],
                *, paused: bool = False,
                paused_nodes: frozenset[str] = frozenset()) -> BudgetView:
    """What the guardrails see: ``open_records`` (one per node, not released) and ``history``
    (every record kept, open or closed, for the breaker and the retry budgets). Suspicions are
    not incidents and count for nothing."""
    open_: dict[str, OpenRemediation] = {}
    for rec in open_records:
        if Phase(rec.phase) is not Phase.SUSPECT:
            open_[rec.node] = open_remediation(rec)
    incidents: dict[str, PastIncident] = {}
    for rec in history:
        if Phase(rec.phase) is not Phase.SUSPECT:
            incidents[rec.incident.id] = past_incident(rec)
    return BudgetView(policies, dict(nodes), open_, tuple(incidents.values()), paused,
                      paused_nodes)


def verdict_needs_step(verdict: Verdict, record: NodeRecord | None) -> bool:
    """Skip the machine for a node with no record whose verdict is healthy or stale."""
    return record is not None or verdict.state not in (HealthState.HEALTHY, HealthState.STALE)
