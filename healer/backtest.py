"""``healer backtest``: what healer would have done over a past time range, and when.

The telemetry comes from Prometheus (:meth:`PrometheusSource.history`: the same queries the
daemon sends, as range queries, one step apart) and goes through the **real** engine — health
evaluation, the state machine, the guardrails — in :class:`healer.sim.engine.Replay`, against a
simulated fleet. The report lists, per node, the incidents (time, severity, rules, GPUs), the
disruptions (drain and cordon times), the spares used, every guardrail block (which guardrail,
with its numbers), the escalations and the stretches of stale telemetry, plus a fleet summary.

The world during a backtest is **optimistic**, and the report says so:

* every action succeeds after a short latency (``api``: 1 s; a replacement slurmd is ready
  ``pod_start`` = 45 s after the move; a validation passes after 2 min);
* drains complete at once: Prometheus holds no job data, so no job delays a drain and no
  checkpoint is waited for;
* a pool of ``spares`` warm spares (default: unlimited, each a clone of the failed node's
  topology labels, so always in its NVLink domain); the report says how many were needed;
* repairs report no result unless ``repair_after`` is given (then every repair passes after
  that long); a node sent to repair stays out of the fleet for the rest of the range.

Guardrails stay **on**. Policies in ``observe`` or ``dryRun`` mode are evaluated as ``act``
(the header lists the configured modes), so the operator sees what acting would have done;
``as_configured`` keeps the modes.

Nodes are selected by Kubernetes labels: every node seen in the telemetry gets ``node_labels``
(default ``nvidia.com/gpu.present=true``), or, with a kubeconfig, the real Nodes' labels.

Fidelity notes. Samples of a node at a step where it had no fresh heartbeat are dropped, like
the daemon does (range functions keep answering from old samples while an exporter is down;
stale telemetry is unknown, never a fault). The engine is the daemon's
(:class:`healer.core.engine.Engine`): a node's signal history is kept bounded (per GPU and
metric only the latest sample and the samples where a rule's condition started to hold), which
gives the health evaluation exactly the same verdicts as the full history, and wake-ups that
cannot change anything are skipped. History is fetched a day at a time
(:func:`fetch_history`). XID windows that began before ``start`` are not seen. A node that a
spare replaced and that is repaired (``repair_after``) returns to the pool as a spare; if an
XID of it is still inside its rule's window when it serves again, a new incident opens, as it
would in the daemon.

The same input gives a byte-identical :meth:`Report.to_json` (sorted keys, no wall-clock data).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import re
import sys
import time
from collections import defaultdict
from collections.abc import AsyncGenerator, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from healer.core import actions as a
from healer.core.actions import StepStatus
from healer.core.budget import BudgetView, breaker_status, population
from healer.core.fleet import past_incident
from healer.core.health import Verdict
from healer.core.machine import Decision, Trigger, TriggerKind
from healer.core.model import (
    GpuRef,
    HealthState,
    NodeRecord,
    NodeView,
    Outcome,
    Signal,
    SignalKind,
    Taint,
)
from healer.core.phases import PENDING_ADMISSION, Phase
from healer.core.rules import (
    Mode,
    Policy,
    PolicySet,
)
from healer.core.topology import DOMAIN_LABEL, TIER_PREFIX, match_level
from healer.errors import ConfigError, HealerError
from healer.policy.schema import parse_duration
from healer.sim.engine import Replay
from healer.sim.world import (
    SPARE_LABEL,
    SPARE_TAINT,
    Latencies,
    Result,
    SimNode,
    SimSlurmNode,
    SimWorld,
)

#: Version of the JSON report format.
REPORT_FORMAT_VERSION = 1
DEFAULT_NODE_LABELS = "nvidia.com/gpu.present=true"
#: Prefix of the simulated spares' names.
SPARE_PREFIX = "backtest-spare-"
_DISRUPTIVE_STEPS = ("drain", "cordon", "requeue")
_GIVE_BACK_STEPS = ("undrain", "undo-drain")


# ---------------------------------------------------------------------------------------------
# Parsing (times, durations, labels)


_RELATIVE = re.compile(r"^now\s*(?:([+-])\s*(\S+))?$")


def parse_time(text: str, now: float) -> float:
    """RFC3339 (``2026-01-05T09:00:00Z``; no offset means UTC), epoch seconds, ``now`` or
    ``now-7d`` / ``now-90m`` / ``now+1h`` → seconds since the epoch."""
    value = text.strip()
    m = _RELATIVE.match(value)
    if m is not None:
        if m.group(1) is None:
            return now
        try:
            delta = parse_duration(m.group(2))
        except ValueError as e:
            raise ConfigError(f"bad time {text!r}: {e}") from None
        return now - delta if m.group(1) == "-" else now + delta
    if re.fullmatch(r"\d+(\.\d+)?", value):
        return float(value)
    try:
        dt = datetime.fromisoformat(value)
    except ValueError:
        raise ConfigError(f"bad time {text!r}: expected RFC3339 (2026-01-05T09:00:00Z), epoch "
                          "seconds, now or now-7d") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return dt.timestamp()


#: The longest range a backtest reads, and the most evaluation steps it replays: beyond, the
#: fetch or the replay would take hours or exhaust memory; a clear error says so at once.
MAX_RANGE_DAYS = 400
MAX_STEPS = 2_000_000
MIN_STEP = 1.0


def check_range(start: float, end: float, step: float, now: float) -> None:
    """Raise a one-line :class:`ConfigError` unless ``[start, end]`` every ``step`` is a
    range a backtest can read: finite, from 1970 on, not beyond tomorrow, ``start < end``, at
    most :data:`MAX_RANGE_DAYS` days and :data:`MAX_STEPS` steps of at least ``MIN_STEP``."""
    for flag, t in (("--from", start), ("--to", end)):
        if not math.isfinite(t):
            raise ConfigError(f"{flag}: not a finite time")
        if t < 0:
            raise ConfigError(f"{flag}: {_ago(now - t)} ago is before 1970-01-01 (the Unix "
                              "epoch); Prometheus holds nothing older")
        if t > now + 86400:
            raise ConfigError(f"{flag}: {rfc3339(t) if t < 253402300799 else 'beyond 9999'} "
                              "is in the future")
    if not math.isfinite(step) or step < MIN_STEP:
        raise ConfigError(f"--step: expected at least {MIN_STEP:g}s")
    if end <= start:
        raise ConfigError(f"the backtest range is empty: --to ({rfc3339(end)}) must be after "
                          f"--from ({rfc3339(start)})")
    days = (end - start) / 86400
    if days > MAX_RANGE_DAYS:
        raise ConfigError(f"--from/--to: the range is {days:,.0f} days; a backtest reads at "
                          f"most {MAX_RANGE_DAYS} days (split it into shorter ranges)")
    steps = (end - start) / step
    if steps > MAX_STEPS:
        raise ConfigError(f"--step: {human_duration(step)} over {human_duration(end - start)} "
                          f"is {steps:,.0f} steps; at most {MAX_STEPS:,} (use a larger --step)")


def _ago(seconds: float) -> str:
    return f"{seconds / 86400:,.0f} days" if seconds < 1e15 else "an absurd time"


def parse_seconds(text: str, what: str) -> float:
    """A duration (``60s``, ``5m``) or a bare number of seconds."""
    value = text.strip()
    try:
        return float(value) if re.fullmatch(r"\d+(\.\d+)?", value) else parse_duration(value)
    except ValueError as e:
        raise ConfigError(f"{what}: {e}") from None


def parse_labels(text: str) -> dict[str, str]:
    """``k=v,k2=v2`` → a dict (empty text: no labels)."""
    out: dict[str, str] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        key, sep, value = part.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"bad node label {part!r}: expected key=value")
        out[key.strip()] = value.strip()
    return out


def rfc3339(t: float) -> str:
    """UTC, whole seconds unless the time has a fraction (then milliseconds)."""
    t = round(t, 3)
    dt = datetime.fromtimestamp(t, UTC)
    if t == int(t):
        return dt.strftime("%Y-%m-%dT%H:%M:%SZ")
    return dt.strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def human_duration(seconds: float) -> str:
    s = round(seconds)
    if s < 120:
        return f"{s}s"
    if s < 7200:
        return f"{s // 60}m{s % 60:02d}s" if s % 60 else f"{s // 60}m"
    if s < 2 * 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def _num(x: float) -> float | int:
    return int(x) if float(x).is_integer() else x


# ---------------------------------------------------------------------------------------------
# The report


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
                "since": rfc3339(self.since),
                "until": None if self.until is None else rfc3339(self.until)}


@dataclass(frozen=True, slots=True)
class PhaseChange:
    at: float
    source: str
    target: str
    trigger: str

    def to_dict(self) -> dict[str, Any]:
        return {"at": rfc3339(self.at), "from": self.source, "to": self.target,
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
        d: dict[str, Any] = {"step": self.step, "startedAt": rfc3339(self.started_at),
                             "finishedAt": None if self.finished_at is None
                             else rfc3339(self.finished_at), "outcome": self.outcome}
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
        def t(x: float | None) -> str | None:
            return None if x is None else rfc3339(x)

        return {
            "id": self.id, "node": self.node, "policy": self.policy, "mode": self.mode,
            "severity": self.severity, "rules": list(self.rules),
            "gpus": [g.to_dict() for g in self.gpus], "summary": self.summary,
            "openedAt": rfc3339(self.opened_at), "phase": self.phase, "outcome": self.outcome,
            "admittedAt": t(self.admitted_at), "drainedAt": t(self.drained_at),
            "cordonedAt": t(self.cordoned_at), "spare": self.spare or None,
            "spareMatch": self.spare_match or None, "replacedAt": t(self.replaced_at),
            "outOfService": None if self.out_since is None else
            {"since": rfc3339(self.out_since), "until": t(self.out_until)},
            "blocks": [b.to_dict() for b in self.blocks],
            "escalation": None if self.escalated_at is None else
            {"at": rfc3339(self.escalated_at), "reason": self.escalation},
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
        return {"since": rfc3339(self.since),
                "until": None if self.until is None else rfc3339(self.until),
                "reason": self.reason}


@dataclass(frozen=True, slots=True)
class Disruption:
    at: float
    action: str  # drain | cordon | requeue
    incident: str

    def to_dict(self) -> dict[str, Any]:
        return {"at": rfc3339(self.at), "action": self.action, "incident": self.incident}


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
        return {"at": rfc3339(self.at), "scope": self.scope, "node": self.node,
                "count": self.count, "threshold": self.threshold,
                "closesAt": None if self.closes_at is None else rfc3339(self.closes_at)}


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
            "maxOutAt": None if self.max_out_at is None else rfc3339(self.max_out_at),
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
                  f"repairs pass after {human_duration(self.repair_after)}")
        return (f"optimistic world: actions succeed after {lat.api:g}s, a replacement serves "
                f"{lat.pod_start:g}s after the move, validations pass after "
                f"{human_duration(lat.validation)}; drains complete at once (no job data); "
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
        span = human_duration(self.end - self.start)
        lines = [f"healer backtest of {self.source}: {rfc3339(self.start)} → {rfc3339(self.end)} "
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
            "range": {"from": rfc3339(self.start), "to": rfc3339(self.end),
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
# The world


class BacktestWorld(SimWorld):
    """:class:`SimWorld` with no jobs, a spare pool that may be unlimited, and repair results
    after a fixed delay (or never)."""

    def __init__(self, nodes: list[SimNode], *, latencies: Latencies, spares: int | None,
                 spare_labels: Mapping[str, str], repair_after: float | None) -> None:
        self.spare_labels = {**spare_labels, SPARE_LABEL: "spare"}
        pool = [self._spare(i + 1, {}) for i in range(spares or 0)]
        super().__init__([*nodes, *pool], [], latencies)
        self.unlimited = spares is None
        self.repair_after = repair_after
        self._made = len(pool)
        self._repairs: set[str] = set()
        self.changes = 0  # actions executed (a node view may have changed)
        #: (at, +1 claimed / -1 back in the pool, incident) for the spares-needed count
        self.pool_changes: list[tuple[float, int, str]] = []

    def add_node(self, node: SimNode) -> None:
        """A node joins the fleet (with its Slurm node, named like it)."""
        self.nodes[node.name] = node
        self.slurm[node.name] = SimSlurmNode(node.name, node.name)
        self.touch(node.name)
        self.changes += 1

    def _spare(self, n: int, like: Mapping[str, str]) -> SimNode:
        labels = dict(self.spare_labels)
        labels.update({k: v for k, v in like.items()
                       if k == DOMAIN_LABEL or k.startswith(TIER_PREFIX)})
        return SimNode(f"{SPARE_PREFIX}{n:03d}", labels, spare=True,
                       taints=[Taint(SPARE_TAINT, "true", "NoSchedule")])

    def _do_ClaimSpare(self, act: a.ClaimSpare, now: float) -> Result:
        claimed = self.nodes.get(self._claims.get(act.incident, ""))
        mine = claimed is not None and claimed.claimed_by == act.incident
        if self.unlimited and not mine:
            bad = self.nodes[act.node]
            dom = bad.labels.get(DOMAIN_LABEL)
            free = self.free_spares(act.node)
            if not free or (dom and all(n.labels.get(DOMAIN_LABEL) != dom for n in free)):
                self._made += 1
                spare = self._spare(self._made, bad.labels)
                self.nodes[spare.name] = spare
                self.touch(spare.name)
        res = super()._do_ClaimSpare(act, now)
        if not mine and res[0] is StepStatus.DONE:
            self.pool_changes.append((now, 1, act.incident))
        return res

    def _do_ReleaseSpare(self, act: a.ReleaseSpare, now: float) -> Result:
        n = self.nodes.get(act.spare)
        if n is not None and n.claimed_by == act.incident and n.spare:
            self.pool_changes.append((now, -1, act.incident))
        return super()._do_ReleaseSpare(act, now)

    def _do_ReturnToPool(self, act: a.ReturnToPool, now: float) -> Result:
        if not self.nodes[act.node].spare:
            self.pool_changes.append((now, -1, act.incident))
        return super()._do_ReturnToPool(act, now)

    def execute(self, action: a.Action, now: float) -> list[tuple[float, Trigger]]:
        self.changes += 1
        out = super().execute(action, now)
        if (isinstance(action, a.MarkRepair) and self.repair_after is not None
                and action.incident not in self._repairs):
            self._repairs.add(action.incident)
            t = now + self.repair_after
            out.append((t, Trigger(TriggerKind.REPAIR, action.node, t, incident=action.incident,
                                   repair_passed=True)))
        return out


class HistoryReplay(Replay):
    """:class:`Replay` for history: signals arrive one poll (instant) at a time, and every
    verdict change is logged (for the stale stretches of the report). The engine keeps each
    node's signals bounded and wakes only what a signal can change, as in the daemon."""

    def __post_init__(self) -> None:
        super().__post_init__()
        self.step = 60.0
        self.backtest_world: BacktestWorld | None = None
        self.verdict_log: dict[str, list[tuple[float, HealthState, str]]] = defaultdict(list)

    def attach(self, world: BacktestWorld, step: float) -> None:
        self.backtest_world = world
        self.step = step

    def feeder(self, batch: Sequence[Signal]) -> Callable[[float], None]:
        """A callback that delivers ``batch`` (signals of one instant) when it is due."""

        def feed(now: float) -> None:
            self.ingest(batch)

        return feed

    def on_verdict(self, node: str, verdict: Verdict) -> None:
        log = self.verdict_log[node]
        if not log or log[-1][1] is not verdict.state:
            log.append((self.now, verdict.state, verdict.summary()))


