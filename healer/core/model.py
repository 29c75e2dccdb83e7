"""The domain model: GPUs, nodes, signals, verdicts, incidents and the persisted per-node record.

Everything here is a frozen, slotted dataclass. Times are plain ``float`` seconds since the
epoch, passed in by the caller (the core never reads a clock). The per-node record round-trips
exactly through :meth:`NodeRecord.to_dict` / :meth:`NodeRecord.from_dict`, whose output is the
``status`` of a ``NodeRemediation`` custom resource; the format carries a version.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from healer.core.modes import Mode
from healer.core.parts import PartRef
from healer.core.phases import Phase

#: Version of the serialised record format (``status.formatVersion``).
RECORD_FORMAT_VERSION = 1


class Severity(enum.IntEnum):
    """How bad a confirmed finding is. Ordered: a higher value is worse."""

    DEGRADING = 1
    FAILED = 2

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Severity:
        try:
            return cls[text.upper()]
        except KeyError:
            raise ValueError(f"unknown severity {text!r} (expected degrading or failed)") from None


class HealthState(enum.Enum):
    """The health verdict of one node at one instant."""

    HEALTHY = "healthy"
    SUSPECT = "suspect"  # a rule matches but its for:/count has not been met yet
    STALE = "stale"  # telemetry missing or old: unknown, never healthy, never failed
    DEGRADING = "degrading"
    FAILED = "failed"
    DEAD = "dead"  # the node cannot act on its own (its kubelet and slurmd do not answer)

    @property
    def is_confirmed(self) -> bool:
        return self in (HealthState.DEGRADING, HealthState.FAILED, HealthState.DEAD)


class SignalKind(enum.Enum):
    """What a signal measures."""

    XID = "xid"  # value = XID code; one signal per occurrence
    METRIC = "metric"  # value = a telemetry sample; key = field name
    CONDITION = "condition"  # key = condition type; status/reason in ``detail``
    STALE = "stale"  # the source has no fresh data for this node (key = source)
    FRESH = "fresh"  # heartbeat: the source has fresh data for this node
    SLURM = "slurm"  # what Slurm says is wrong (states, reason): core.slurm_signals


class TelemetrySourceName(enum.Enum):
    """The telemetry sources whose samples carry freshness (METRIC, XID, FRESH, STALE signals),
    which a staleness rule's ``sources`` may name; the policy schema lists exactly these."""

    DCGM = "dcgm"  # the Prometheus source (DCGM fields and any series)


@dataclass(frozen=True, slots=True, order=True)
class GpuRef:
    """One GPU on a node. Any of the identifiers may be unknown (empty)."""

    index: int = -1
    uuid: str = ""
    serial: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "uuid": self.uuid, "serial": self.serial}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GpuRef:
        return cls(index=int(d.get("index", -1)), uuid=str(d.get("uuid", "")),
                   serial=str(d.get("serial", "")))

    def describe(self) -> str:
        parts = [f"GPU {self.index}" if self.index >= 0 else "GPU ?"]
        if self.uuid:
            parts.append(self.uuid)
        if self.serial:
            parts.append(f"serial {self.serial}")
        return " ".join(parts)


@dataclass(frozen=True, slots=True)
class SlurmFinding:
    """What Slurm says is wrong with one node: its states (each with the time it was first
    seen, in ``slurm_signals.SLURM_STATES`` order) and the owner's reason (user and time when
    Slurm says). :mod:`healer.core.slurm_signals` makes it; it travels on its SLURM signal."""

    states: tuple[tuple[str, float], ...]
    reason: str = ""
    reason_since: float = 0.0
    user: str = ""
    reason_time: str = ""

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(s for s, _ in self.states)

    @property
    def since(self) -> float:
        return min(t for _, t in self.states)

    def describe(self) -> str:
        """``Slurm DOWN+DRAIN: "NHC: GPU 3 ECC" (by root at 2026-11-25T22:11:14)``."""
        text = f"Slurm {'+'.join(self.names)}"
        if not self.reason:
            return text + " (no reason given)"
        text += f': "{self.reason}"'
        who = " ".join(x for x in (f"by {self.user}" if self.user else "",
                                   f"at {self.reason_time}" if self.reason_time else "") if x)
        return f"{text} ({who})" if who else text


