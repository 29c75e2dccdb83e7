"""The backtest report: what healer would have done, per node and for the fleet, as data
(:class:`Report`), as JSON (:meth:`Report.to_json`: sorted keys, no wall-clock data, so the
same input gives byte-identical output) and as the human table (:func:`render_table`).
Built from a replay by :func:`healer.backtest.collect.build_report`."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from healer.core.model import GpuRef
from healer.core.timefmt import format_duration, rfc3339
from healer.sim.world import Latencies

#: Version of the JSON report format.
REPORT_FORMAT_VERSION = 1


def _time(t: float | None) -> str | None:
    """A time as the report writes it: RFC 3339, to the millisecond; None stays None."""
    return None if t is None else rfc3339(t, millis=True)


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


@dataclass(frozen=True, slots=True)
class Block:
    """A guardrail (or the observe-only mode) held an incident back from ``since`` to
    ``until`` (None: still held at the end of the range)."""

    guardrail: str
    message: str
    current: float
    limit: float
    since: float
    until: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"guardrail": self.guardrail, "message": self.message,
                "current": _num(self.current), "limit": _num(self.limit),
                "since": _time(self.since), "until": _time(self.until)}


@dataclass(frozen=True, slots=True)
class PhaseChange:
    at: float
    source: str
    target: str
    trigger: str

    def to_dict(self) -> dict[str, Any]:
        return {"at": _time(self.at), "from": self.source, "to": self.target,
                "trigger": self.trigger}


@dataclass(frozen=True, slots=True)
class StepEntry:
    """One ledger step: started (intent recorded), finished (the world answered)."""

    step: str
    started_at: float
    finished_at: float | None
    outcome: str
    detail: str = ""
    error: str = ""

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"step": self.step, "startedAt": _time(self.started_at),
                             "finishedAt": _time(self.finished_at), "outcome": self.outcome}
        if self.detail:
            d["detail"] = self.detail
        if self.error:
            d["error"] = self.error
        return d


@dataclass(frozen=True, slots=True)
class IncidentReport:
    id: str
    node: str
    policy: str
    mode: str  # the mode the incident was evaluated in
    severity: str
    rules: tuple[str, ...]
    gpus: tuple[GpuRef, ...]
    summary: str
    opened_at: float
    phase: str  # at the end of the range
    outcome: str
    admitted_at: float | None = None
    drained_at: float | None = None
    cordoned_at: float | None = None
    spare: str = ""
    spare_match: str = ""  # domain | tier-N | any
    replaced_at: float | None = None  # the replacement serves (undrained on the spare)
    out_since: float | None = None  # Slurm capacity out (drain accepted) ...
    out_until: float | None = None  # ... until given back (None: still out at the end)
    blocks: tuple[Block, ...] = ()
    escalated_at: float | None = None
    escalation: str = ""
    held_for_capacity: bool = False
    phases: tuple[PhaseChange, ...] = ()
    steps: tuple[StepEntry, ...] = ()

    @property
    def taken_out(self) -> bool:
        return self.out_since is not None or self.cordoned_at is not None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id, "node": self.node, "policy": self.policy, "mode": self.mode,
            "severity": self.severity, "rules": list(self.rules),
            "gpus": [g.to_dict() for g in self.gpus], "summary": self.summary,
            "openedAt": _time(self.opened_at), "phase": self.phase, "outcome": self.outcome,
            "admittedAt": _time(self.admitted_at), "drainedAt": _time(self.drained_at),
            "cordonedAt": _time(self.cordoned_at), "spare": self.spare or None,
            "spareMatch": self.spare_match or None, "replacedAt": _time(self.replaced_at),
            "outOfService": None if self.out_since is None else
            {"since": _time(self.out_since), "until": _time(self.out_until)},
            "blocks": [b.to_dict() for b in self.blocks],
            "escalation": None if self.escalated_at is None else
            {"at": _time(self.escalated_at), "reason": self.escalation},
            "heldForCapacity": self.held_for_capacity,
            "phases": [p.to_dict() for p in self.phases],
            "steps": [s.to_dict() for s in self.steps],
        }


@dataclass(frozen=True, slots=True)
class StalePeriod:
    since: float
    until: float | None
    reason: str

    def to_dict(self) -> dict[str, Any]:
        return {"since": _time(self.since), "until": _time(self.until), "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Disruption:
    at: float
    action: str  # drain | cordon | requeue
    incident: str

    def to_dict(self) -> dict[str, Any]:
        return {"at": _time(self.at), "action": self.action, "incident": self.incident}


@dataclass(frozen=True, slots=True)
class NodeReport:
    node: str
    policies: tuple[str, ...]  # the policies that select it
    telemetry: bool  # seen in the telemetry
    incidents: tuple[IncidentReport, ...] = ()
    disruptions: tuple[Disruption, ...] = ()
    stale: tuple[StalePeriod, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"policies": list(self.policies), "telemetry": self.telemetry,
                "incidents": [i.to_dict() for i in self.incidents],
                "disruptions": [d.to_dict() for d in self.disruptions],
                "stale": [s.to_dict() for s in self.stale]}


@dataclass(frozen=True, slots=True)
class BreakerTrip:
    at: float
    scope: str  # "fleet" or "policy NAME"
    node: str  # whose incident tripped it
    count: int
    threshold: int
    closes_at: float | None  # if nothing else fails (later incidents in the cooldown extend it)

    def to_dict(self) -> dict[str, Any]:
        return {"at": _time(self.at), "scope": self.scope, "node": self.node,
                "count": self.count, "threshold": self.threshold,
                "closesAt": _time(self.closes_at)}


@dataclass(frozen=True, slots=True)
class Summary:
    nodes: int
    governed: int
    incidents: int
    by_severity: Mapping[str, int]
    nodes_taken_out: int
    max_concurrently_out: int
    max_out_at: float | None
    spares_claimed: int
    spares_needed: int
    held_for_capacity: int
    breaker_trips: tuple[BreakerTrip, ...]
    blocks: Mapping[str, int]  # guardrail → incidents it held back
    escalations: int
    recovered: int
    stale_nodes: int
    dry_run_incidents: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes, "governedNodes": self.governed, "incidents": self.incidents,
            "bySeverity": dict(self.by_severity), "nodesTakenOut": self.nodes_taken_out,
            "maxConcurrentlyOut": self.max_concurrently_out,
            "maxOutAt": _time(self.max_out_at),
            "sparesClaimed": self.spares_claimed, "sparesNeeded": self.spares_needed,
            "heldForCapacity": self.held_for_capacity,
            "breakerTrips": [b.to_dict() for b in self.breaker_trips],
            "guardrailBlocks": dict(self.blocks), "escalations": self.escalations,
            "recovered": self.recovered, "staleNodes": self.stale_nodes,
            "dryRunIncidents": self.dry_run_incidents,
        }


@dataclass(frozen=True, slots=True)
class PolicyMode:
    name: str
    configured: str
    evaluated: str


@dataclass(frozen=True, slots=True)
class Assumptions:
    """The optimistic world the backtest ran against."""

    latencies: Latencies
    spares: int | None  # None: unlimited
    repair_after: float | None  # None: no repair result arrives

    def to_dict(self) -> dict[str, Any]:
        return {
            "world": "optimistic",
            "actionLatencySeconds": _num(self.latencies.api),
            "replacementReadySeconds": _num(self.latencies.pod_start),
            "validationSeconds": _num(self.latencies.validation),
            "drains": "complete at once (no job data)",
            "spares": "unlimited" if self.spares is None else self.spares,
            "repairAfterSeconds": None if self.repair_after is None else _num(self.repair_after),
            "guardrails": "on",
        }

    def describe(self) -> str:
        lat = self.latencies
        spares = "unlimited spares" if self.spares is None else f"{self.spares} spares"
        repair = ("repairs report no result" if self.repair_after is None else
                  f"repairs pass after {format_duration(self.repair_after, units=2)}")
        return (f"optimistic world: actions succeed after {lat.api:g}s, a replacement serves "
                f"{lat.pod_start:g}s after the move, validations pass after "
                f"{format_duration(lat.validation, units=2)}; drains complete at once (no job "
                f"data); "
                f"{spares}; {repair}")


@dataclass(frozen=True, slots=True)
class Report:
    source: str
    start: float
    end: float
    step: float
    policies: tuple[PolicyMode, ...]
    as_configured: bool
    assumptions: Assumptions
    nodes: tuple[NodeReport, ...]
    summary: Summary
    signals: int  # signals replayed (after dropping samples without a fresh heartbeat)
    digest: str = ""  # of the policy set
    label_source: str = ""  # where the node labels came from
    #: wall seconds per phase (fetch, replay); never in the JSON, which must be reproducible
    timings: Mapping[str, float] = field(default_factory=dict, compare=False)

    def node(self, name: str) -> NodeReport:
        for n in self.nodes:
            if n.node == name:
                return n
        raise KeyError(name)

    @property
    def incidents(self) -> list[IncidentReport]:
        return sorted((i for n in self.nodes for i in n.incidents),
                      key=lambda i: (i.opened_at, i.node))

    def header_lines(self) -> list[str]:
        span = format_duration(self.end - self.start, units=2)
        lines = [f"healer backtest of {self.source}: {_time(self.start)} → {_time(self.end)} "
                 f"({span}, step {self.step:g}s), {self.summary.nodes} nodes "
                 f"({self.label_source})"]
        modes = ", ".join(f"{p.name}={p.configured}" for p in self.policies)
        if self.as_configured:
            lines.append(f"policies evaluated as configured: {modes}")
        else:
            lines.append(f"policies evaluated as act (configured: {modes}); --as-configured "
                         "keeps the modes")
        lines.append(self.assumptions.describe() + "; guardrails on")
        return lines

    def to_dict(self) -> dict[str, Any]:
        return {
            "formatVersion": REPORT_FORMAT_VERSION,
            "source": self.source,
            "range": {"from": _time(self.start), "to": _time(self.end),
                      "stepSeconds": _num(self.step)},
            "policies": [{"name": p.name, "configuredMode": p.configured,
                          "evaluatedMode": p.evaluated} for p in self.policies],
            "policyDigest": self.digest,
            "asConfigured": self.as_configured,
            "nodeLabels": self.label_source,
            "assumptions": self.assumptions.to_dict(),
            "signals": self.signals,
            "nodes": {n.node: n.to_dict() for n in self.nodes},
            "summary": self.summary.to_dict(),
            "header": self.header_lines(),
        }

    def to_json(self) -> str:
        """Stable: the same input gives byte-identical output (sorted keys)."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2, ensure_ascii=False) + "\n"

    def table(self) -> str:
        return "\n".join(render_table(self)) + "\n"



