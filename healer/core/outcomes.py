"""Outcomes, measured: what each incident cost and what the fleet's remediations add up to.

The source is the persisted :class:`~healer.core.model.NodeRecord` (one per incident): its
incident (opened when confirmed), its evidence, its phase history and its step ledger. From a
record, :func:`incident_outcome` gives the incident's figures; from many, :func:`summarize`
gives the fleet's (p50/p90/p99 of each duration, totals, time between incidents per node and
per GPU serial, and healer's own false-positive rate). ``healer report`` prints them and the
daemon's metrics observe them when an incident finishes.

What each figure means (and where it comes from):

* **time to detect**: the first sign of the fault → the incident opened (confirmed). The
  first sign is the earliest of the record's first suspicion (its Healthy → Suspect
  transition) and its kept evidence (an XID's or sample's time; a node condition's
  ``lastTransitionTime``; when Slurm's state or reason was set). Evidence is bounded (the
  latest signals), so this can only understate.
* **time per step**: each finished ledger entry, ``finishedAt - startedAt``.
* **time to service**: opened → the node, or its replacement, undrained (back in Slurm);
  **time to replacement**: the same when a spare took its place.
* **out of service**: from the first accepted drain or cordon to the undrain (or to the end
  of healer's undo, or to the close when healer left its changes for a human, or to ``now``
  while open); **GPU-hours lost** = that times the node's GPUs. Only ``act`` records take a node
  out (``dryRun`` and ``observe`` change nothing).
* **found nothing**: the signal cleared on its own (Recovered), before any disruptive step
  or after the drain; or the repair reported no fault (``healer.io/repair-result: no-fault``,
  kept on the mark-repair step); ``found_nothing / finished`` is the false-positive rate.

Pure: no clock, no I/O; ``now`` and each node's GPU count are passed in.
"""

from __future__ import annotations

import enum
import itertools
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from healer.core.machine.effects import NO_FAULT_DETAIL
from healer.core.model import NodeRecord, NodeView, RecordOutcome, SignalKind, StepOutcome
from healer.core.modes import Mode
from healer.core.phases import TERMINAL, Phase
from healer.core.vocabulary import StepName

#: GPUs per node when the node's count is not known (an 8-GPU HGX/DGX board).
DEFAULT_GPUS_PER_NODE = 8
#: The label GPU feature discovery puts on a node: how many GPUs it has.
GPU_COUNT_LABEL = "nvidia.com/gpu.count"
#: The percentiles every duration is summarised by.
QUANTILES = (50, 90, 99)


class Closing(enum.Enum):
    """How an incident ended (``open`` while it has not)."""

    REPLACED = "replaced"  # a spare serves in the node's place
    REPAIRED = "repaired"  # the node itself went back to service after repair
    RECOVERED = "recovered"  # the signal cleared on its own; healer undid its changes
    ESCALATED = "escalated"  # handed to a human
    CANCELLED = "cancelled"  # an admin uncordoned or opted the node out
    OPEN = "open"


class FoundNothing(enum.Enum):
    """Why a finished remediation counts as having found nothing (a false positive)."""

    RECOVERED_BEFORE_DISRUPTION = "recovered-before-disruption"
    RECOVERED_AFTER_DRAIN = "recovered-after-drain"
    REPAIR_FOUND_NO_FAULT = "repair-found-no-fault"  # healer.io/repair-result: no-fault


@dataclass(frozen=True, slots=True)
class StepTime:
    """One finished ledger entry: how long it took and how it ended."""

    step: str
    seconds: float
    outcome: str