@dataclass(frozen=True, slots=True)
class Signal:
    """One observation about a node from one source.

    ``key`` names what was observed: the telemetry field for metrics, the condition type for
    conditions, the source for staleness. ``detail`` carries extra labels (condition status and
    reason, PromQL labels) as a sorted tuple of pairs so that the signal stays hashable.
    ``part``: the part of the node a metric sample is about when it is not a GPU (an HCA
    port: a rule with ``per`` labels).
    """

    node: str
    source: str
    kind: SignalKind
    key: str
    value: float
    observed_at: float
    gpu: GpuRef | None = None
    detail: tuple[tuple[str, str], ...] = ()
    part: PartRef | None = None
    finding: SlurmFinding | None = field(default=None, compare=False, repr=False)
    """A SLURM signal's finding, typed, as the Slurm feed made it (not on the wire: ``detail``
    carries it there); None on every other signal and on one read back from the wire."""

    def get(self, name: str, default: str = "") -> str:
        for k, v in self.detail:
            if k == name:
                return v
        return default

    @staticmethod
    def details(**kw: str) -> tuple[tuple[str, str], ...]:
        return tuple(sorted(kw.items()))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"source": self.source, "kind": self.kind.value, "key": self.key,
                             "value": self.value, "observedAt": self.observed_at}
        if self.gpu is not None:
            d["gpu"] = self.gpu.to_dict()
        if self.detail:
            d["detail"] = dict(self.detail)
        if self.part is not None:
            d["part"] = dict(self.part.labels)
        return d

    @classmethod
    def from_dict(cls, node: str, d: Mapping[str, Any]) -> Signal:
        gpu, part = d.get("gpu"), d.get("part")
        return cls(node, str(d["source"]), SignalKind(d["kind"]), str(d["key"]),
                   float(d["value"]), float(d["observedAt"]),
                   None if gpu is None else GpuRef.from_dict(gpu),
                   tuple(sorted((str(k), str(v)) for k, v in (d.get("detail") or {}).items())),
                   None if part is None else PartRef.of(part))


@dataclass(frozen=True, slots=True)
class Taint:
    key: str
    value: str
    effect: str


@dataclass(frozen=True, slots=True)
class NodeCondition:
    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_transition: float = 0.0
    last_heartbeat: float = 0.0  # when its detector last vouched for it (0: it never says)
    writer: str = ""  # the field manager that wrote its message (managedFields; "": unknown)

    def same_content(self, other: NodeCondition) -> bool:
        """Equal but for the heartbeat (a re-publish of an unchanged condition)."""
        return (self.type, self.status, self.reason, self.message, self.last_transition,
                self.writer) == (other.type, other.status, other.reason, other.message,
                                 other.last_transition, other.writer)