# ---------------------------------------------------------------------------------------------
# The human table


def _short(t: float) -> str:
    return rfc3339(round(t, 3))[:-1].replace("T", " ")  # 2026-01-05 09:00:00


def _after(t: float | None, since: float) -> str:
    return "-" if t is None else f"+{format_duration(t - since, units=2)}"


def _gpus(gpus: Sequence[GpuRef]) -> str:
    return ",".join(str(g.index) if g.index >= 0 else "?" for g in gpus) or "-"


def _held(b: Block, end: float) -> str:
    until = b.until if b.until is not None else end
    still = "" if b.until is not None else " (still at the end)"
    span = format_duration(until - b.since, units=2)
    return f"{b.guardrail} {_num(b.current)}/{_num(b.limit)} for {span}{still}"


def render_table(report: Report) -> list[str]:
    lines = list(report.header_lines())
    lines.append("")
    cols = ("NODE", "OPENED (UTC)", "SEVERITY", "RULES", "GPUS", "ADMITTED", "DRAINED",
            "CORDONED", "SPARE", "PHASE AT END", "HELD BACK BY")
    rows: list[tuple[str, ...]] = []
    for i in report.incidents:
        held = "; ".join(_held(b, report.end) for b in i.blocks) or "-"
        spare = f"{i.spare} ({i.spare_match})" if i.spare else "-"
        phase = i.phase + (f": {i.outcome}" if i.outcome and i.outcome not in (
            "replaced", "repaired", "done") else "")
        rows.append((i.node, _short(i.opened_at), i.severity, ",".join(i.rules),
                     _gpus(i.gpus), _after(i.admitted_at, i.opened_at),
                     _after(i.drained_at, i.opened_at), _after(i.cordoned_at, i.opened_at),
                     spare, phase, held))
    if rows:
        widths = [max(len(c), *(len(r[k]) for r in rows)) for k, c in enumerate(cols)]
        lines.append("  ".join(c.ljust(widths[k]) for k, c in enumerate(cols)).rstrip())
        for r in rows:
            lines.append("  ".join(v.ljust(widths[k]) for k, v in enumerate(r)).rstrip())
    else:
        lines.append("no incident: healer would have done nothing")
    details: list[str] = []
    for i in report.incidents:
        for b in i.blocks:
            details.append(f"  {i.node} {_short(b.since)}: held back by {b.guardrail}: "
                           f"{b.message}")
        if i.escalated_at is not None:
            details.append(f"  {i.node} {_short(i.escalated_at)}: escalated: {i.escalation}")
    if details:
        lines += ["", "guardrail blocks and escalations:", *details]
    stale = [(n.node, p) for n in report.nodes for p in n.stale]
    if stale:
        lines += ["", "telemetry stale (unknown: alerts only, never a disruption):"]
        for node, p in stale:
            until = report.end if p.until is None else p.until
            end = "end of range" if p.until is None else _short(p.until)
            took = format_duration(until - p.since, units=2)
            lines.append(f"  {node} {_short(p.since)} → {end} ({took}): {p.reason}")
    s = report.summary
    if s.breaker_trips:
        lines += ["", "breaker trips:"]
        for trip in s.breaker_trips:
            closes = "-" if trip.closes_at is None else _short(trip.closes_at)
            lines.append(f"  {_short(trip.at)} {trip.scope}: {trip.count} nodes went bad within "
                         f"the window (threshold {trip.threshold}), tripped by {trip.node}; "
                         f"closes {closes}")
    sev = ", ".join(f"{n} {k}" for k, n in sorted(s.by_severity.items())) or "none"
    blocked = ", ".join(f"{k} {n}" for k, n in sorted(s.blocks.items())) or "none"
    at = "" if s.max_out_at is None else f" (first at {_short(s.max_out_at)})"
    lines += ["", f"summary: {s.incidents} incidents ({sev}) on {s.governed} governed of "
                  f"{s.nodes} nodes; {s.nodes_taken_out} nodes taken out, at most "
                  f"{s.max_concurrently_out} at once{at}; spares claimed {s.spares_claimed}, "
                  f"needed {s.spares_needed}; held for capacity {s.held_for_capacity}; "
                  f"breaker trips {len(s.breaker_trips)}; held back: {blocked}; escalations "
                  f"{s.escalations}; recovered {s.recovered}; nodes with stale telemetry "
                  f"{s.stale_nodes}"]
    if s.dry_run_incidents:
        lines.append(f"({s.dry_run_incidents} incidents are dryRun: healer would only have "
                     "recorded the steps)")
    return lines