@dataclass(frozen=True, slots=True)
class IncidentOutcome:
    """The figures of one incident (one record)."""

    incident: str
    node: str
    policy: str
    severity: str
    mode: Mode
    phase: Phase
    closing: Closing
    opened_at: float
    closed_at: float | None
    serials: tuple[str, ...]
    detect: float | None
    steps: tuple[StepTime, ...]
    to_service: float | None
    to_replacement: float | None
    out_of_service: float
    still_out: bool  # out at ``now`` (open) or when healer handed it to a human
    node_gpus: int
    found_nothing: FoundNothing | None

    @property
    def finished(self) -> bool:
        return self.closing is not Closing.OPEN

    @property
    def gpu_hours_lost(self) -> float:
        return self.out_of_service * self.node_gpus / 3600.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "incident": self.incident, "node": self.node, "policy": self.policy,
            "severity": self.severity, "mode": self.mode.value, "phase": self.phase.value,
            "closing": self.closing.value, "openedAt": _num(self.opened_at),
            "closedAt": _num(self.closed_at), "gpuSerials": list(self.serials),
            "timeToDetectSeconds": _num(self.detect),
            "steps": [{"step": s.step, "seconds": _num(s.seconds), "outcome": s.outcome}
                      for s in self.steps],
            "timeToServiceSeconds": _num(self.to_service),
            "timeToReplacementSeconds": _num(self.to_replacement),
            "outOfServiceSeconds": _num(self.out_of_service), "stillOut": self.still_out,
            "nodeGpus": self.node_gpus, "gpuHoursLost": _num(self.gpu_hours_lost),
            "foundNothing": self.found_nothing.value if self.found_nothing else None,
        }