# ---------------------------------------------------------------------------------------------
# Collecting what happened


@dataclass
class _Incident:
    id: str
    node: str
    opened_at: float
    record: NodeRecord
    phases: list[PhaseChange] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    open_block: Block | None = None
    escalated_at: float | None = None
    held: bool = False


class _Collector:
    """The ``on_step`` hook: phase changes, blocks and breaker trips of every incident."""

    def __init__(self) -> None:
        self.incidents: dict[str, _Incident] = {}
        self.trips: list[BreakerTrip] = []

    def __call__(self, now: float, before: BudgetView, record: NodeRecord | None,
                 trigger: Trigger, decision: Decision) -> None:
        after = decision.record
        rec = after if after is not None else record
        if rec is None:
            return
        inc = self.incidents.get(rec.incident.id)
        for src, dst, label in decision.transitions:
            if inc is None and dst in PENDING_ADMISSION and after is not None:
                inc = self.incidents[rec.incident.id] = _Incident(rec.incident.id, rec.node,
                                                                  now, after)
                self._breaker(now, before, after)
            if inc is None:
                continue
            inc.phases.append(PhaseChange(now, src.value, dst.value, label))
            if dst is Phase.ESCALATED and inc.escalated_at is None:
                inc.escalated_at = now
            if dst is Phase.HELD_FOR_CAPACITY:
                inc.held = True
        if inc is None:
            return
        if after is not None:
            inc.record = after
        blocked = after.blocked if after is not None else None
        cur = inc.open_block
        if blocked is None:
            if cur is not None:
                inc.blocks.append(replace(cur, until=now))
                inc.open_block = None
        elif cur is None or cur.guardrail != blocked.guardrail:
            if cur is not None:
                inc.blocks.append(replace(cur, until=now))
            inc.open_block = Block(blocked.guardrail, blocked.message, blocked.current,
                                   blocked.limit, now, None)

    def _breaker(self, now: float, before: BudgetView, rec: NodeRecord) -> None:
        ps = before.policies
        policy = ps.get(rec.policy)
        scopes: list[tuple[str, Policy | None]] = []
        if policy is not None and policy.guardrails.breaker is not None:
            scopes.append((f"policy {policy.name}", policy))
        if ps.fleet.guardrails.breaker is not None:
            scopes.append(("fleet", None))
        new = past_incident(rec)
        for scope, pol in scopes:
            cfg = (pol.guardrails if pol is not None else ps.fleet.guardrails).breaker
            assert cfg is not None
            members = len(population(before, pol))
            incidents = [i for i in before.incidents if pol is None or i.policy == pol.name]
            was = breaker_status(cfg, incidents, members, now)
            now_st = breaker_status(cfg, [*incidents, new], members, now)
            if now_st.tripped and not was.tripped:
                self.trips.append(BreakerTrip(now, scope, rec.node, now_st.count,
                                              now_st.threshold, now_st.until))
            elif now_st.tripped:
                for i in range(len(self.trips) - 1, -1, -1):
                    if self.trips[i].scope == scope:
                        self.trips[i] = replace(self.trips[i], closes_at=now_st.until)
                        break