@dataclass(frozen=True, slots=True)
class NodeView:
    """What the core knows about one Kubernetes node."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)
    unschedulable: bool = False
    taints: tuple[Taint, ...] = ()
    conditions: tuple[NodeCondition, ...] = ()

    def label(self, key: str) -> str | None:
        return self.labels.get(key)

    @property
    def ready(self) -> bool:
        for c in self.conditions:
            if c.type == "Ready":
                return c.status == "True"
        return True

    @property
    def ready_since(self) -> float | None:
        """Since when its Ready condition is True (None: it is not, or it has none, or no
        transition time is known)."""
        for c in self.conditions:
            if c.type == "Ready":
                return c.last_transition or None if c.status == "True" else None
        return None

    @property
    def not_ready_since(self) -> float | None:
        """Since when its Ready condition is not True (None: it is, or it has none)."""
        for c in self.conditions:
            if c.type == "Ready":
                return None if c.status == "True" else c.last_transition
        return None


#: At most this many signals are kept as an incident's evidence.
EVIDENCE_LIMIT = 32


@dataclass(frozen=True, slots=True)
class Incident:
    """Why a remediation exists: what was seen, how bad, on which GPUs.

    ``evidence`` keeps the signals that confirmed it (bounded), so a restarted controller
    can re-seed what it cannot observe again (an XID is an event, not a state).
    """

    id: str
    node: str
    opened_at: float
    severity: Severity
    rules: tuple[str, ...]
    gpus: tuple[GpuRef, ...] = ()
    summary: str = ""
    evidence: tuple[Signal, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "node": self.node,
            "openedAt": self.opened_at,
            "severity": self.severity.label,
            "rules": list(self.rules),
            "gpus": [g.to_dict() for g in self.gpus],
            "summary": self.summary,
            "evidence": [s.to_dict() for s in self.evidence],
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Incident:
        node = str(d["node"])
        return cls(
            id=str(d["id"]),
            node=node,
            opened_at=float(d["openedAt"]),
            severity=Severity.parse(str(d["severity"])),
            rules=tuple(str(r) for r in d.get("rules", ())),
            gpus=tuple(GpuRef.from_dict(g) for g in d.get("gpus", ())),
            summary=str(d.get("summary", "")),
            evidence=tuple(Signal.from_dict(node, s) for s in d.get("evidence", ())),
        )


class StepOutcome(enum.StrEnum):
    """How a step went: what an adapter answers (:class:`healer.ports.HookResult`), what the
    executor reports to the state machine (a ``STEP`` trigger), and how a ledger entry ended
    (:class:`StepRecord`). One type for all three; the values are the wire forms (the
    ``status`` label of ``healer_actions_total``, a ledger entry's ``outcome``)."""

    DONE = "done"  # finished successfully
    PENDING = "pending"  # started, not finished yet: poll again later
    RETRY = "retry"  # a transient failure: try again (counts against the attempt budget)
    FAILED = "failed"  # a permanent failure
    UNAVAILABLE = "unavailable"  # nothing to act with (no spare that fits)
    TIMEOUT = "timeout"  # a ledger entry whose deadline passed
    SKIPPED = "skipped"  # a ledger entry closed without running (superseded)

    @property
    def ledger_word(self) -> str:
        """How a ledger entry (``status.ledger[].outcome``, the ``outcome`` label of
        ``healer_step_duration_seconds``) writes this outcome: ``ok`` for DONE, as ledgers
        were always written, else the value."""
        return _LEDGER_OK if self is StepOutcome.DONE else self.value

    @classmethod
    def from_ledger(cls, word: str) -> StepOutcome:
        """The outcome a ledger entry's ``outcome`` names; ValueError for any other word."""
        words = {o.ledger_word: o for o in LEDGER_OUTCOMES}
        if word not in words:
            raise ValueError(f"{word!r} is not a ledger outcome (expected one of "
                             f"{', '.join(sorted(words))})")
        return words[word]


class StepKey(enum.StrEnum):
    """The keys of a step's reported data that the state machine reads (the data may carry
    others, which only go into the ledger entry's ``detail``)."""

    SLURM_NODE = "slurmNode"  # the Slurm node the step acted on (it becomes the record's)
    SPARE = "spare"  # the claimed spare
    HELD = "held"  # a PENDING step waits on someone else (e.g. their drain)
    CARRIED = "carried"  # the reason a move carried over to the replacement (ADR 0016)
    OWNER = "owner"  # whose the change was: healer or other
    JOBS = "jobs"  # the jobs on a dead node, comma-separated
    PROVIDER = "provider"  # how a dead node was fenced (a FenceProvider value)
    BY = "by"  # who or what fenced it
    MATCH = "match"  # how near the claimed spare is (a placement level)
    NODE_DOMAIN = "nodeDomain"  # the node's NVLink domain
    SPARE_DOMAIN = "spareDomain"  # the spare's
    SWITCH = "switch"  # the switch they share


_LEDGER_OK = "ok"
#: The outcomes a finished ledger entry may have.
LEDGER_OUTCOMES = frozenset({StepOutcome.DONE, StepOutcome.FAILED, StepOutcome.TIMEOUT,
                             StepOutcome.SKIPPED})


@dataclass(frozen=True, slots=True)
class StepRecord:
    """One step of the ledger: when it started and finished, how often it was tried."""

    step: str
    started_at: float
    attempts: int = 1
    finished_at: float | None = None
    outcome: StepOutcome | None = None
    error: str = ""
    detail: str = ""

    def __post_init__(self) -> None:
        if self.outcome is not None and (not isinstance(self.outcome, StepOutcome)
                                         or self.outcome not in LEDGER_OUTCOMES):
            raise ValueError(f"{self.outcome!r} does not end a ledger step")

    @property
    def done(self) -> bool:
        return self.finished_at is not None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"step": self.step, "startedAt": self.started_at,
                             "attempts": self.attempts}
        if self.finished_at is not None:
            d["finishedAt"] = self.finished_at
        if self.outcome is not None:
            d["outcome"] = self.outcome.ledger_word
        if self.error:
            d["error"] = self.error
        if self.detail:
            d["detail"] = self.detail
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> StepRecord:
        fin = d.get("finishedAt")
        out = d.get("outcome")
        return cls(
            step=str(d["step"]),
            started_at=float(d["startedAt"]),
            attempts=int(d.get("attempts", 1)),
            finished_at=None if fin is None else float(fin),
            outcome=None if out is None else StepOutcome.from_ledger(str(out)),
            error=str(d.get("error", "")),
            detail=str(d.get("detail", "")),
        )