def _num(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def node_gpus(view: NodeView | None, default: int = DEFAULT_GPUS_PER_NODE) -> int:
    """How many GPUs a node has: its :data:`GPU_COUNT_LABEL`, else ``default``."""
    text = view.labels.get(GPU_COUNT_LABEL, "") if view is not None else ""
    return int(text) if text.isdigit() and 0 < int(text) <= 1024 else default


def confirmed(record: NodeRecord) -> bool:
    """Is ``record`` an incident? A record still in Suspect was never confirmed."""
    return record.phase is not Phase.SUSPECT


def _first_ok_finish(record: NodeRecord, step: str) -> float | None:
    times = [s.finished_at for s in record.ledger
             if s.step == step and s.outcome is StepOutcome.DONE and s.finished_at is not None]
    return min(times) if times else None


#: Signals whose value is when their finding began (a condition's lastTransitionTime, when
#: Slurm's state or reason was set), not a measurement.
_VALUE_IS_SINCE = frozenset({SignalKind.CONDITION, SignalKind.SLURM})


def first_sign(record: NodeRecord) -> float | None:
    """When the first sign of the fault was seen (see the module docstring), if known."""
    times = [h.at for h in record.history if h.source is Phase.HEALTHY]
    for s in record.incident.evidence:
        since = s.kind in _VALUE_IS_SINCE and 0 < s.value <= s.observed_at
        times.append(s.value if since else s.observed_at)
    return min(times) if times else None


def closing_of(record: NodeRecord) -> Closing:
    """How ``record`` ended (``OPEN`` while its phase is not terminal)."""
    if record.phase not in TERMINAL:
        return Closing.OPEN
    if record.phase is Phase.ESCALATED:
        return Closing.ESCALATED
    if record.phase is Phase.CANCELLED:
        return Closing.CANCELLED
    if record.outcome is RecordOutcome.RECOVERED:
        return Closing.RECOVERED
    return Closing.REPLACED if record.spare else Closing.REPAIRED


def _took_out(record: NodeRecord) -> float | None:
    """When healer's first accepted drain or cordon began (None: it took nothing out)."""
    if record.mode is not Mode.ACT:
        return None
    starts = [s.started_at for s in record.ledger if s.step in (StepName.DRAIN, StepName.CORDON)
              and s.outcome is StepOutcome.DONE]
    return min(starts) if starts else None


def _out_of_service(record: NodeRecord, closing: Closing, now: float) -> tuple[float, bool]:
    start = _took_out(record)
    if start is None:
        return 0.0, False
    back = _first_ok_finish(record, StepName.UNDRAIN)
    if back is not None:
        return max(back - start, 0.0), False
    if closing is Closing.OPEN:
        return max(now - start, 0.0), True
    undone = [t for t in (_first_ok_finish(record, StepName.UNDO_DRAIN),
                          _first_ok_finish(record, StepName.UNCORDON)) if t is not None]
    end = max([record.phase_since, *undone])
    left_out = closing in (Closing.ESCALATED, Closing.CANCELLED) and not undone
    return max(end - start, 0.0), left_out


def incident_outcome(record: NodeRecord, now: float,
                     node_gpus: int = DEFAULT_GPUS_PER_NODE) -> IncidentOutcome:
    """The figures of ``record``'s incident at ``now``."""
    inc = record.incident
    closing = closing_of(record)
    first = first_sign(record)
    detect = None if first is None else max(inc.opened_at - first, 0.0)
    steps = tuple(StepTime(s.step, max(s.finished_at - s.started_at, 0.0),
                           (s.outcome or StepOutcome.DONE).ledger_word)
                  for s in record.ledger if s.finished_at is not None)
    acted = record.mode is Mode.ACT
    back = _first_ok_finish(record, StepName.UNDRAIN) if acted else None
    to_service = None if back is None else max(back - inc.opened_at, 0.0)
    out, still_out = _out_of_service(record, closing, now)
    found: FoundNothing | None = None
    repair = record.step(StepName.MARK_REPAIR)
    if closing is Closing.RECOVERED:
        found = (FoundNothing.RECOVERED_AFTER_DRAIN if _took_out(record) is not None
                 else FoundNothing.RECOVERED_BEFORE_DISRUPTION)
    elif closing is not Closing.OPEN and repair is not None and \
            NO_FAULT_DETAIL in repair.detail.split(","):
        found = FoundNothing.REPAIR_FOUND_NO_FAULT
    return IncidentOutcome(
        incident=inc.id, node=record.node, policy=record.policy, severity=inc.severity.label,
        mode=record.mode, phase=record.phase, closing=closing, opened_at=inc.opened_at,
        closed_at=record.phase_since if closing is not Closing.OPEN else None,
        serials=tuple(sorted({g.serial for g in inc.gpus if g.serial})), detect=detect,
        steps=steps, to_service=to_service,
        to_replacement=to_service if record.spare else None,
        out_of_service=out, still_out=still_out, node_gpus=max(node_gpus, 0),
        found_nothing=found)


# -- the fleet -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Percentiles:
    """A duration's distribution: how many, p50/p90/p99 (nearest rank) and the largest."""

    count: int
    p50: float | None
    p90: float | None
    p99: float | None
    max: float | None

    def to_dict(self) -> dict[str, Any]:
        return {"count": self.count, "p50": _num(self.p50), "p90": _num(self.p90),
                "p99": _num(self.p99), "max": _num(self.max)}


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0 < q ≤ 100) of non-empty ``sorted_values``, nearest rank:
    always one of the values, and monotone in ``q``."""
    n = len(sorted_values)
    rank = min(max(math.ceil(q / 100.0 * n), 1), n)
    return sorted_values[rank - 1]


def percentiles(values: Iterable[float]) -> Percentiles:
    """The :class:`Percentiles` of ``values`` (NaN and infinities are left out)."""
    xs = sorted(v for v in values if math.isfinite(v))
    if not xs:
        return Percentiles(0, None, None, None, None)
    p50, p90, p99 = (percentile(xs, q) for q in QUANTILES)
    return Percentiles(len(xs), p50, p90, p99, xs[-1])


@dataclass(frozen=True, slots=True)
class Repeat:
    """A node or GPU serial with more than one incident: how many, and the gaps between."""

    key: str
    incidents: int
    shortest_gap: float


@dataclass(frozen=True, slots=True)
class FleetOutcomes:
    """The fleet's figures over the incidents opened since ``since``."""

    since: float
    now: float
    records: int  # every record read, in the window or not
    oldest_opened_at: float | None  # the oldest record read (retention prunes older ones)
    incidents: tuple[IncidentOutcome, ...]  # confirmed, opened in the window, oldest first
    detect: Percentiles
    to_service: Percentiles
    to_replacement: Percentiles
    steps: Mapping[str, Percentiles]
    between_per_node: Percentiles
    between_per_serial: Percentiles
    repeat_nodes: tuple[Repeat, ...]
    repeat_serials: tuple[Repeat, ...]

    @property
    def finished(self) -> int:
        return sum(1 for i in self.incidents if i.finished)

    @property
    def closings(self) -> dict[str, int]:
        out = {c.value: 0 for c in Closing}
        for i in self.incidents:
            out[i.closing.value] += 1
        return out

    @property
    def found_nothing(self) -> dict[str, int]:
        out = {f.value: 0 for f in FoundNothing}
        for i in self.incidents:
            if i.found_nothing is not None:
                out[i.found_nothing.value] += 1
        return out

    @property
    def false_positive_rate(self) -> float | None:
        """Found nothing / finished (None when nothing finished)."""
        return sum(self.found_nothing.values()) / self.finished if self.finished else None

    @property
    def gpu_hours_lost(self) -> float:
        return sum(i.gpu_hours_lost for i in self.incidents)

    @property
    def node_hours_lost(self) -> float:
        return sum(i.out_of_service for i in self.incidents) / 3600.0

    def to_dict(self) -> dict[str, Any]:
        fpr = self.false_positive_rate
        return {
            "since": _num(self.since), "now": _num(self.now), "recordsRead": self.records,
            "oldestRecordOpenedAt": _num(self.oldest_opened_at),
            "incidents": len(self.incidents), "finished": self.finished,
            "closings": self.closings, "foundNothing": self.found_nothing,
            "falsePositiveRate": None if fpr is None else round(fpr, 4),
            "gpuHoursLost": _num(self.gpu_hours_lost),
            "nodeHoursLost": _num(self.node_hours_lost),
            "timeToDetectSeconds": self.detect.to_dict(),
            "timeToServiceSeconds": self.to_service.to_dict(),
            "timeToReplacementSeconds": self.to_replacement.to_dict(),
            "stepSeconds": {k: v.to_dict() for k, v in sorted(self.steps.items())},
            "secondsBetweenIncidentsPerNode": self.between_per_node.to_dict(),
            "secondsBetweenIncidentsPerGpuSerial": self.between_per_serial.to_dict(),
            "repeatNodes": [_repeat(r) for r in self.repeat_nodes],
            "repeatGpuSerials": [_repeat(r) for r in self.repeat_serials],
            "perIncident": [i.to_dict() for i in self.incidents],
        }