# ---------------------------------------------------------------------------------------------
# The replay


def evaluated_policies(policies: PolicySet, as_configured: bool) -> PolicySet:
    """Every policy in ``act`` mode, unless ``as_configured``."""
    if as_configured:
        return policies
    return replace(policies, policies=tuple(replace(p, mode=Mode.ACT)
                                            for p in policies.policies))


def instants(signals: Iterable[Signal], start: float, end: float) -> list[list[Signal]]:
    """The signals within ``[start, end]``, grouped by instant in time order, without the
    metric samples of a node (or GPU) at an instant where it had no fresh heartbeat.

    That is what the daemon's poll does: range functions keep answering from old samples while
    an exporter is down, but that is not fresh data (stale telemetry is never a fault).
    """
    sigs = [s for s in signals if start <= s.observed_at <= end]
    times = [s.observed_at for s in sigs]
    if times != sorted(times):
        sigs.sort(key=lambda s: s.observed_at)  # stable: the order within an instant is kept
    out: list[list[Signal]] = []
    i, n = 0, len(sigs)
    while i < n:
        t = sigs[i].observed_at
        j = i
        while j < n and sigs[j].observed_at == t:
            j += 1
        batch = sigs[i:j]
        i = j
        fresh: set[str] = set()
        stale: dict[str, set[GpuRef | None]] = {}
        for s in batch:
            if s.kind is SignalKind.FRESH:
                fresh.add(s.node)
            elif s.kind is SignalKind.STALE:
                stale.setdefault(s.node, set()).add(s.gpu)
        kept = [s for s in batch if s.kind is not SignalKind.METRIC or s.node in fresh
                or ((gone := stale.get(s.node)) is not None and None not in gone
                    and s.gpu not in gone)]
        if kept:
            out.append(kept)
    return out