class Guardrail(enum.StrEnum):
    """What held a disruptive step back. The value is the wire form (``status.blocked`` of a
    NodeRemediation, the ``guardrail`` label of ``healer_guardrail_blocks_total``, the Event
    reason ``blocked-<value>``)."""

    PAUSE = "pause"
    RETRY_BUDGET_NODE = "retry-budget-node"
    RETRY_BUDGET_GPU = "retry-budget-gpu"
    MASS_DEATH = "mass-death"
    BREAKER = "breaker"
    MAX_CONCURRENT = "max-concurrent"
    SLURM_UNKNOWN = "slurm-unknown"
    MAX_UNAVAILABLE = "max-unavailable"
    FAILURE_DOMAIN = "failure-domain"
    OBSERVE_ONLY = "observe-only"  # the policy's mode, not a limit
    UNCONFIRMED = "unconfirmed"  # the latest verdict is no longer degrading/failed

    @property
    def counts_capacity(self) -> bool:
        """A limit on the capacity out of service: it may let go when any node comes back."""
        return self in (Guardrail.MAX_UNAVAILABLE, Guardrail.FAILURE_DOMAIN,
                        Guardrail.SLURM_UNKNOWN)


@dataclass(frozen=True, slots=True)
class GuardrailBlock:
    """Which guardrail stopped a disruptive step, with the numbers that made it say no."""

    guardrail: Guardrail
    message: str
    current: float = 0
    limit: float = 0

    def __post_init__(self) -> None:
        if not isinstance(self.guardrail, Guardrail):
            raise TypeError(f"GuardrailBlock.guardrail must be a Guardrail, not "
                            f"{self.guardrail!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"guardrail": self.guardrail, "message": self.message,
                "current": self.current, "limit": self.limit}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> GuardrailBlock:
        return cls(guardrail=Guardrail(str(d["guardrail"])), message=str(d["message"]),
                   current=float(d.get("current", 0)), limit=float(d.get("limit", 0)))


@dataclass(frozen=True, slots=True)
class OpenRemediation:
    """What the guardrails need to know about a record that is not closed."""

    node: str
    policy: str
    phase: Phase
    opened_at: float
    spare: str = ""
    out_of_service: bool = False  # healer holds the node out (drained/cordoned, not undone)
    active: bool = False  # holds a maxConcurrent slot (see machine.counts_as_active)