def _repeat(r: Repeat) -> dict[str, Any]:
    return {"key": r.key, "incidents": r.incidents, "shortestGapSeconds": _num(r.shortest_gap)}


def _gaps(opened: Mapping[str, list[float]], since: float
          ) -> tuple[list[float], tuple[Repeat, ...]]:
    """Gaps between consecutive incidents of each key, counted when the later one opened in
    the window; the keys with two or more incidents there (most incidents first)."""
    gaps: list[float] = []
    repeats: list[Repeat] = []
    for key, times in opened.items():
        ts = sorted(times)
        mine = [b - a for a, b in itertools.pairwise(ts) if b >= since]
        gaps += mine
        if mine:
            repeats.append(Repeat(key, sum(1 for t in ts if t >= since) + (
                1 if ts[0] < since else 0), min(mine)))
    repeats.sort(key=lambda r: (-r.incidents, r.shortest_gap, r.key))
    return gaps, tuple(repeats)


def summarize(records: Iterable[NodeRecord], now: float, since: float,
              gpus_of: Callable[[str], int] = lambda _node: DEFAULT_GPUS_PER_NODE
              ) -> FleetOutcomes:
    """The fleet's figures over the incidents opened at or after ``since`` (the previous
    incident of a node or serial may be older). Durations of steps, service, replacement and
    capacity count only ``act`` records: ``dryRun`` steps change nothing."""
    recs = list(records)
    incidents = [r for r in recs if confirmed(r)]
    by_node: dict[str, list[float]] = defaultdict(list)
    by_serial: dict[str, list[float]] = defaultdict(list)
    for r in incidents:
        by_node[r.node].append(r.incident.opened_at)
        for serial in {g.serial for g in r.incident.gpus if g.serial}:
            by_serial[serial].append(r.incident.opened_at)
    window = sorted((incident_outcome(r, now, gpus_of(r.node)) for r in incidents
                     if r.incident.opened_at >= since), key=lambda o: (o.opened_at, o.incident))
    acted = [o for o in window if o.mode is Mode.ACT]
    steps: dict[str, list[float]] = defaultdict(list)
    for o in acted:
        for st in o.steps:
            steps[st.step].append(st.seconds)
    node_gaps, repeat_nodes = _gaps(by_node, since)
    serial_gaps, repeat_serials = _gaps(by_serial, since)
    return FleetOutcomes(
        since=since, now=now, records=len(recs),
        oldest_opened_at=min((r.incident.opened_at for r in recs), default=None),
        incidents=tuple(window),
        detect=percentiles(o.detect for o in window if o.detect is not None),
        to_service=percentiles(o.to_service for o in acted if o.to_service is not None),
        to_replacement=percentiles(o.to_replacement for o in acted
                                   if o.to_replacement is not None),
        steps={k: percentiles(v) for k, v in steps.items()},
        between_per_node=percentiles(node_gaps), between_per_serial=percentiles(serial_gaps),
        repeat_nodes=repeat_nodes, repeat_serials=repeat_serials)