class Backtest:
    """An incremental backtest: :meth:`feed` signals in time order (a chunk at a time, so that
    a long range never has to fit in memory), then :meth:`report`.

    ``nodes`` maps node name → labels (from Kubernetes: every node is in the fleet from the
    start); without it, a node joins the fleet when its telemetry is first seen and gets
    ``node_labels`` (default ``nvidia.com/gpu.present=true``).
    """

    def __init__(self, policies: PolicySet, start: float, end: float, *, step: float = 60.0,
                 node_labels: Mapping[str, str] | None = None,
                 nodes: Mapping[str, Mapping[str, str]] | None = None,
                 spares: int | None = None, as_configured: bool = False,
                 latencies: Latencies | None = None, repair_after: float | None = None,
                 source: str = "", label_source: str = "") -> None:
        if end <= start:
            raise ConfigError("the backtest range is empty: --from must be before --to")
        if step <= 0:
            raise ConfigError("--step must be positive")
        if spares is not None and spares < 0:
            raise ConfigError("--spares must not be negative")
        self.policies = policies
        self.start, self.end, self.step = start, end, step
        self.spares, self.as_configured, self.repair_after = spares, as_configured, repair_after
        self.latencies = latencies or Latencies()
        self.source = source
        self.evaluated = evaluated_policies(policies, as_configured)
        self.default_labels = dict(node_labels) if node_labels is not None \
            else parse_labels(DEFAULT_NODE_LABELS)
        self.kube = nodes is not None
        self.labels_of: dict[str, dict[str, str]] = {
            n: dict(lb) for n, lb in (nodes or {}).items()}
        if label_source:
            self.label_source = label_source
        elif self.kube:
            self.label_source = "labels from Kubernetes"
        else:
            self.label_source = "labels " + (",".join(
                f"{k}={v}" for k, v in sorted(self.default_labels.items())) or "(none)")
        spare_labels = dict(self.default_labels)
        spare_labels.update(self.evaluated.fleet.spare_selector.match_labels)
        self.world = BacktestWorld([SimNode(n, dict(lb)) for n, lb in
                                    sorted(self.labels_of.items())],
                                   latencies=self.latencies, spares=spares,
                                   spare_labels=spare_labels, repair_after=repair_after)
        self.collector = _Collector()
        self.replay = HistoryReplay(self.evaluated, self.world, start, on_step=self.collector,
                                    keep_timeline=False)
        self.replay.attach(self.world, step)
        self.seen: set[str] = set()
        self.signals = 0
        self.seconds = 0.0  # spent replaying
        self._last = -math.inf

    def _joiner(self, nodes: Sequence[str]) -> Callable[[float], None]:
        """Nodes join the fleet when their first signal is due (not when it is fed), so that
        feeding in chunks or at once gives the same fleet at every instant."""

        def join(_now: float) -> None:
            for node in nodes:
                if node in self.labels_of:
                    continue
                # not in Kubernetes: no policy selects it; else the labels every node gets
                labels = {} if self.kube else dict(self.default_labels)
                self.labels_of[node] = labels
                self.world.add_node(SimNode(node, dict(labels)))

        return join

    def feed(self, signals: Iterable[Signal]) -> None:
        """Replay ``signals``; every one must be later than those fed before."""
        began = time.monotonic()
        batches = instants(signals, self.start, self.end)
        if batches and batches[0][0].observed_at <= self._last:
            raise ValueError("backtest signals must be fed in time order")
        for b in batches:
            new = sorted({sig.node for sig in b} - self.seen)
            if new:
                self.seen.update(new)
                self.replay.add_callback(b[0].observed_at, self._joiner(new))
            self.replay.add_callback(b[0].observed_at, self.replay.feeder(b))
            self.signals += len(b)
        if batches:
            self._last = batches[-1][0].observed_at
            self.replay.run(self._last)
        self.seconds += time.monotonic() - began

    def report(self) -> Report:
        """Run to the end of the range; the report."""
        began = time.monotonic()
        self.replay.run(self.end)
        report = _build_report(
            self.replay, self.world, self.collector, self.policies, self.evaluated,
            self.signals, sorted(self.seen), self.labels_of, start=self.start, end=self.end,
            step=self.step, spares=self.spares, as_configured=self.as_configured,
            latencies=self.latencies, repair_after=self.repair_after, source=self.source,
            label_source=self.label_source)
        self.seconds += time.monotonic() - began
        return report