@dataclass(frozen=True, slots=True)
class PastIncident:
    """An incident opened recently (open or closed), for the breaker and retry budgets."""

    id: str
    node: str
    opened_at: float
    policy: str = ""
    serials: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Placement:
    """How far a claimed spare is from the node it replaces (``status.sparePlacement``).

    ``level``: ``domain`` (the same NVLink domain), ``tier-N`` (another domain, or no domain
    labels, sharing the fabric switch of tier N, the lowest shared one), ``any`` (nothing in
    common). ``switch``: the shared tier-N switch, if any.
    """

    level: str
    node_domain: str = ""
    spare_domain: str = ""
    switch: str = ""

    @property
    def same_domain(self) -> bool:
        return self.node_domain == self.spare_domain

    def describe(self, node: str, spare: str) -> str:
        if self.same_domain:
            return f"spare {spare} is in {node}'s NVLink domain {self.node_domain or '(none)'}"
        where = (f"spare {spare} is in NVLink domain {self.spare_domain or '(none)'}, {node} in "
                 f"{self.node_domain or '(none)'}")
        if self.level.startswith("tier-"):
            return f"{where}; nearest shared fabric switch: {self.level} {self.switch}"
        return f"{where}; they share no fabric switch"

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "sameDomain": self.same_domain,
                "nodeDomain": self.node_domain, "spareDomain": self.spare_domain,
                "switch": self.switch}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Placement:
        return cls(level=str(d.get("level", "")), node_domain=str(d.get("nodeDomain", "")),
                   spare_domain=str(d.get("spareDomain", "")), switch=str(d.get("switch", "")))


@dataclass(frozen=True, slots=True)
class TransitionRecord:
    """One entry of the record's (bounded) phase history: the phases are :class:`Phase`,
    their names only on the wire (``from``/``to``)."""

    at: float
    source: Phase
    target: Phase
    trigger: str

    def __post_init__(self) -> None:
        if not (isinstance(self.source, Phase) and isinstance(self.target, Phase)):
            raise TypeError(f"TransitionRecord phases must be Phases, not {self.source!r} → "
                            f"{self.target!r}")

    def to_dict(self) -> dict[str, Any]:
        return {"at": self.at, "from": self.source.value, "to": self.target.value,
                "trigger": self.trigger}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TransitionRecord:
        return cls(at=float(d["at"]), source=Phase(str(d["from"])), target=Phase(str(d["to"])),
                   trigger=str(d["trigger"]))


@dataclass(frozen=True, slots=True)
class EventRecord:
    """An Event a decision emitted, kept with the intent so a restarted leader re-emits it
    (Events are idempotent by key: a repeat is a no-op)."""

    reason: str
    note: str = ""
    type: str = "Normal"
    name: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "note": self.note, "type": self.type, "name": self.name}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> EventRecord:
        return cls(reason=str(d["reason"]), note=str(d.get("note", "")),
                   type=str(d.get("type", "Normal")), name=str(d.get("name", "")))


#: How many phase changes a record keeps (older ones are dropped; the ledger keeps every step).
HISTORY_LIMIT = 50


class FenceProvider(enum.Enum):
    """What may say a dead node's machine is off or cut off (a policy's fencing providers)."""

    WEBHOOK = "webhook"  # a receiver powered it off (BMC, cloud API) and acknowledged
    CLOUD_SHUTDOWN = "cloudShutdown"  # the cloud controller manager's shutdown taint
    NODE_DELETED = "nodeDeleted"  # the cloud deleted the Node object
    MANUAL = "manual"  # an admin annotated the Node healer.io/fenced=<who and why>


@dataclass(frozen=True, slots=True)
class Death:
    """Why a node was declared dead and how it was fenced (``status.death``).

    ``since``: the earliest of its witnesses (Ready not True, Slurm NOT_RESPONDING, telemetry
    stale); ``declared``: the dead verdict; ``witnesses``: each witness and since when, in
    words; ``provider``/``fenced_by``/``fenced_at``: the fencing provider that said the machine
    is off or cut off, what it said, and when (empty until fenced); ``lost_jobs``: the jobs
    Slurm failed or requeued there, as Slurm reported them; ``labels``: the Node's labels
    then.
    """

    since: float
    declared: float
    witnesses: tuple[str, ...] = ()
    provider: FenceProvider | None = None
    fenced_by: str = ""
    fenced_at: float = 0.0
    lost_jobs: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    """The Node's labels when it was declared dead (a spare is chosen near it even once the
    cloud deleted its Node)."""

    @property
    def fenced(self) -> bool:
        return self.provider is not None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {"since": self.since, "declared": self.declared,
                             "witnesses": list(self.witnesses)}
        if self.provider is not None:
            d.update(provider=self.provider.value, fencedBy=self.fenced_by,
                     fencedAt=self.fenced_at)
        if self.lost_jobs:
            d["lostJobs"] = self.lost_jobs
        if self.labels:
            d["labels"] = dict(self.labels)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Death:
        return cls(since=float(d["since"]), declared=float(d["declared"]),
                   witnesses=tuple(str(w) for w in d.get("witnesses", ())),
                   provider=FenceProvider(d["provider"]) if d.get("provider") else None,
                   fenced_by=str(d.get("fencedBy", "")),
                   fenced_at=float(d.get("fencedAt", 0.0)), lost_jobs=str(d.get("lostJobs", "")),
                   labels=tuple(sorted((str(k), str(v))
                                       for k, v in (d.get("labels") or {}).items())))


class RecordOutcome(enum.StrEnum):
    """How a record ended (set when it reaches a terminal phase). The value is the wire form
    (``status.outcome``), but for an escalation: the record writes its reason there (see
    :meth:`NodeRecord.outcome_text`)."""

    DONE = "done"  # Done without a more precise word (the machine's fallback)
    REPLACED = "replaced"  # a spare serves in the node's place
    REPAIRED = "repaired"  # the node itself went back to service
    RECOVERED = "recovered"  # the signal cleared on its own; healer undid its changes
    CANCELLED = "cancelled"  # an admin uncordoned or opted the node out
    ESCALATED = "escalated"  # handed to a human (the reason is the record's outcome_detail)
    NODE_DELETED = "node deleted"  # a dead node's Node was deleted and nothing is swapped


@dataclass(frozen=True, slots=True)
class NodeRecord:
    """The persisted state of one remediation of one node (one incident).

    ``phase``, ``mode`` and ``verdict`` are enums; they become their strings only in
    :meth:`to_dict` / :meth:`from_dict` (the wire format). ``ledger`` lists every step ever
    started, in order; a step that is retried keeps one entry whose ``attempts`` grows.
    """

    node: str
    incident: Incident
    policy: str
    phase: Phase
    phase_since: float
    mode: Mode = Mode.ACT
    ledger: tuple[StepRecord, ...] = ()
    spare: str = ""
    spare_placement: Placement | None = None  # how far the spare is from the node
    slurm_node: str = ""
    verdict: HealthState = HealthState.HEALTHY
    verdict_at: float = 0.0
    blocked: GuardrailBlock | None = None
    paused: bool = False
    repaired: bool = False
    outcome: RecordOutcome | None = None  # set when the record reaches a terminal phase
    outcome_detail: str = ""
    """Why it was escalated, in words (only with ``RecordOutcome.ESCALATED``)."""
    history: tuple[TransitionRecord, ...] = ()
    events: tuple[EventRecord, ...] = ()
    """The Events of the latest decision that emitted any (re-emitted on resume)."""
    death: Death | None = None
    """The node was declared dead (its own flow: fence, out of service, swap)."""
    carried: str = ""
    """Someone else's drain or DOWN reason the swap carried over to the replacement
    (``swap.foreignReason: carryOver``, docs/adr/0016)."""

    def __post_init__(self) -> None:
        if self.outcome is not None and not isinstance(self.outcome, RecordOutcome):
            raise TypeError(f"NodeRecord.outcome must be a RecordOutcome, not {self.outcome!r}")
        if self.outcome_detail and self.outcome is not RecordOutcome.ESCALATED:
            raise ValueError(f"an outcome detail ({self.outcome_detail!r}) goes only with an "
                             f"escalation, not with outcome {self.outcome!r}")

    @property
    def outcome_text(self) -> str:
        """The outcome in words, as ``status.outcome`` writes it: the escalation's reason when
        escalated (``escalated`` if none was given), else the outcome's value ("" while
        open)."""
        if self.outcome is None:
            return ""
        if self.outcome is RecordOutcome.ESCALATED and self.outcome_detail:
            return self.outcome_detail
        return self.outcome.value

    @staticmethod
    def outcome_of(text: str) -> tuple[RecordOutcome | None, str]:
        """The outcome and detail ``status.outcome`` names: "" is none, a known value is
        itself, any other text is an escalation's reason."""
        if not text:
            return None, ""
        try:
            return RecordOutcome(text), ""
        except ValueError:
            return RecordOutcome.ESCALATED, text

    @property
    def node_deleted(self) -> bool:
        """The dead node's Node object was deleted (the ``nodeDeleted`` fencing provider)."""
        return self.death is not None and self.death.provider is FenceProvider.NODE_DELETED

    @property
    def last_transition(self) -> float:
        return self.history[-1].at if self.history else self.phase_since

    def step(self, name: str) -> StepRecord | None:
        """The latest ledger entry for ``name``."""
        for s in reversed(self.ledger):
            if s.step == name:
                return s
        return None

    def step_ok(self, name: str) -> bool:
        s = self.step(name)
        return s is not None and s.outcome is StepOutcome.DONE

    def with_step(self, entry: StepRecord) -> NodeRecord:
        """Replace the latest entry of the same step if it is still open, else append."""
        ledger = list(self.ledger)
        for i in range(len(ledger) - 1, -1, -1):
            if ledger[i].step == entry.step:
                if not ledger[i].done:
                    ledger[i] = entry
                    return replace(self, ledger=tuple(ledger))
                break
        return replace(self, ledger=(*self.ledger, entry))

    def replace_latest(self, entry: StepRecord) -> NodeRecord:
        """Replace the latest entry of ``entry.step`` (open or not); append if there is none."""
        ledger = list(self.ledger)
        for i in range(len(ledger) - 1, -1, -1):
            if ledger[i].step == entry.step:
                ledger[i] = entry
                return replace(self, ledger=tuple(ledger))
        return replace(self, ledger=(*self.ledger, entry))

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "formatVersion": RECORD_FORMAT_VERSION,
            "node": self.node,
            "incident": self.incident.to_dict(),
            "policy": self.policy,
            "phase": self.phase.value,
            "phaseSince": self.phase_since,
            "mode": self.mode.value,
            "ledger": [s.to_dict() for s in self.ledger],
            "spare": self.spare,
            "slurmNode": self.slurm_node,
            "verdict": self.verdict.value,
            "verdictAt": self.verdict_at,
            "paused": self.paused,
            "repaired": self.repaired,
            "outcome": self.outcome_text,
            "history": [h.to_dict() for h in self.history],
            "events": [e.to_dict() for e in self.events],
        }
        if self.blocked is not None:
            d["blocked"] = self.blocked.to_dict()
        if self.spare_placement is not None:
            d["sparePlacement"] = self.spare_placement.to_dict()
        if self.death is not None:
            d["death"] = self.death.to_dict()
        if self.carried:
            d["carriedReason"] = self.carried
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> NodeRecord:
        version = d.get("formatVersion")
        if version != RECORD_FORMAT_VERSION:
            raise ValueError(
                f"NodeRecord formatVersion {version!r} is not supported "
                f"(this healer reads version {RECORD_FORMAT_VERSION})"
            )
        blocked = d.get("blocked")
        placed = d.get("sparePlacement")
        death = d.get("death")
        outcome, detail = cls.outcome_of(str(d.get("outcome") or ""))
        return cls(
            node=str(d["node"]),
            incident=Incident.from_dict(d["incident"]),
            policy=str(d["policy"]),
            phase=Phase(str(d["phase"])),
            phase_since=float(d["phaseSince"]),
            mode=Mode(str(d.get("mode", Mode.ACT.value))),
            ledger=tuple(StepRecord.from_dict(s) for s in d.get("ledger", ())),
            spare=str(d.get("spare", "")),
            spare_placement=None if placed is None else Placement.from_dict(placed),
            slurm_node=str(d.get("slurmNode", "")),
            verdict=HealthState(str(d.get("verdict", HealthState.HEALTHY.value))),
            verdict_at=float(d.get("verdictAt", 0.0)),
            blocked=None if blocked is None else GuardrailBlock.from_dict(blocked),
            paused=bool(d.get("paused", False)),
            repaired=bool(d.get("repaired", False)),
            outcome=outcome,
            outcome_detail=detail,
            history=tuple(TransitionRecord.from_dict(h) for h in d.get("history", ())),
            events=tuple(EventRecord.from_dict(e) for e in d.get("events", ())),
            death=None if death is None else Death.from_dict(death),
            carried=str(d.get("carriedReason", "")),
        )