def replay_history(signals: Iterable[Signal], policies: PolicySet, start: float, end: float, *,
                   step: float = 60.0, node_labels: Mapping[str, str] | None = None,
                   nodes: Mapping[str, Mapping[str, str]] | None = None,
                   spares: int | None = None, as_configured: bool = False,
                   latencies: Latencies | None = None, repair_after: float | None = None,
                   source: str = "", label_source: str = "") -> Report:
    """Replay ``signals`` (a backtest's telemetry, in any order) through the engine; the
    report. Pure (see :class:`Backtest` for the arguments)."""
    bt = Backtest(policies, start, end, step=step, node_labels=node_labels, nodes=nodes,
                  spares=spares, as_configured=as_configured, latencies=latencies,
                  repair_after=repair_after, source=source, label_source=label_source)
    bt.feed(signals)
    return bt.report()


# ---------------------------------------------------------------------------------------------
# Building the report


def _steps(rec: NodeRecord) -> tuple[StepEntry, ...]:
    return tuple(StepEntry(s.step, s.started_at, s.finished_at,
                           s.outcome.value if s.outcome is not None else "open", s.detail,
                           s.error) for s in rec.ledger)


def _ok_at(rec: NodeRecord, *names: str) -> float | None:
    times = [s.finished_at for s in rec.ledger
             if s.step in names and s.outcome is Outcome.OK and s.finished_at is not None]
    return min(times) if times else None


def _incident_report(inc: _Incident, world: BacktestWorld, end: float) -> IncidentReport:
    rec = inc.record
    admitted = next((p.at for p in inc.phases if p.source in (Phase.DEGRADING.value,
                                                              Phase.FAILED.value)
                     and p.target in (Phase.CHECKPOINTING.value, Phase.DRAINING.value)), None)
    drained = _ok_at(rec, "drain")
    cordoned = _ok_at(rec, "cordon")
    out_since = drained if drained is not None else cordoned
    out_until = None
    if out_since is not None:
        back = [s.finished_at for s in rec.ledger if s.step in _GIVE_BACK_STEPS
                and s.outcome is Outcome.OK and s.finished_at is not None
                and s.finished_at >= out_since]
        out_until = min(back) if back else None
    spare_match = ""
    replaced = None
    if rec.spare and rec.spare in world.nodes and rec.node in world.nodes:
        spare_match = match_level(world.nodes[rec.node].view(end), world.nodes[rec.spare].view(end))
        replaced = _ok_at(rec, "undrain")
    blocks = list(inc.blocks)
    if inc.open_block is not None:
        blocks.append(inc.open_block)
    return IncidentReport(
        id=inc.id, node=inc.node, policy=rec.policy, mode=rec.mode,
        severity=rec.incident.severity.label, rules=rec.incident.rules, gpus=rec.incident.gpus,
        summary=rec.incident.summary, opened_at=inc.opened_at, phase=rec.phase,
        outcome=rec.outcome, admitted_at=admitted, drained_at=drained, cordoned_at=cordoned,
        spare=rec.spare, spare_match=spare_match, replaced_at=replaced, out_since=out_since,
        out_until=out_until, blocks=tuple(blocks), escalated_at=inc.escalated_at,
        escalation=rec.outcome if inc.escalated_at is not None else "",
        held_for_capacity=inc.held, phases=tuple(inc.phases), steps=_steps(rec))


def _stale_periods(log: Sequence[tuple[float, HealthState, str]]) -> tuple[StalePeriod, ...]:
    out: list[StalePeriod] = []
    for i, (t, state, summary) in enumerate(log):
        if state is HealthState.STALE:
            until = log[i + 1][0] if i + 1 < len(log) else None
            out.append(StalePeriod(t, until, summary))
    return tuple(out)


def _peak(changes: Iterable[tuple[float, int]]) -> tuple[int, float | None]:
    cur = best = 0
    at: float | None = None
    for t, d in sorted(changes, key=lambda c: (c[0], c[1])):  # gives back before taking
        cur += d
        if cur > best:
            best, at = cur, t
    return best, at


def _build_report(replay: HistoryReplay, world: BacktestWorld, collector: _Collector,
                  configured: PolicySet, evaluated: PolicySet, n_signals: int,
                  seen: Sequence[str], labels_of: Mapping[str, Mapping[str, str]], *,
                  start: float, end: float, step: float,
                  spares: int | None, as_configured: bool, latencies: Latencies,
                  repair_after: float | None, source: str, label_source: str) -> Report:
    incidents = [_incident_report(inc, world, end) for inc in collector.incidents.values()]
    by_node: dict[str, list[IncidentReport]] = defaultdict(list)
    for i in incidents:
        by_node[i.node].append(i)
    telemetry = set(seen)
    node_reports: list[NodeReport] = []
    governed = 0
    spare_sel = evaluated.fleet.spare_selector
    for name in sorted(labels_of):
        view = NodeView(name, labels_of[name])
        is_spare = bool(spare_sel.match_labels or spare_sel.match_expressions) \
            and spare_sel.matches(view.labels)
        selecting = tuple(p.name for p in evaluated.policies_for(view)) if not is_spare else ()
        governed += 1 if selecting else 0
        mine = sorted(by_node.get(name, []), key=lambda i: (i.opened_at, i.id))
        disruptions = sorted(
            (Disruption(s.finished_at, s.step, i.id) for i in mine for s in i.steps
             if s.step in _DISRUPTIVE_STEPS and s.outcome == Outcome.OK.value
             and s.finished_at is not None), key=lambda d: (d.at, d.action))
        node_reports.append(NodeReport(name, selecting, name in telemetry, tuple(mine),
                                       tuple(disruptions),
                                       _stale_periods(replay.verdict_log.get(name, []))))
    acting = [i for i in incidents if i.mode == Mode.ACT.value]
    out_changes: list[tuple[float, int]] = []
    for i in acting:
        if i.out_since is not None:
            out_changes.append((i.out_since, 1))
            if i.out_until is not None:
                out_changes.append((i.out_until, -1))
    max_out, max_at = _peak(out_changes)
    real = {i.id for i in acting}  # a dryRun incident only pretends to claim a spare
    pool = [(t, d) for t, d, inc in world.pool_changes if inc in real]
    needed, _ = _peak(pool)
    sev: dict[str, int] = defaultdict(int)
    blocks: dict[str, int] = defaultdict(int)
    for i in incidents:
        sev[i.severity] += 1
        for b in {b.guardrail for b in i.blocks}:
            blocks[b] += 1
    summary = Summary(
        nodes=len(node_reports), governed=governed, incidents=len(incidents),
        by_severity=dict(sev),
        nodes_taken_out=len({i.node for i in acting if i.taken_out}),
        max_concurrently_out=max_out, max_out_at=max_at,
        spares_claimed=sum(1 for _, d in pool if d > 0), spares_needed=needed,
        held_for_capacity=sum(1 for i in incidents if i.held_for_capacity),
        breaker_trips=tuple(collector.trips), blocks=dict(blocks),
        escalations=sum(1 for i in incidents if i.escalated_at is not None),
        recovered=sum(1 for i in incidents if i.outcome == "recovered"),
        stale_nodes=sum(1 for n in node_reports if n.stale),
        dry_run_incidents=sum(1 for i in incidents if i.mode == Mode.DRY_RUN.value))
    modes = tuple(PolicyMode(p.name, p.mode.value, (evaluated.get(p.name) or p).mode.value)
                  for p in configured.policies)
    return Report(source=source, start=start, end=end, step=step, policies=modes,
                  as_configured=as_configured,
                  assumptions=Assumptions(latencies, spares, repair_after),
                  nodes=tuple(node_reports), summary=summary, signals=n_signals,
                  digest=configured.digest, label_source=label_source)


# ---------------------------------------------------------------------------------------------
# The human table


def _short(t: float) -> str:
    return datetime.fromtimestamp(round(t, 3), UTC).strftime("%Y-%m-%d %H:%M:%S")


def _after(t: float | None, since: float) -> str:
    return "-" if t is None else f"+{human_duration(t - since)}"


def _gpus(gpus: Sequence[GpuRef]) -> str:
    return ",".join(str(g.index) if g.index >= 0 else "?" for g in gpus) or "-"


def _held(b: Block, end: float) -> str:
    until = b.until if b.until is not None else end
    still = "" if b.until is not None else " (still at the end)"
    span = human_duration(until - b.since)
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
            lines.append(f"  {node} {_short(p.since)} → {end} ({human_duration(until - p.since)})"
                         f": {p.reason}")
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


# ---------------------------------------------------------------------------------------------
# Fetching and the command


async def kube_node_labels(kubeconfig: str, context: str | None = None
                           ) -> dict[str, dict[str, str]]:
    """Every Node's labels, read once from the API server."""
    from healer.adapters.kube.client import make_api_client
    from healer.adapters.kube.nodes import KubeNodes

    try:
        api = await make_api_client(kubeconfig, context)
    except Exception as e:  # kubernetes_asyncio's own errors: a bad kubeconfig
        raise ConfigError(f"cannot use kubeconfig {kubeconfig}: {e}") from e
    try:
        views = await KubeNodes(api).list()
    finally:
        await api.close()
    return {v.name: dict(v.labels) for v in views}


#: History is fetched a day at a time: Prometheus 2.x evaluates ``timestamp()`` (the freshness
#: query) in a range query in time that grows with the square of the range.
HISTORY_CHUNK = 86400.0


def history_chunks(start: float, end: float, step: float,
                   chunk: float = HISTORY_CHUNK) -> list[tuple[float, float]]:
    """``[start, end]`` cut into ranges of about ``chunk`` seconds (a multiple of ``step``);
    neighbours share their boundary."""
    span = step * max(1, round(chunk / step))
    out: list[tuple[float, float]] = []
    a = start
    while a < end:
        b = min(a + span, end)
        out.append((a, b))
        a = b
    return out


async def iter_history(source: Any, start: float, end: float, step: float, *,
                       chunk: float = HISTORY_CHUNK) -> AsyncGenerator[list[Signal], None]:
    """``source.history()`` over ``[start, end]``, a chunk at a time in time order, the next
    chunk fetched while the caller works on this one.

    Each chunk keeps what lies before the next chunk's start, so every sample and XID is
    reported once. (Give the source an ``xid_overlap`` of at least one scrape interval: each
    chunk takes its XID baseline from the sample before its start.)
    """
    import asyncio

    bounds = history_chunks(start, end, step, chunk)

    async def one(i: int) -> list[Signal]:
        a, b = bounds[i]
        last = i == len(bounds) - 1
        got: list[Signal] = await source.history(a, b, step)
        return [s for s in got if a <= s.observed_at and (last or s.observed_at < b)]

    pending: asyncio.Future[list[Signal]] | None = None
    try:
        for i in range(len(bounds)):
            current = await pending if pending is not None else await one(i)
            pending = asyncio.ensure_future(one(i + 1)) if i + 1 < len(bounds) else None
            yield current
    finally:
        if pending is not None:
            if not pending.done():
                pending.cancel()
            elif not pending.cancelled():
                pending.exception()  # the caller gave up: never "exception never retrieved"


async def fetch_history(source: Any, start: float, end: float, step: float, *,
                        chunk: float = HISTORY_CHUNK) -> list[Signal]:
    """:func:`iter_history`, joined."""
    return [s async for part in iter_history(source, start, end, step, chunk=chunk)
            for s in part]


async def backtest(prometheus: str, policies: PolicySet, start: float, end: float, *,
                   step: float = 60.0, node_labels: Mapping[str, str] | None = None,
                   kubeconfig: str | None = None, spares: int | None = None,
                   as_configured: bool = False, latencies: Latencies | None = None,
                   repair_after: float | None = None,
                   source_options: Mapping[str, Any] | None = None) -> Report:
    """Fetch ``[start, end]`` from Prometheus every ``step`` and replay it, a day at a time
    (see the module).

    ``source_options`` are passed to :class:`PrometheusSource` (``bearer_token_file``,
    ``ca_file``, ``verify``, ``host_labels``, ``matchers``, ``stale_after``...). Raises
    TransientError/PermanentError when Prometheus cannot answer.
    """
    from healer.adapters.prometheus import PrometheusSource

    check_range(start, end, step, time.time())
    began = time.monotonic()
    nodes = await kube_node_labels(kubeconfig) if kubeconfig else None
    bt = Backtest(policies, start, end, step=step, node_labels=node_labels, nodes=nodes,
                  spares=spares, as_configured=as_configured, latencies=latencies,
                  repair_after=repair_after, source=prometheus,
                  label_source=f"labels from Kubernetes ({kubeconfig})" if kubeconfig else "")
    opts: dict[str, Any] = {"timeout": 60.0, "poll_interval": max(step, 60.0),
                            "xid_overlap": max(120.0, 2 * step)}
    opts.update(source_options or {})
    src = PrometheusSource(prometheus, policies, **opts)
    try:
        async with contextlib.aclosing(iter_history(src, start, end, step)) as chunks:
            async for part in chunks:
                bt.feed(part)
    finally:
        src.close()
    report = bt.report()
    total = time.monotonic() - began
    return replace(report, timings={"fetch": total - bt.seconds, "replay": bt.seconds})


def add_backtest_flags(p: argparse.ArgumentParser) -> None:
    """The flags of ``healer backtest``."""
    p.add_argument("--prometheus", required=True, metavar="URL",
                   help="Prometheus (or Thanos/Mimir) URL holding the DCGM history")
    p.add_argument("--policies", nargs="+", required=True, metavar="PATH",
                   help="policy files or directories")
    p.add_argument("--from", dest="start", required=True, metavar="TIME",
                   help="start: RFC3339 (2026-01-05T09:00:00Z), epoch seconds or now-7d; from "
                        f"1970 on, at most {MAX_RANGE_DAYS} days before --to")
    p.add_argument("--to", dest="end", default="now", metavar="TIME",
                   help="end (default: now)")
    p.add_argument("--step", default="60s",
                   help=f"evaluation step (default: 60s; at least {MIN_STEP:g}s, at most "
                        f"{MAX_STEPS:,} steps in the range)")
    p.add_argument("--json", action="store_true", help="the report as JSON (stable, sorted)")
    p.add_argument("--spares", type=int, default=None, metavar="N",
                   help="warm spares in the pool (default: unlimited; the report says how many "
                        "were needed)")
    p.add_argument("--node-labels", default=DEFAULT_NODE_LABELS, metavar="K=V,...",
                   help="labels of every node seen in the telemetry, when no --kubeconfig "
                        f"(default: {DEFAULT_NODE_LABELS})")
    p.add_argument("--kubeconfig", default=None,
                   help="read the real Nodes' labels from this cluster")
    p.add_argument("--as-configured", action="store_true",
                   help="keep observe/dryRun modes (default: evaluate every policy as act)")
    p.add_argument("--action-latency", default="1s",
                   help="how long every simulated action takes (default: 1s)")
    p.add_argument("--replacement-latency", default="45s",
                   help="a moved slurmd serves on the spare after this long (default: 45s)")
    p.add_argument("--validation-latency", default="2m",
                   help="a validation passes after this long (default: 2m)")
    p.add_argument("--repair-after", default=None, metavar="DURATION",
                   help="repairs pass after this long (default: no repair result arrives)")
    p.add_argument("--bearer-token-file", default=None,
                   help="Prometheus bearer token file, sent with every query (read before the "
                        "first and again before each, so a rotated token is picked up)")
    p.add_argument("--ca-file", default=None, help="CA bundle for Prometheus' TLS")
    p.add_argument("--insecure-skip-verify", action="store_true",
                   help="do not verify Prometheus' TLS certificate")


def cmd_backtest(args: argparse.Namespace, *, out: Callable[[str], Any] | None = None) -> int:
    """``healer backtest``: 0 on success, 2 on bad flags/policies or an unreachable Prometheus."""
    import asyncio

    from healer.adapters.prometheus.access import read_bearer_token
    from healer.errors import PolicyError
    from healer.obs.logging import setup
    from healer.policy.load import load_policy_set

    write = out or (lambda text: sys.stdout.write(text))
    try:
        now = time.time()
        start = parse_time(args.start, now)
        end = parse_time(args.end, now)
        step = parse_seconds(args.step, "--step")
        lat = Latencies(parse_seconds(args.action_latency, "--action-latency"),
                        parse_seconds(args.replacement_latency, "--replacement-latency"),
                        parse_seconds(args.validation_latency, "--validation-latency"))
        repair = None if args.repair_after is None else parse_seconds(args.repair_after,
                                                                      "--repair-after")
        check_range(start, end, step, now)
        if args.spares is not None and args.spares < 0:
            raise ConfigError("--spares: expected a count ≥ 0")
        labels = parse_labels(args.node_labels)
        opts: dict[str, Any] = {}
        if args.bearer_token_file:
            read_bearer_token(args.bearer_token_file)  # fails now, not after the first query
            opts["bearer_token_file"] = args.bearer_token_file
        policies = load_policy_set(args.policies)
        if args.ca_file:
            opts["ca_file"] = args.ca_file
        if args.insecure_skip_verify:
            opts["verify"] = False
        setup("warning")  # logs go to stderr: stdout is the report
        report = asyncio.run(backtest(
            args.prometheus, policies, start, end, step=step, node_labels=labels,
            kubeconfig=args.kubeconfig, spares=args.spares, as_configured=args.as_configured,
            latencies=lat, repair_after=repair, source_options=opts))
    except PolicyError as e:
        print(f"healer backtest: invalid policies:\n{e}", file=sys.stderr)
        return 2
    except HealerError as e:
        print(f"healer backtest: {e}", file=sys.stderr)
        return 2
    write(report.to_json() if args.json else report.table())
    if not report.signals:
        print(f"healer backtest: no telemetry between {rfc3339(start)} and {rfc3339(end)} "
              "(check the range, the Prometheus retention and the host labels)",
              file=sys.stderr)
    t = report.timings
    print(f"healer backtest: {report.signals} signals fetched in {t.get('fetch', 0):.1f}s, "
          f"replayed in {t.get('replay', 0):.1f}s", file=sys.stderr)
    return 0
